// RendezvousState's waiting calls (AwaitMembers, Get): their bounds,
// registration, answers, time-outs and the timer thread.
#include "planner_service/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/echo.h"
#include "core/status_macros.h"
#include "planner_service/rendezvous_internal.h"
#include "proto/rpc/grpc_status.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {

using rendezvous_internal::Aborted;
using rendezvous_internal::EntryBytes;
using rendezvous_internal::GroupKey;
using rendezvous_internal::NameSome;
using rendezvous_internal::NotAMember;
using rendezvous_internal::Quoted;
using rendezvous_internal::ShuttingDown;
using rendezvous_internal::ValidateKey;
using rendezvous_internal::ValidateTimeoutMs;

void RendezvousState::Fail(Waiter& w, absl::Status status, Ready& ready) {
  if (!w.is_get()) {
    ready.push_back([done = std::move(w.members_done), status] { done(status); });
  } else {
    ready.push_back([done = std::move(w.values_done), status] { done(status); });
  }
}

void RendezvousState::Answer(const Group& g, const std::string& name, Waiter& w, Ready& ready) {
  if (!w.is_get()) {
    std::vector<int32_t> ranks;
    ranks.reserve(g.members.size());
    for (const auto& [rank, member] : g.members) ranks.push_back(rank);
    ready.push_back([done = std::move(w.members_done), r = std::move(ranks)]() mutable {
      done(std::move(r));
    });
    return;
  }
  int64_t bytes = 0;
  for (const Value& v : w.values) bytes += static_cast<int64_t>(v->size());
  if (bytes > kMaxGetResponseBytes) {
    return Fail(w,
                absl::ResourceExhaustedError(absl::StrCat(
                    "group ", Quoted(name), ": the values of the ", w.values.size(),
                    " keys are ", bytes, " bytes; a Get returns at most ", kMaxGetResponseBytes,
                    " (ask for fewer keys)")),
                ready);
  }
  // Only this thread adds (under mu_); answers being released only lower it.
  const int64_t in_flight = answer_bytes_->load();
  if (in_flight + bytes > options_.max_answer_bytes) {
    return Fail(w,
                absl::ResourceExhaustedError(absl::StrCat(
                    "group ", Quoted(name), ": answers being sent hold ", in_flight,
                    " bytes; this one's ", bytes, " would pass ", options_.max_answer_bytes,
                    " (--rendezvous_max_answer_bytes; retry later)")),
                ready);
  }
  answer_bytes_->fetch_add(bytes);
  Values values{std::move(w.values),
                std::shared_ptr<const void>(nullptr, [counter = answer_bytes_, bytes](const void*) {
                  counter->fetch_sub(bytes);
                })};
  ready.push_back([done = std::move(w.values_done), v = std::move(values)]() mutable {
    done(std::move(v));
  });
}

void RendezvousState::TimeOut(const Group& g, const std::string& name, Waiter& w,
                              Ready& ready) {
  if (!w.is_get()) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < g.world_size; ++r) {
      if (!g.members.contains(r)) missing.push_back(r);
    }
    return Fail(w,
                absl::DeadlineExceededError(absl::StrCat(
                    "group ", Quoted(name), ": ranks ",
                    NameSome(missing, [](int32_t r) { return absl::StrCat(r); }), " of ",
                    g.world_size, " have not joined")),
                ready);
  }
  std::vector<absl::string_view> missing;
  if (!w.keys.empty()) {  // not registered
    for (size_t i = 0; i < w.keys.size(); ++i) {
      if (w.values[i] == nullptr) missing.push_back(w.keys[i]);
    }
  } else {
    for (const auto& [entry, slot] : w.waiting) {
      if (w.values[slot] == nullptr) missing.push_back(entry->first);
    }
  }
  Fail(w,
       absl::DeadlineExceededError(absl::StrCat("group ", Quoted(name), ": keys ",
                                                NameSome(missing, core::Echo), " not set")),
       ready);
}

absl::Status RendezvousState::RoomToWait(const Group& g, const Waiter& w) const {
  const std::string& name = g.name;
  if (static_cast<int64_t>(waiters_.size()) >= options_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat("group ", Quoted(name), ": already ",
                                                     waiters_.size(),
                                                     " calls waiting (--rendezvous_max_waiters)"));
  }
  if (g.members.at(w.rank).waits >= options_.max_waiters_per_member) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": rank ", w.rank, " already has ",
        options_.max_waiters_per_member, " calls waiting (--rendezvous_max_waiters_per_member)"));
  }
  const auto u = peers_.find(w.peer);
  if (u != peers_.end() && u->second.waiters >= options_.max_waiters_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": peer ", Quoted(w.peer), " already has ", u->second.waiters,
        " calls waiting (--rendezvous_max_waiters_per_peer)"));
  }
  const int64_t peer_bytes = u == peers_.end() ? 0 : u->second.waiter_bytes;
  if (peer_bytes + w.charged > MaxWaiterBytesPerPeer(options_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": peer ", Quoted(w.peer), "'s waiting calls hold ", peer_bytes,
        " bytes; this one's ", w.charged, " would pass ", MaxWaiterBytesPerPeer(options_),
        " (--rendezvous_max_waiter_bytes_per_peer; a Get counts ", kWaiterOverheadBytes,
        " + 2 x key + ", kWaitKeyOverheadBytes, " per key)"));
  }
  if (waiter_bytes_ + w.charged > options_.max_waiter_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": waiting calls hold ", waiter_bytes_, " bytes; this one's ",
        w.charged, " would pass ", options_.max_waiter_bytes,
        " (--rendezvous_max_waiter_bytes; a Get counts ", kWaiterOverheadBytes,
        " + 2 x key + ", kWaitKeyOverheadBytes, " per key)"));
  }
  return absl::OkStatus();
}

