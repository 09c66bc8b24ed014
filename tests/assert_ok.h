// NF_ASSERT_OK / NF_EXPECT_OK: a failing status names the expression and prints the status
// itself (code and message), for absl::Status and absl::StatusOr<T> alike, so a red test says
// why without a rerun under a debugger. Further context streams as usual:
//   NF_ASSERT_OK(trainer->TrainStep()) << "step " << s;
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace nf::testing {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// The predicate-formatter behind the macros: the expression's text and its status on failure.
template <typename S>
::testing::AssertionResult IsOk(const char* expression, const S& value) {
  const absl::Status& status = StatusOf(value);
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expression << " is not OK: " << status;
}

}  // namespace nf::testing

#define NF_ASSERT_OK(expression) ASSERT_PRED_FORMAT1(::nf::testing::IsOk, expression)
#define NF_EXPECT_OK(expression) EXPECT_PRED_FORMAT1(::nf::testing::IsOk, expression)
