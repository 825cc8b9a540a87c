// Seeded document-length generators for the paper's data sets
// (../shared/datasets/README.md), and batch packing. Pure: the distributions
// are compiled in (with their sources and assumptions), randomness comes from
// a caller-owned seed, and the same seed gives the same batches on every
// machine (own PRNG and transforms; no std:: distributions).
#ifndef FLASHCP_CORE_DATASETS_H_
#define FLASHCP_CORE_DATASETS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashcp::core {

enum class Dataset { kWlbLlm = 0, kPile = 1, kRedPajama = 2 };
inline constexpr Dataset kAllDatasets[] = {Dataset::kWlbLlm, Dataset::kPile, Dataset::kRedPajama};

absl::string_view DatasetName(Dataset dataset);  // "wlbllm", "pile", "redpajama"
absl::StatusOr<Dataset> ParseDataset(absl::string_view name);

// Draws `count` batches of `context` tokens: documents are sampled until the
// context is full and the last one is truncated to fit, so every batch sums to
// exactly `context`. Batch k depends only on (dataset, context, seed, k).
// InvalidArgument naming the field for context < 1 or above 2^40, count < 0 or
// above 1e6.
absl::StatusOr<std::vector<std::vector<int64_t>>> SampleBatches(Dataset dataset, int64_t context,
                                                                int64_t count, uint64_t seed);

// Batch `index` of SampleBatches(dataset, context, count, seed) for any
// count > index, drawn alone (lets a caller stream batches without holding
// them all). InvalidArgument naming the field for context as above or index
// outside [0, 1e6); ResourceExhausted where the batch would hold more than
// kMaxDocs documents (a context far above the distribution's mean), so no
// allocation grows without a bound.
absl::StatusOr<std::vector<int64_t>> SampleBatch(Dataset dataset, int64_t context, uint64_t seed,
                                                 int64_t index);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_DATASETS_H_
