#include "core/internal/flashcp_roles.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {
namespace {

// std::stable_sort's order (the one stable order of a strict weak `less`),
// for the short ranges it is called on here (one cut document's roles)
// without the buffer std::stable_sort allocates on every call: a stable
// insertion sort, quadratic, so only up to 16 elements.
template <typename It, typename Less>
void StableSortShort(It first, It last, Less less) {
  if (last - first > 16) {
    std::stable_sort(first, last, less);
    return;
  }
  for (It i = first; i != last; ++i) {
    auto v = std::move(*i);
    It j = i;
    for (; j != first && less(v, *(j - 1)); --j) *j = std::move(*(j - 1));
    *j = std::move(v);
  }
}

// One rank's part of one cut document, with what it adds to that rank.
struct Role {
  int32_t rank = 0;        // the rank playing it now
  int32_t orig_rank = 0;   // the rank holding its pieces in the input plan
  int64_t tokens = 0;
  double workload = 0;     // SPEC Eq. 3 pairs
  int64_t nonlast = 0;     // tokens of its pieces other than the document's last
  int64_t send = 0;        // targeted, one phase
  int64_t recv = 0;
};


// Every cut document's roles and, per rank, their sums.
struct RoleTable {
  std::vector<Role> roles;
  std::vector<int32_t> doc_roles_begin;  // per cut document, its first role; then roles.size()
  std::vector<int32_t> doc_of_role;      // per role, its cut document (index into the above)
  std::vector<int32_t> role_of_shard;    // per shard of the plan, its role; -1 if uncut
  std::vector<int64_t> send, recv;       // per rank, targeted, one phase
  std::vector<int64_t> nonlast;          // per rank, SPEC Eq. 5
  std::vector<double> workload;          // per rank, SPEC Eq. 3 pairs

  // A spread: documents longest first, within each the roles of equal
  // tokens dealt out again over the same ranks, the role receiving most
  // over sending to the rank so far receiving least over sending. Kept only
  // where it leaves every rank within the caps (SwapRolesForTargeted) and
  // lowers the bottleneck.
  void Spread(int32_t n, double cap_workload, int64_t cap_nonlast);
  // The greedy swaps (SwapRolesForTargeted), at most max_swaps.
  void SwapGreedily(int32_t n, double cap_workload, int64_t cap_nonlast, int32_t max_swaps);
};

// The cut documents' shards by (document, start), a total order (a
// document's shards do not overlap): bucketed by document, then each
// document's few sorted by start. A whole document has no role.
std::vector<int32_t> CutShardsByDoc(const Plan& plan) {
  std::vector<int32_t> by_doc;
  std::vector<int32_t> begin(plan.doc_lens.size() + 1, 0);
  // Counts, then their prefix sums, a whole document's count (1) taken
  // as 0: begin[d + 1] - begin[d] is document d's shards if it is cut,
  // else 0.
  for (const Shard& s : plan.shards) ++begin[s.doc + 1];
  for (size_t d = 1; d < begin.size(); ++d) {
    if (begin[d] < 2) begin[d] = 0;
    begin[d] += begin[d - 1];
  }
  by_doc.resize(begin.back());
  std::vector<int32_t> fill(begin.begin(), begin.end() - 1);
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const int32_t d = plan.shards[i].doc;
    if (begin[d + 1] != begin[d]) by_doc[fill[d]++] = static_cast<int32_t>(i);
  }
  for (size_t d = 0; d + 1 < begin.size(); ++d) {
    if (begin[d + 1] == begin[d]) continue;
    std::sort(by_doc.begin() + begin[d], by_doc.begin() + begin[d + 1],
              [&](int32_t a, int32_t b) { return plan.shards[a].start < plan.shards[b].start; });
  }
  return by_doc;
}

