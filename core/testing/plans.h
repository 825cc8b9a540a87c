// Hand-made plans the core tests work their numbers out on.
#ifndef FLASHCP_CORE_TESTING_PLANS_H_
#define FLASHCP_CORE_TESTING_PLANS_H_

#include "core/types.h"

namespace flashcp::core::testing {

// docs [6, 2] on 2 ranks, no padding: rank 0 holds doc 0's tail [2, 6); rank 1
// holds doc 0's head [0, 2) and all of doc 1.
inline Plan HeadTailPlan() {
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {6, 2};
  plan.padding = 0;
  plan.shards = {{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}};
  return plan;
}

}  // namespace flashcp::core::testing

#endif  // FLASHCP_CORE_TESTING_PLANS_H_
