// A plan's identity: a 64-bit hash of what every rank of a CP group must
// agree on to run a step together (the documents, the group size, the
// padding and the shards), and the version of the planner that made it.
// PlanResponse.plan_hash / planner_version (planner.proto) carry them; the
// PyTorch integration compares the hash across the group before a step
// (flashcp.torch.CpContext).
//
// The hash is FNV-1a 64 (Fowler-Noll-Vo, variant 1a, 64 bits: offset basis
// 0xcbf29ce484222325, prime 0x100000001b3; draft-eastlake-fnv) over the
// plan's canonical encoding below. It detects accidental differences (two
// planner versions, two batches, a stale plan); it is not a cryptographic
// digest and does not resist a party that crafts collisions.
//
// Canonical encoding, version 1 (PlanHashBytes): the 16 ASCII bytes
// "flashcp.plan.v1\0" (kPlanHashPrefix), then every integer as 8 bytes,
// little-endian two's complement (int64), in this order:
//   cp_size, padding,
//   D = number of documents, doc_lens[0 .. D),
//   S = number of shards, then for each shard in plan order: doc, start, len, rank,
//   the mask section.
// The mask section (Plan::mask) is empty for the causal document mask
// (SPEC.md "Batch, shard, rank"), so that causal plans hash as before masks
// existed. Any other mask appends its MaskKind id and block size b, as int64
// each, after the shards, which keeps them apart from every causal plan's
// encoding.
// Shard order is part of the plan (a rank's token order), so it is hashed as
// given. Any change to this encoding changes kPlanHashPrefix.
#ifndef FLASHCP_CORE_PLAN_HASH_H_
#define FLASHCP_CORE_PLAN_HASH_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "core/types.h"

namespace flashcp::core {

// The encoding's version tag, its first 16 bytes (the terminating NUL included).
inline constexpr absl::string_view kPlanHashPrefix{"flashcp.plan.v1\0", 16};

// FNV-1a 64 of `bytes`.
uint64_t Fnv1a64(absl::string_view bytes);

// The canonical encoding above. `plan` need not be valid (no checks): the
// encoding is defined for any values.
std::string PlanHashBytes(const Plan& plan);

// Fnv1a64(PlanHashBytes(plan)), without building the bytes.
uint64_t PlanHash(const Plan& plan);

// `hash` as the wire writes it (PlanResponse.plan_hash): 16 lowercase hex
// digits, zero-padded.
std::string PlanHashHex(uint64_t hash);

// The version of the planner code that makes plans (the project's release,
// CMake's PROJECT_VERSION, e.g. "0.1.0"): PlanResponse.planner_version. Plans
// may change between versions; plan_hash tells whether they did.
absl::string_view PlannerVersion();

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PLAN_HASH_H_
