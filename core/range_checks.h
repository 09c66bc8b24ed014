// Range checks for numbers read from a config or a file, each failing with one line that names
// the field and the value: InvalidArgument, for the caller to refuse before anything is
// allocated or indexed by the value. The floating-point checks are written so that NaN fails.
#pragma once

#include <cmath>
#include <concepts>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace nf {

template <std::integral T>
absl::Status RequirePositive(absl::string_view name, T value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be positive (got ", value, ")"));
}

template <std::integral T>
absl::Status RequireNonNegative(absl::string_view name, T value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 0 (got ", value, ")"));
}

// [1, limit]: a size that allocates or loops by its value; `why` says what the limit stands for.
template <std::integral T>
absl::Status RequireInRange(absl::string_view name, T value, T limit, absl::string_view why) {
  NF_RETURN_IF_ERROR(RequirePositive(name, value));
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be at most ", limit, " (got ", value, "; ", why, ")"));
}

template <std::floating_point T>
absl::Status RequirePositive(absl::string_view name, T value) {
  if (value > 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be positive and finite (got ", value, ")"));
}

template <std::floating_point T>
absl::Status RequireNonNegative(absl::string_view name, T value) {
  if (value >= 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be >= 0 and finite (got ", value, ")"));
}

// [0, 1): a probability that still lets something through, or an exponential-average decay.
template <std::floating_point T>
absl::Status RequireUnitInterval(absl::string_view name, T value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be in [0, 1) (got ", value, ")"));
}

}  // namespace nf
