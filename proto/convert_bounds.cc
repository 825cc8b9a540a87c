#include "proto/convert.h"

#include <algorithm>

#include "core/mask.h"
#include "core/plan_hash.h"
#include "core/strategies.h"
#include "proto/global_batch_convert.h"

// Upper bounds on the wire size of a PlanRequest and a PlanResponse.
namespace flashcp::proto {

namespace {

// Bytes of x as a varint (int32 and int64 fields: a negative value takes 10).
int64_t VarintBytes(uint64_t x) {
  int64_t bytes = 1;
  while (x >= 0x80) {
    x >>= 7;
    ++bytes;
  }
  return bytes;
}

// A length-delimited field (tag, length, `body` bytes); field numbers < 16.
int64_t Delimited(int64_t body) { return 1 + VarintBytes(static_cast<uint64_t>(body)) + body; }

constexpr int64_t kInt64 = 1 + 10;  // a varint field: tag and the widest varint
constexpr int64_t kDouble = 1 + 8;  // a double field
// core::AllToAllTraffic's message for one group (a fixed text and four numbers).
constexpr int64_t kMaxAllToAllNoteBytes = 256;

}  // namespace

int64_t MaxRequestBytes(const core::BatchLimits& limits) {
  int64_t strategy = 0;
  for (core::Strategy s : core::AllStrategies()) {
    strategy = std::max(strategy, Delimited(static_cast<int64_t>(core::StrategyName(s).size())));
  }
  // Each doc_lens entry with its own tag (unpacked) is the widest form.
  const int64_t doc_lens = limits.max_docs * (1 + VarintBytes(limits.max_tokens));
  const int64_t cost = Delimited(kMaxCostProfileBytes) + Delimited(4 * kDouble);
  // rank_speed: one per rank, each with its own tag (unpacked) at the widest.
  const int64_t rank_speed = int64_t{limits.max_cp_size} * kDouble;
  // Fields 25 and 30-34 (two-byte tags): query_heads, cluster, cluster_spec
  // (eight doubles, compute, two int32, a bool), layers and two bools.
  const int64_t cluster_spec = 1 + Delimited(8 * kDouble + Delimited(4 * kDouble) + 2 * kInt64 + 2);
  const int64_t step = (1 + kInt64) + (2 + 1 + kMaxCostProfileBytes) + cluster_spec +
                       (1 + kInt64) + 2 * 3;
  // The mask's name and block size (fields >= 16: two-byte tags).
  const int64_t mask = 1 + Delimited(static_cast<int64_t>(
                               core::MaskKindName(core::MaskKind::kCausalDocument).size())) +
                       1 + kInt64;
  // ... min_shard_tokens, ranks_per_node, then the cost.
  // Fields 26-27 (two-byte tags): choose_schemes, inter_node_weight.
  const int64_t groups = (2 + 1) + (2 + 8);
  return kInt64 + doc_lens + kInt64 + strategy + kDouble + 3 * kInt64 + 2 + kInt64 + kInt64 +
         cost + rank_speed + step + groups + mask;
}

int64_t MaxResponseBytes(const PlanInput& input, int64_t max_shards) {
  // Under block diffusion the plan lists both copies of every document.
  const core::Batch batch = core::PlanBatch(input.batch, input.options.attention_mask);
  const int64_t n = static_cast<int64_t>(batch.doc_lens.size());
  const int64_t ranks = batch.cp_size;
  const int64_t total = core::TotalTokens(batch.doc_lens);
  const int64_t shards = std::max<int64_t>(max_shards, n);
  int64_t max_len = 0, doc_lens_body = 0;
  for (int64_t len : batch.doc_lens) {
    max_len = std::max(max_len, len);
    doc_lens_body += VarintBytes(len);
  }
  const int64_t tokens = VarintBytes(total), shard_index = VarintBytes(shards);
  // Packed per-rank lists, each entry at most `each` bytes.
  const auto per_rank = [&](int64_t each) { return Delimited(ranks * each); };

  int64_t bytes = kInt64                                                   // batch_id
                  + Delimited(static_cast<int64_t>(core::StrategyName(input.strategy).size()))
                  + kInt64                                                 // cp_size
                  + Delimited(doc_lens_body) + kInt64                      // doc_lens, padding
                  + Delimited(static_cast<int64_t>(core::MaskKindName(
                        core::MaskKind::kBlockDiffusion).size())) + kInt64;  // mask, block_size
  const int64_t shard_body = (1 + VarintBytes(n)) + (1 + VarintBytes(max_len)) * 2 +
                             (1 + VarintBytes(ranks));
  bytes += shards * Delimited(shard_body);
  int64_t scheme = 0;
  for (core::CommScheme s : core::kAllCommSchemes) {
    scheme = std::max(scheme, Delimited(static_cast<int64_t>(core::CommSchemeName(s).size())));
  }
  // Six per-rank lists and twelve int64 fields; the clean and noisy
  // per-rank token lists and maxima (block diffusion, two-byte tags).
  const int64_t scheme_bytes = Delimited(scheme + 6 * per_rank(10) + 12 * kInt64 +
                                         2 * (1 + per_rank(tokens)) + 2 * (1 + kInt64));
  const int64_t metrics = 3 * kDouble + kInt64 + per_rank(tokens) + per_rank(8) +
                          per_rank(tokens) + per_rank(shard_index) + 2 * kInt64 +
                          core::kNumCommSchemes * scheme_bytes + kDouble +
                          // cost_profile, cost, cost_calibrated, rank_predicted_cost,
                          // imbalance, rank_speed
                          Delimited(kMaxCostProfileBytes) + Delimited(4 * kDouble) + 2 +
                          per_rank(8) + kDouble + per_rank(8) +
                          // all_to_all_inapplicable (one group's message), replicated heads
                          Delimited(kMaxAllToAllNoteBytes) + 2 + kInt64 +
                          // rank_noisy_tokens, cut_noisy_blocks (two-byte tags)
                          1 + per_rank(tokens) + 1 + kInt64;
  // The step time (fields 30-38, two-byte tags): five doubles, two names
  // of at most kMaxCostProfileBytes, one entry per exchange (name, three
  // doubles), all_to_all's inapplicable note (one group's message) and per
  // rank six doubles.
  const int64_t step =
      !input.step_time.has_value()
          ? 0
          : 5 * (2 + 8) + 2 * (2 + 1 + kMaxCostProfileBytes) +
                core::kNumStepExchanges * (2 + 1 + (1 + 1 + 16) + 3 * kDouble) +
                Delimited(kMaxAllToAllNoteBytes) + 1 +  // its entry's length: a byte more
                (input.step_time->per_rank ? ranks * (2 + 1 + 6 * kDouble) : 0);
  bytes += Delimited(metrics + step);
  if (input.strategy == core::Strategy::kIlp) bytes += Delimited(2 + kDouble + kInt64);  // ilp
  if (input.choose_schemes) {
    // At most N groups holding the N ranks once between them: the ranks,
    // and per group its tag and length, its list's tag and length, a scheme
    // name and a double; then chosen_bytes and plan_source.
    const int64_t per_group = 2 + 5 + 1 + 5 + scheme + kDouble;
    bytes += ranks * VarintBytes(ranks) + ranks * per_group + 2 + scheme_bytes + 2 +
             Delimited(32);
  }
  bytes += Delimited(16) +  // plan_hash, 16 hex digits; planner_version
           Delimited(static_cast<int64_t>(core::PlannerVersion().size()));
  if (input.include_layout) {
    // Every shard once in some rank's list; the non-last ones (all but one
    // per document) each a send range and in at most N - 1 targeted lists.
    const int64_t nonlast = shards - n;
    const int64_t send = Delimited((1 + shard_index) + (1 + tokens) + (1 + VarintBytes(max_len)));
    const int64_t dests = std::min(ranks - 1, nonlast);  // targeted entries per rank
    const int64_t targeted_header = 1 + 5 + (1 + VarintBytes(ranks)) + (1 + tokens) + 1 + 5;
    const int64_t rank_header = 1 + 5 + (1 + VarintBytes(ranks)) + (1 + 5) + (1 + tokens);
    bytes += ranks * (rank_header + dests * targeted_header) + shards * shard_index +
             nonlast * send + nonlast * (ranks - 1) * shard_index;
  }
  return bytes;
}

int64_t MaxGlobalBatchResponseBytes(const GlobalBatchInput& input) {
  const int64_t c = input.context, docs = static_cast<int64_t>(input.doc_lens.size());
  // The pieces, counted (core::CutToContext, not made: a short context over
  // long documents makes up to max_docs x max_tokens of them).
  int64_t pieces = 0, piece_lens_body = 0, longest = 0;
  for (int64_t len : input.doc_lens) {
    const int64_t full = len / c, rest = len % c;
    pieces += full + (rest > 0 ? 1 : 0);
    piece_lens_body += full * VarintBytes(c) + (rest > 0 ? VarintBytes(rest) : 0);
    longest = std::max(longest, std::min(len, c));
  }
  // A replica packs at most C tokens and at most one piece per document (two
  // of one document would be a C-token piece and more), so at most
  // min(documents, C) pieces, none longer than `longest`; and the i-th
  // largest replica at most P / i of the P pieces (the i largest share
  // them). Its entry is bounded as Plan's answer (monotone in the number of
  // documents) for that many documents of that length over cp_size:
  // replicas i in [2^j, 2^(j+1)) at the bound for P / 2^j.
  const int64_t most = std::max<int64_t>(1, std::min(docs, c));
  PlanInput replica = input.replica;
  const auto entry = [&](int64_t m) {
    replica.batch.doc_lens.assign(m, longest);
    const int64_t shards =
        core::MaxPlanShards(replica.strategy, replica.batch, replica.options.attention_mask);
    // pieces (int32 indices), doc_lens, workload, plan.
    return Delimited(Delimited(m * VarintBytes(pieces)) + Delimited(m * VarintBytes(longest)) +
                     kDouble + Delimited(MaxResponseBytes(replica, shards)));
  };
  int64_t replicas = 0;
  for (int64_t first = 1; first <= input.dp_size; first *= 2) {
    const int64_t count = std::min<int64_t>(input.dp_size, 2 * first - 1) - first + 1;
    replicas += count * entry(std::max<int64_t>(1, std::min(most, pieces / first)));
  }
  return kInt64 + Delimited(piece_lens_body) + Delimited(pieces * VarintBytes(docs)) + replicas +
         3 * kDouble;
}

}  // namespace flashcp::proto
