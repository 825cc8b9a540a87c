// The one source of "now" and of timed waits, injected wherever time is
// measured or waited on (the planner's planning_seconds and request latency;
// the worker's step timings, plan watchdog and backoff), so that tests control
// it (STYLE item 10). An interface and two small implementations; no I/O.
#ifndef FLASHCP_CORE_CLOCK_H_
#define FLASHCP_CORE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flashcp::core {

// Reading the time: all the planner needs.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// A clock one can also wait on: what the worker daemon's timed waits
// (watchdog, heartbeat, backoff) take.
class WaitClock : public Clock {
 public:
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) const = 0;
  // With `mu` held: waits until `cond` holds or this clock reaches
  // `deadline`, like absl::Mutex::AwaitWithDeadline; returns whether `cond`
  // holds. `mu` is held again on return.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  bool AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& cond, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, cond, Now() + timeout);
  }
};

// Wall-clock time (absl::Now, absl::SleepFor, the mutex's own timed wait).
class RealClock final : public WaitClock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) const override { absl::SleepFor(d); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(cond, deadline);
  }
};

// A clock that moves only when told to (Advance, or SleepFor, which advances
// it by the sleep instead of blocking); thread-safe. A timed wait returns when
// its condition holds or once another thread has advanced the clock past the
// deadline: Advance cannot wake a waiter on a mutex it does not know, so the
// waiter re-checks the time every millisecond of real time. Outcomes depend
// only on this clock's time, never on how long the real waits took.
class ManualClock final : public WaitClock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void SleepFor(absl::Duration d) const override {
    absl::MutexLock lock(&mu_);
    now_ += d;
    slept_ += d;
  }
  // The sum of all SleepFor calls so far.
  absl::Duration slept() const {
    absl::MutexLock lock(&mu_);
    return slept_;
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!mu.AwaitWithTimeout(cond, absl::Milliseconds(1))) {
      if (Now() >= deadline) return cond.Eval();
    }
    return true;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable absl::Duration slept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_CLOCK_H_