RoleTable BuildRoles(const Plan& plan) {
  const int32_t n = plan.cp_size;
  RoleTable t;
  const std::vector<int32_t> by_doc = CutShardsByDoc(plan);
  t.send.assign(n, 0);
  t.recv.assign(n, 0);
  t.nonlast.assign(n, 0);
  t.workload = PieceWorkloads(n, plan.shards);
  t.role_of_shard.assign(plan.shards.size(), -1);
  std::vector<Role>& roles = t.roles;
  std::vector<int32_t>& doc_roles_begin = t.doc_roles_begin;
  std::vector<int32_t>& role_of_shard = t.role_of_shard;
  std::vector<int64_t>& send = t.send;
  std::vector<int64_t>& recv = t.recv;
  std::vector<int64_t>& nonlast = t.nonlast;
  std::vector<int32_t> slot(n, -1);      // rank -> its role in the current document
  std::vector<int32_t> last_pos(n, -1);
  std::vector<int32_t> distinct_after;  // per piece of the current document
  distinct_after.reserve(2 * static_cast<size_t>(n) + 1);  // a hint: a zigzag's pieces
  roles.reserve(by_doc.size());         // a role holds at least one cut shard
  doc_roles_begin.reserve(by_doc.size() / 2 + 1);  // a cut document has >= 2 shards
  for (size_t b = 0; b < by_doc.size();) {
    size_t e = b;
    while (e < by_doc.size() && plan.shards[by_doc[e]].doc == plan.shards[by_doc[b]].doc) ++e;
    const int32_t count = static_cast<int32_t>(e - b);
    if (count > 1) {
      const int32_t first = static_cast<int32_t>(roles.size());
      doc_roles_begin.push_back(first);
      for (int32_t k = 0; k < count; ++k) {
        const Shard& s = plan.shards[by_doc[b + k]];
        if (slot[s.rank] < 0) {
          slot[s.rank] = static_cast<int32_t>(roles.size());
          roles.push_back(Role{s.rank, s.rank});
        }
        last_pos[s.rank] = k;
      }
      // Sends: piece k goes to the distinct owners of later pieces but its own.
      distinct_after.assign(count, 0);
      int32_t distinct = 0;
      for (int32_t k = count - 1; k >= 0; --k) {
        distinct_after[k] = distinct;
        if (last_pos[plan.shards[by_doc[b + k]].rank] == k) ++distinct;
      }
      int64_t prefix = 0;
      for (int32_t k = 0; k < count; ++k) {
        const Shard& s = plan.shards[by_doc[b + k]];
        Role& role = roles[slot[s.rank]];
        role_of_shard[by_doc[b + k]] = slot[s.rank];
        const bool owner_later = last_pos[s.rank] > k;
        role.send += s.len * (distinct_after[k] - (owner_later ? 1 : 0));
        role.tokens += s.len;
        role.workload += RangeWorkload(s.start, s.len);
        if (k + 1 < count) role.nonlast += s.len;
        // Received: the pieces before the rank's last one that it does not own.
        if (last_pos[s.rank] == k) role.recv = prefix - (role.tokens - s.len);
        prefix += s.len;
      }
      for (int32_t i = first; i < static_cast<int32_t>(roles.size()); ++i) {
        const Role& role = roles[i];
        send[role.rank] += role.send;
        recv[role.rank] += role.recv;
        nonlast[role.rank] += role.nonlast;
        slot[role.rank] = -1;
        last_pos[role.rank] = -1;
      }
    }
    b = e;
  }
  doc_roles_begin.push_back(static_cast<int32_t>(roles.size()));
  std::vector<int32_t>& doc_of_role = t.doc_of_role;
  doc_of_role.resize(roles.size());
  for (size_t d = 0; d + 1 < doc_roles_begin.size(); ++d) {
    for (int32_t i = doc_roles_begin[d]; i < doc_roles_begin[d + 1]; ++i) {
      doc_of_role[i] = static_cast<int32_t>(d);
    }
  }
  return t;
}

