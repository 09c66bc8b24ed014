// Error handling: absl::Status / absl::StatusOr across module boundaries, with the two
// propagation macros every module uses.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

namespace nf {

// `status` with "<context>: " before its message, its code kept: an error from deep inside
// (a kernel's shape check) says where it happened (which layer, which micro-batch). Callers
// build the context only on failure: `if (!s.ok()) return WithContext(s, StrCat(...));`.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace nf
