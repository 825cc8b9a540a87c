// Hand-worked plans that several integration tests expect from the real
// planner, asserted field by field (gtest expectations).
#ifndef FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_
#define FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_

#include "flashcp/v1/planner.pb.h"

namespace flashcp::tests::testing {

// Strategy ring on documents [5, 3] at N = 2: rank 0 holds doc 0 [0, 4),
// rank 1 doc 0 [4, 5) and doc 1 [0, 3). Every field but batch_id.
void ExpectRingPlanFor53(const v1::PlanResponse& r);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_