void RoleTable::Spread(int32_t n, double cap_workload, int64_t cap_nonlast) {
  const int32_t docs = static_cast<int32_t>(doc_roles_begin.size()) - 1;
  std::vector<int32_t> doc_order(docs);
  std::iota(doc_order.begin(), doc_order.end(), 0);
  const auto doc_tokens = [&](int32_t d) {
    int64_t tokens = 0;
    for (int32_t i = doc_roles_begin[d]; i < doc_roles_begin[d + 1]; ++i) {
      tokens += roles[i].tokens;
    }
    return tokens;
  };
  std::vector<int64_t> len_of(docs);
  for (int32_t d = 0; d < docs; ++d) len_of[d] = doc_tokens(d);
  std::stable_sort(doc_order.begin(), doc_order.end(),
                   [&](int32_t a, int32_t b) { return len_of[a] > len_of[b]; });
  std::vector<int64_t> spread_send(n, 0), spread_recv(n, 0);
  std::vector<int32_t> ids, ranks;
  for (int32_t d : doc_order) {
    ids.resize(doc_roles_begin[d + 1] - doc_roles_begin[d]);
    std::iota(ids.begin(), ids.end(), doc_roles_begin[d]);
    StableSortShort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      if (roles[a].tokens != roles[b].tokens) return roles[a].tokens < roles[b].tokens;
      return roles[a].recv - roles[a].send > roles[b].recv - roles[b].send;
    });
    for (size_t c = 0; c < ids.size();) {
      size_t e = c;
      while (e < ids.size() && roles[ids[e]].tokens == roles[ids[c]].tokens) ++e;
      ranks.clear();
      for (size_t k = c; k < e; ++k) ranks.push_back(roles[ids[k]].rank);
      std::sort(ranks.begin(), ranks.end(), [&](int32_t a, int32_t b) {
        const int64_t ka = spread_recv[a] - spread_send[a], kb = spread_recv[b] - spread_send[b];
        return ka != kb ? ka < kb : a < b;
      });
      for (size_t k = c; k < e; ++k) roles[ids[k]].rank = ranks[k - c];
      c = e;
    }
    for (int32_t i : ids) {
      spread_send[roles[i].rank] += roles[i].send;
      spread_recv[roles[i].rank] += roles[i].recv;
    }
  }
  std::vector<double> w2 = workload;
  std::vector<int64_t> nl2 = nonlast, s2 = send, r2 = recv;
  for (const Role& role : roles) {
    w2[role.orig_rank] -= role.workload;
    w2[role.rank] += role.workload;
    nl2[role.orig_rank] -= role.nonlast;
    nl2[role.rank] += role.nonlast;
    s2[role.orig_rank] -= role.send;
    s2[role.rank] += role.send;
    r2[role.orig_rank] -= role.recv;
    r2[role.rank] += role.recv;
  }
  int64_t before = 0, after = 0;
  bool within = true;
  for (int32_t r = 0; r < n; ++r) {
    before = std::max({before, send[r], recv[r]});
    after = std::max({after, s2[r], r2[r]});
    within = within && w2[r] <= cap_workload && nl2[r] <= cap_nonlast;
  }
  if (within && after < before) {
    workload.swap(w2);
    nonlast.swap(nl2);
    send.swap(s2);
    recv.swap(r2);
  } else {
    for (Role& role : roles) role.rank = role.orig_rank;
  }
}

