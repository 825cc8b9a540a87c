// The ILP's time limit as every program means it (--ilp_time_limit, an
// absl::Duration, in flashcp-planner, flashcp-plan and plan_quality): the
// whole call's, from `start` on `clock` (model setup, the root LP and, in
// the planner, queueing included), not CBC's branch and bound alone.
#ifndef FLASHCP_CORE_ILP_DEADLINE_H_
#define FLASHCP_CORE_ILP_DEADLINE_H_

#include "absl/time/time.h"
#include "core/clock.h"
#include "core/strategies.h"

namespace flashcp::core {

// Sets `ilp` to stop `limit` after `start`: time_limit_seconds = limit and
// seconds_left = what is left of it on `clock`, which must outlive the call.
inline void SetIlpDeadline(absl::Duration limit, absl::Time start, const Clock* clock,
                           IlpOptions& ilp) {
  const absl::Time end = start + limit;
  ilp.time_limit_seconds = absl::ToDoubleSeconds(limit);
  ilp.seconds_left = [clock, end] { return absl::ToDoubleSeconds(end - clock->Now()); };
}

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_ILP_DEADLINE_H_
