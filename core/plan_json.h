// Text formats at the edge of the core: batch lines in, plan JSON out. Pure
// string functions; the callers do the I/O.
#ifndef FLASHCP_CORE_PLAN_JSON_H_
#define FLASHCP_CORE_PLAN_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/types.h"

namespace flashcp::core {

// Parses one batch line: document lengths separated by commas and/or
// whitespace. InvalidArgument naming the 0-based token position for anything
// that is not a positive integer below 2^40, or for an empty line.
absl::StatusOr<std::vector<int64_t>> ParseBatchLine(absl::string_view line);

// One JSON object, one line, no trailing newline:
// {"cp_size":N,"docs":[...],"padding":P,"shards":[{"doc":i,"start":a,"len":s,"rank":r},...],
//  "metrics":{"imbalance":x,"comm_saving":y,"targeted_saving":z,"cut_docs":k,
//             "min_cut_shard_len":m,"tokens_per_rank":t,"rank_workload":[...],
//             "rank_nonlast_tokens":[...],"bytes_full_kv":b,"bytes_allgather":b,
//             "bytes_targeted":b},
//  "strategy":"...", plus `extra` (already-formatted ,"key":value pairs) if given}
std::string PlanToJson(const Plan& plan, const PlanMetrics& metrics, absl::string_view strategy,
                       absl::string_view extra = "");

// `s` as a JSON string literal, quotes included; control characters escaped,
// other bytes (UTF-8 included) copied.
std::string JsonString(absl::string_view s);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PLAN_JSON_H_