void RoleTable::SwapGreedily(int32_t n, double cap_workload, int64_t cap_nonlast,
                             int32_t max_swaps) {
  std::vector<std::vector<int32_t>> roles_of(n);
  {
    // Counted first, so that each rank's list is allocated once.
    std::vector<int32_t> count(n, 0);
    for (const Role& role : roles) ++count[role.rank];
    for (int32_t r = 0; r < n; ++r) roles_of[r].reserve(count[r]);
  }
  for (int32_t i = 0; i < static_cast<int32_t>(roles.size()); ++i) {
    roles_of[roles[i].rank].push_back(i);
  }
  for (int32_t swaps = 0; swaps < max_swaps; ++swaps) {
    int32_t b = 0;
    int64_t bottleneck = -1;
    for (int32_t r = 0; r < n; ++r) {
      const int64_t v = std::max(send[r], recv[r]);
      if (v > bottleneck) {
        bottleneck = v;
        b = r;
      }
    }
    int32_t best_i = -1, best_j = -1;
    int64_t best_value = bottleneck;
    for (int32_t i : roles_of[b]) {
      const Role& ri = roles[i];
      const int32_t d = doc_of_role[i];
      for (int32_t j = doc_roles_begin[d]; j < doc_roles_begin[d + 1]; ++j) {
        const Role& rj = roles[j];
        if (j == i || rj.tokens != ri.tokens) continue;
        const int32_t q = rj.rank;
        // The largest of the two ranks' sends and receives after the swap,
        // given up on at the first at or over the best.
        const int64_t send_b = send[b] - ri.send + rj.send;
        if (send_b >= best_value) continue;
        const int64_t recv_b = recv[b] - ri.recv + rj.recv;
        if (recv_b >= best_value) continue;
        const int64_t send_q = send[q] - rj.send + ri.send;
        if (send_q >= best_value) continue;
        const int64_t recv_q = recv[q] - rj.recv + ri.recv;
        if (recv_q >= best_value) continue;
        const int64_t value = std::max({send_b, recv_b, send_q, recv_q});
        if (workload[b] - ri.workload + rj.workload > cap_workload ||
            workload[q] - rj.workload + ri.workload > cap_workload ||
            nonlast[b] - ri.nonlast + rj.nonlast > cap_nonlast ||
            nonlast[q] - rj.nonlast + ri.nonlast > cap_nonlast) {
          continue;
        }
        best_value = value;
        best_i = i;
        best_j = j;
      }
    }
    if (best_i < 0) break;
    Role& ri = roles[best_i];
    Role& rj = roles[best_j];
    const int32_t q = rj.rank;
    send[b] += rj.send - ri.send;
    recv[b] += rj.recv - ri.recv;
    workload[b] += rj.workload - ri.workload;
    nonlast[b] += rj.nonlast - ri.nonlast;
    send[q] += ri.send - rj.send;
    recv[q] += ri.recv - rj.recv;
    workload[q] += ri.workload - rj.workload;
    nonlast[q] += ri.nonlast - rj.nonlast;
    std::replace(roles_of[b].begin(), roles_of[b].end(), best_i, best_j);
    std::replace(roles_of[q].begin(), roles_of[q].end(), best_j, best_i);
    ri.rank = q;
    rj.rank = b;
  }
}

}  // namespace

Plan SwapRolesForTargeted(const Batch& batch, const Plan& plan, double max_workload,
                          int32_t max_swaps) {
  const int32_t n = plan.cp_size;
  RoleTable t = BuildRoles(plan);
  if (t.roles.empty()) return plan;
  const std::vector<double>& workload = t.workload;
  const std::vector<int64_t>& nonlast = t.nonlast;
  const double plan_max_workload = *std::max_element(workload.begin(), workload.end());
  const double cap_workload = std::max(max_workload, plan_max_workload);
  const int64_t cap_nonlast = *std::max_element(nonlast.begin(), nonlast.end());
  t.Spread(n, cap_workload, cap_nonlast);
  t.SwapGreedily(n, cap_workload, cap_nonlast, max_swaps);
  const std::vector<Role>& roles = t.roles;
  const std::vector<int32_t>& role_of_shard = t.role_of_shard;
  std::vector<Shard> pieces = plan.shards;
  bool changed = false;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (role_of_shard[i] < 0) continue;
    const Role& role = roles[role_of_shard[i]];
    if (role.rank != role.orig_rank) {
      pieces[i].rank = role.rank;
      changed = true;
    }
  }
  if (!changed) return plan;
  return FinishPlan(batch, std::move(pieces));
}

}  // namespace flashcp::core::internal
