// Error handling: absl::Status / absl::StatusOr across module boundaries, with the two
// propagation macros every module uses.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define NF_CONCAT_INNER(a, b) a##b
#define NF_CONCAT(a, b) NF_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define NF_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status nf_status_ = (expr);      \
    if (!nf_status_.ok()) return nf_status_; \
  } while (false)

// `NF_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an absl::StatusOr or returns its error.
#define NF_ASSIGN_OR_RETURN(lhs, expr) \
  NF_ASSIGN_OR_RETURN_IMPL(NF_CONCAT(nf_statusor_, __LINE__), lhs, expr)
#define NF_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                             \
  if (!statusor.ok()) return statusor.status();       \
  lhs = std::move(statusor).value()