RendezvousState::WaitId RendezvousState::Register(GroupMap::iterator it, Waiter w, Ready& ready) {
  Group& g = it->second;
  if (g.aborted) {
    Fail(w, Aborted(g.name, g.abort_reason), ready);
    return 0;
  }
  bool complete = false;
  if (w.is_get()) {
    w.values.resize(w.keys.size());
    for (size_t i = 0; i < w.keys.size(); ++i) {
      const auto kv = g.kv.find(w.keys[i]);
      if (kv != g.kv.end()) {
        w.values[i] = kv->second;
      } else {
        ++w.missing;
      }
    }
    complete = w.missing == 0;
  } else {
    complete = static_cast<int32_t>(g.members.size()) == g.world_size;
  }
  if (complete) {
    Answer(g, g.name, w, ready);
    return 0;
  }
  if (w.deadline <= clock_->Now()) {
    TimeOut(g, g.name, w, ready);
    return 0;
  }
  if (absl::Status room = RoomToWait(g, w); !room.ok()) {
    Fail(w, std::move(room), ready);
    return 0;
  }
  const WaitId id = next_wait_id_++;
  if (w.is_get()) {
    // The missing keys move into the group's index; the waiter keeps its
    // index entries (stable std::map iterators) to leave it and to name them.
    w.waiting.reserve(w.missing);
    for (size_t i = 0; i < w.keys.size(); ++i) {
      if (w.values[i] != nullptr) continue;
      const auto entry = g.waiting_on.try_emplace(std::move(w.keys[i])).first;
      entry->second.emplace(id, static_cast<uint32_t>(i));
      w.waiting.emplace_back(entry, static_cast<uint32_t>(i));
    }
    w.keys.clear();
    w.keys.shrink_to_fit();
  } else {
    g.member_waiters.insert(id);
  }
  if (deadlines_.empty() || w.deadline < deadlines_.begin()->first) timer_kick_ = true;
  deadlines_.emplace(w.deadline, id);
  g.waiters.insert(id);
  waiter_bytes_ += w.charged;
  AddUsage(w.peer, 0, 1, w.charged);
  g.members.at(w.rank).waits += 1;
  waiters_.emplace(id, std::move(w));
  return id;
}

void RendezvousState::EraseWaiter(WaitId id) {
  const auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  deadlines_.erase({w.deadline, id});
  const auto g = groups_.find(w.group);
  if (g != groups_.end()) {
    g->second.waiters.erase(id);
    g->second.member_waiters.erase(id);
    const auto m = g->second.members.find(w.rank);
    if (m != g->second.members.end() && m->second.token == w.token) m->second.waits -= 1;
    // With nothing missing every entry went when its key was set (and an
    // answer may have taken `values`).
    for (size_t i = 0; w.missing > 0 && i < w.waiting.size(); ++i) {
      const auto& [entry, slot] = w.waiting[i];
      if (w.values[slot] != nullptr) continue;  // the entry went when its key was set
      entry->second.erase(id);
      if (entry->second.empty()) g->second.waiting_on.erase(entry);
    }
  }
  waiter_bytes_ -= w.charged;
  AddUsage(w.peer, 0, -1, -w.charged);
  waiters_.erase(it);
}

void RendezvousState::WakeMemberWaiters(GroupMap::iterator it, Ready& ready) {
  Group& g = it->second;
  const std::vector<WaitId> ids(g.member_waiters.begin(), g.member_waiters.end());
  for (const WaitId id : ids) {
    ++waiter_checks_;
    Answer(g, g.name, waiters_.at(id), ready);
    EraseWaiter(id);
  }
  if (!ids.empty()) g.last_call = clock_->Now();
}

