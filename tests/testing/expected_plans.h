// Hand-worked plans that several integration tests expect from the real
// planner, asserted field by field (gtest expectations).
#ifndef FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_
#define FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "flashcp/v1/planner.pb.h"

namespace flashcp::tests::testing {

// Strategy ring on documents [5, 3] at N = 2: rank 0 holds doc 0 [0, 4),
// rank 1 doc 0 [4, 5) and doc 1 [0, 3). Every field but batch_id.
void ExpectRingPlanFor53(const v1::PlanResponse& r);

// A PlanRequest with the given id, documents, N and strategy; other fields 0.
v1::PlanRequest PlanRequestOf(uint64_t id, const std::vector<int64_t>& docs, int32_t cp,
                              const std::string& strategy = "ring");

// A batch the ilp strategy works on for long at N = 8: 100 documents of
// 1..2,000 tokens (a fixed LCG, seed 5). Seconds of LP before CBC's search,
// which then runs to its time limit.
std::vector<int64_t> SlowIlpBatch();

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_EXPECTED_PLANS_H_
