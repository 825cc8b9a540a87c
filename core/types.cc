#include "core/types.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashcp::core {

int64_t TotalTokens(const std::vector<int64_t>& doc_lens) {
  int64_t total = 0;
  for (int64_t len : doc_lens) total += len;
  return total;
}

absl::Status ValidateBatch(const Batch& batch, const BatchLimits& limits) {
  const int64_t n_docs = static_cast<int64_t>(batch.doc_lens.size());
  if (n_docs == 0) {
    return absl::InvalidArgumentError("doc_lens: the batch has no documents");
  }
  if (n_docs > kMaxDocs) {
    return absl::InvalidArgumentError(
        absl::StrCat("doc_lens: ", n_docs, " documents, above the absolute limit of ", kMaxDocs));
  }
  if (n_docs > limits.max_docs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("doc_lens: ", n_docs, " documents, above this server's limit of ",
                     limits.max_docs));
  }
  if (batch.cp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp_size: must be at least 1, got ", batch.cp_size));
  }
  if (batch.cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size: ", batch.cp_size, " ranks, above the absolute limit of ", kMaxCpSize));
  }
  if (batch.cp_size > limits.max_cp_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cp_size: ", batch.cp_size, " ranks, above this server's limit of ", limits.max_cp_size));
  }
  // Summed with a check before each add, so the total never overflows.
  int64_t total = 0;
  for (int64_t i = 0; i < n_docs; ++i) {
    const int64_t len = batch.doc_lens[i];
    if (len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("doc_lens[", i, "]: a document length must be at least 1, got ", len));
    }
    if (len > kMaxTokens - total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_lens: total tokens exceed the absolute limit of 2^40 at doc_lens[", i, "]"));
    }
    total += len;
  }
  if (total > limits.max_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "doc_lens: ", total, " tokens, above this server's limit of ", limits.max_tokens));
  }
  if (batch.cp_size > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size: ", batch.cp_size, " ranks is more than the batch's ", total, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace flashcp::core
