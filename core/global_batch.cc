#include "core/global_batch.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"

namespace flashcp::core {
namespace {

double Work(int64_t len) { return ShardWorkload(0, len); }

struct State {
  std::vector<std::vector<int32_t>> replicas;
  std::vector<double> work;
  std::vector<int64_t> tokens;
};

State MakeState(const std::vector<int64_t>& lens, std::vector<std::vector<int32_t>> replicas) {
  State s;
  s.replicas = std::move(replicas);
  for (const std::vector<int32_t>& r : s.replicas) {
    double w = 0;
    int64_t t = 0;
    for (int32_t i : r) {
      w += Work(lens[i]);
      t += lens[i];
    }
    s.work.push_back(w);
    s.tokens.push_back(t);
  }
  return s;
}

// Longest processing time with capacity; empty where some piece fits nowhere.
std::vector<std::vector<int32_t>> Lpt(const std::vector<int64_t>& lens, int32_t dp,
                                      int64_t context) {
  std::vector<int32_t> order(lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return lens[a] > lens[b]; });
  std::vector<std::vector<int32_t>> out(dp);
  std::vector<double> work(dp, 0);
  std::vector<int64_t> tokens(dp, 0);
  for (int32_t i : order) {
    int32_t best = -1;
    for (int32_t r = 0; r < dp; ++r) {
      if (tokens[r] + lens[i] > context) continue;
      if (best < 0 || work[r] < work[best]) best = r;
    }
    if (best < 0) return {};
    out[best].push_back(i);
    work[best] += Work(lens[i]);
    tokens[best] += lens[i];
  }
  return out;
}

// Local search on the heaviest replica: the move or swap with another
// replica (within capacity) that lowers the pair's larger workload most;
// stops where none lowers it below the heaviest's workload.
void Improve(const std::vector<int64_t>& lens, int64_t context, State& s) {
  const int32_t dp = static_cast<int32_t>(s.replicas.size());
  for (int iter = 0; iter < 100000; ++iter) {
    const int32_t h = static_cast<int32_t>(
        std::max_element(s.work.begin(), s.work.end()) - s.work.begin());
    double best = s.work[h];
    int32_t best_o = -1, best_x = -1, best_y = -1;  // y < 0: a move
    for (int32_t o = 0; o < dp; ++o) {
      if (o == h) continue;
      for (size_t xi = 0; xi < s.replicas[h].size(); ++xi) {
        const int32_t x = s.replicas[h][xi];
        const double wx = Work(lens[x]);
        if (s.tokens[o] + lens[x] <= context) {
          const double m = std::max(s.work[h] - wx, s.work[o] + wx);
          if (m < best) {
            best = m;
            best_o = o;
            best_x = static_cast<int32_t>(xi);
            best_y = -1;
          }
        }
        for (size_t yi = 0; yi < s.replicas[o].size(); ++yi) {
          const int32_t y = s.replicas[o][yi];
          if (s.tokens[h] - lens[x] + lens[y] > context ||
              s.tokens[o] - lens[y] + lens[x] > context)
            continue;
          const double wy = Work(lens[y]);
          const double m = std::max(s.work[h] - wx + wy, s.work[o] - wy + wx);
          if (m < best) {
            best = m;
            best_o = o;
            best_x = static_cast<int32_t>(xi);
            best_y = static_cast<int32_t>(yi);
          }
        }
      }
    }
    if (best_o < 0) return;
    const int32_t x = s.replicas[h][best_x];
    s.replicas[h].erase(s.replicas[h].begin() + best_x);
    s.work[h] -= Work(lens[x]);
    s.tokens[h] -= lens[x];
    if (best_y >= 0) {
      const int32_t y = s.replicas[best_o][best_y];
      s.replicas[best_o].erase(s.replicas[best_o].begin() + best_y);
      s.work[best_o] -= Work(lens[y]);
      s.tokens[best_o] -= lens[y];
      s.replicas[h].push_back(y);
      s.work[h] += Work(lens[y]);
      s.tokens[h] += lens[y];
    }
    s.replicas[best_o].push_back(x);
    s.work[best_o] += Work(lens[x]);
    s.tokens[best_o] += lens[x];
  }
}

}  // namespace

