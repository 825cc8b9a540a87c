// Status propagation macros, shaped like the ones later Abseil releases ship
// (Debian 12's Abseil 20220623 has none). The one shim of its kind: use these,
// never a local copy.
#ifndef FLASHCP_CORE_STATUS_MACROS_H_
#define FLASHCP_CORE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define FLASHCP_RETURN_IF_ERROR(expr)                         \
  do {                                                        \
    if (absl::Status flashcp_status_ = (expr); !flashcp_status_.ok()) \
      return flashcp_status_;                                 \
  } while (false)

#define FLASHCP_STATUS_CONCAT_INNER_(a, b) a##b
#define FLASHCP_STATUS_CONCAT_(a, b) FLASHCP_STATUS_CONCAT_INNER_(a, b)

// FLASHCP_ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>);
// on error returns its status, else moves the value into `lhs`, which may be a
// declaration (`auto x`) or an existing lvalue.
#define FLASHCP_ASSIGN_OR_RETURN(lhs, expr)                                  \
  FLASHCP_ASSIGN_OR_RETURN_IMPL_(                                            \
      FLASHCP_STATUS_CONCAT_(flashcp_statusor_, __LINE__), lhs, expr)
#define FLASHCP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = *std::move(statusor)

#endif  // FLASHCP_CORE_STATUS_MACROS_H_
