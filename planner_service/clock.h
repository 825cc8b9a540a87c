// The service's one source of "now", injected wherever time is measured
// (planning_seconds, request latency) so that tests control it (STYLE item
// 10). The interface and both clocks are core::Clock's (core/clock.h), shared
// with the worker daemon; these names keep the service's spelling.
#ifndef FLASHCP_PLANNER_SERVICE_CLOCK_H_
#define FLASHCP_PLANNER_SERVICE_CLOCK_H_

#include "core/clock.h"

namespace flashcp::planner_service {

using Clock = core::Clock;
using RealClock = core::RealClock;
using ManualClock = core::ManualClock;

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_CLOCK_H_