void RendezvousState::WakeKeyWaiters(GroupMap::iterator it, absl::string_view key,
                                     const Value& value, Ready& ready) {
  Group& g = it->second;
  const auto entry = g.waiting_on.find(key);
  if (entry == g.waiting_on.end()) return;
  std::vector<WaitId> complete;
  for (const auto& [id, slot] : entry->second) {
    ++waiter_checks_;
    Waiter& w = waiters_.at(id);
    w.values[slot] = value;
    if (--w.missing == 0) complete.push_back(id);
  }
  g.waiting_on.erase(entry);  // its waiters' slots are filled: none refers to it now
  std::sort(complete.begin(), complete.end());  // in the order they came (max_answer_bytes)
  for (const WaitId id : complete) {
    Answer(g, g.name, waiters_.at(id), ready);
    EraseWaiter(id);
  }
  if (!complete.empty()) g.last_call = clock_->Now();
}

void RendezvousState::FailWaiters(Group& g, const absl::Status& status, Ready& ready,
                                  absl::string_view token) {
  const std::vector<WaitId> ids(g.waiters.begin(), g.waiters.end());
  for (const WaitId id : ids) {
    Waiter& w = waiters_.at(id);
    if (!token.empty() && w.token != token) continue;
    Fail(w, status, ready);
    EraseWaiter(id);
  }
}

RendezvousState::WaitId RendezvousState::StartWait(const Caller& caller, absl::Status valid,
                                                   Waiter w) {
  Ready ready;
  WaitId id = 0;
  if (valid.ok()) {
    absl::MutexLock lock(&mu_);
    int32_t rank = 0;
    absl::StatusOr<GroupMap::iterator> it = FindMember(caller, w.group, w.token, &rank);
    if (it.ok()) {
      w.group = (*it)->first;  // the name as called, from here on the key
      w.rank = rank;
      w.peer = caller.peer;
      w.charged = WaiterBytes(w.keys);
      id = Register(*it, std::move(w), ready);
    } else {
      valid = it.status();
    }
  }
  if (!valid.ok()) Fail(w, valid, ready);  // w was not moved
  for (auto& r : ready) r();
  return id;
}

RendezvousState::WaitId RendezvousState::AwaitMembers(const Caller& caller,
                                                      absl::string_view group_name,
                                                      absl::string_view token,
                                                      absl::Time deadline, MembersDone done) {
  Waiter w;
  w.group = std::string(group_name);
  w.token = std::string(token);
  w.deadline = deadline;
  w.members_done = std::move(done);
  return StartWait(caller, ValidateGroupName(group_name), std::move(w));
}

RendezvousState::WaitId RendezvousState::Get(const Caller& caller, absl::string_view group_name,
                                             absl::string_view token,
                                             std::vector<std::string> keys, absl::Time deadline,
                                             ValuesDone done) {
  const auto validate = [&]() -> absl::Status {
    FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
    if (keys.empty() || keys.size() > kMaxKeysPerGet) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys: must name 1..", kMaxKeysPerGet, " keys, got ", keys.size()));
    }
    // Each key once: repeats would multiply the answer (issue 12: a 4 KB
    // request naming a 1 MiB value 2,049 times built a 2 GiB response).
    absl::flat_hash_set<absl::string_view> seen;
    seen.reserve(keys.size());
    for (const std::string& key : keys) {
      FLASHCP_RETURN_IF_ERROR(ValidateKey(key));
      if (!seen.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys: ", core::Echo(key), " is named more than once"));
      }
    }
    return absl::OkStatus();
  };
  absl::Status valid = validate();
  Waiter w;
  w.group = std::string(group_name);
  w.token = std::string(token);
  w.deadline = deadline;
  w.keys = std::move(keys);
  w.values_done = std::move(done);
  return StartWait(caller, std::move(valid), std::move(w));
}

void RendezvousState::Cancel(WaitId id) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    Fail(it->second, absl::CancelledError("rendezvous: the call was cancelled"), ready);
    EraseWaiter(id);
  }
  for (auto& r : ready) r();
}

void RendezvousState::ExpireDue() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const WaitId id = deadlines_.begin()->second;
      Waiter& w = waiters_.at(id);
      const auto g = groups_.find(w.group);
      ++waiter_checks_;
      TimeOut(g->second, g->second.name, w, ready);
      EraseWaiter(id);
      g->second.last_call = now;  // the waiting member was calling until now
    }
    ExpireIdle(now, ready);
  }
  for (auto& r : ready) r();
}

void RendezvousState::RunTimer() {
  // Idle groups are looked for at least this often (and whenever a Join
  // finds all kMaxGroups slots taken).
  // Un-formed groups go within form_timeout and a quarter of it.
  const absl::Duration sweep = std::max(
      std::min(options_.idle_timeout, options_.form_timeout) / 4, absl::Milliseconds(100));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      absl::Time next = clock_->Now() + sweep;
      if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
      timer_kick_ = false;
      clock_->AwaitWithDeadline(mu_, absl::Condition(this, &RendezvousState::TimerShouldWake),
                                next);
      if (shut_down_) return;
    }
    ExpireDue();
  }
}

}  // namespace flashcp::planner_service