Pieces CutToContext(const std::vector<int64_t>& doc_lens, int64_t context) {
  Pieces p;
  for (size_t d = 0; d < doc_lens.size(); ++d) {
    for (int64_t left = doc_lens[d]; left > 0; left -= context) {
      p.lens.push_back(std::min(left, context));
      p.doc.push_back(static_cast<int32_t>(d));
    }
  }
  return p;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> FirstFitReplicas(
    const std::vector<int64_t>& lens, int32_t dp_size, int64_t context) {
  std::vector<std::vector<int32_t>> out(dp_size);
  std::vector<int64_t> tokens(dp_size, 0);
  for (size_t i = 0; i < lens.size(); ++i) {
    int32_t r = 0;
    while (r < dp_size && tokens[r] + lens[i] > context) ++r;
    if (r == dp_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "doc_lens: piece ", i, " (", lens[i], " tokens) fits in none of the ", dp_size,
          " replicas of ", context, " tokens by first fit in arrival order"));
    }
    out[r].push_back(static_cast<int32_t>(i));
    tokens[r] += lens[i];
  }
  return out;
}

double ReplicaImbalance(const std::vector<int64_t>& lens,
                        const std::vector<std::vector<int32_t>>& replicas) {
  double mx = 0, sum = 0;
  for (const std::vector<int32_t>& r : replicas) {
    double w = 0;
    for (int32_t i : r) w += Work(lens[i]);
    mx = std::max(mx, w);
    sum += w;
  }
  if (sum <= 0 || replicas.empty()) return 1.0;
  return mx / (sum / static_cast<double>(replicas.size()));
}

absl::StatusOr<GlobalBatchPlan> PlanGlobalBatch(const std::vector<int64_t>& doc_lens,
                                                const GlobalBatchOptions& options) {
  if (options.dp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_size: must be >= 1, got ", options.dp_size));
  }
  if (options.cp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp_size: must be >= 1, got ", options.cp_size));
  }
  if (options.context < options.cp_size) {
    return absl::InvalidArgumentError(absl::StrCat("context: ", options.context,
                                                   " tokens; must be at least cp_size (",
                                                   options.cp_size, ")"));
  }
  int64_t total = 0;
  for (size_t d = 0; d < doc_lens.size(); ++d) {
    if (doc_lens[d] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("doc_lens[", d, "]: ", doc_lens[d], "; every length must be >= 1"));
    }
    total += doc_lens[d];
  }
  if (total > int64_t{options.dp_size} * options.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doc_lens: ", total, " tokens; more than dp_size x context = ", options.dp_size, " x ",
        options.context));
  }
  GlobalBatchPlan out;
  out.pieces = CutToContext(doc_lens, options.context);
  const std::vector<int64_t>& lens = out.pieces.lens;
  absl::StatusOr<std::vector<std::vector<int32_t>>> ff =
      FirstFitReplicas(lens, options.dp_size, options.context);
  if (!ff.ok()) return ff.status();
  out.first_fit_imbalance = ReplicaImbalance(lens, *ff);
  State best = MakeState(lens, *ff);
  Improve(lens, options.context, best);
  std::vector<std::vector<int32_t>> lpt = Lpt(lens, options.dp_size, options.context);
  if (!lpt.empty()) {
    State s = MakeState(lens, std::move(lpt));
    Improve(lens, options.context, s);
    if (*std::max_element(s.work.begin(), s.work.end()) <
        *std::max_element(best.work.begin(), best.work.end()))
      best = std::move(s);
  }
  out.imbalance = ReplicaImbalance(lens, best.replicas);
  for (int32_t r = 0; r < options.dp_size; ++r) {
    ReplicaBatch rb;
    rb.pieces = best.replicas[r];
    std::sort(rb.pieces.begin(), rb.pieces.end());
    for (int32_t i : rb.pieces) rb.doc_lens.push_back(lens[i]);
    rb.workload = best.work[r];
    absl::StatusOr<Plan> plan =
        MakePlan(options.strategy, Batch{rb.doc_lens, options.cp_size}, options.plan);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("replica ", r, ": ", plan.status().message()));
    }
    rb.plan = *std::move(plan);
    out.replicas.push_back(std::move(rb));
  }
  return out;
}

}  // namespace flashcp::core
