#include "client/python/native/native_common.h"

namespace flashcp::python {

void CheckMapped(const char* name, uintptr_t address, int64_t bytes) {
  if (bytes <= 0) return;
  if (address % alignof(float) != 0) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(name, ": address 0x", absl::Hex(address), " is not float-aligned")));
  }
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = address & ~(page - 1);
  if (address + static_cast<uintptr_t>(bytes) < address) {
    Raise(absl::InvalidArgumentError(absl::StrCat(name, ": address range wraps around")));
  }
  const uintptr_t end = address + static_cast<uintptr_t>(bytes);
  std::vector<unsigned char> pages((end - first + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(first), end - first, pages.data()) != 0) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        name, ": ", bytes, " bytes at address 0x", absl::Hex(address),
        " are not mapped in this process (not a live tensor's data_ptr())")));
  }
}

py::bytes Int64Bytes(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

core::Plan MakePlan(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
                    const std::vector<ShardTuple>& shards, int64_t block_size) {
  core::Plan plan;
  if (block_size != 0) plan.mask = {core::MaskKind::kBlockDiffusion, block_size};
  plan.cp_size = cp_size;
  plan.doc_lens = doc_lens;
  plan.padding = padding;
  plan.shards.reserve(shards.size());
  for (const auto& [doc, start, len, rank] : shards) {
    plan.shards.push_back(core::Shard{doc, start, len, rank});
  }
  return plan;
}

}  // namespace flashcp::python
