// Argument checks shared by the op table's validation: each returns InvalidArgument with a
// message of the form "<Op>: <tensor> is f16[4, 8] on cpu, expected ...".
#pragma once

#include <initializer_list>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "core/tensor.h"

namespace nf::ops {

struct Named {
  absl::string_view name;
  const Tensor& tensor;
};

absl::Status CheckDefined(absl::string_view op, Named t);
absl::Status CheckFloating(absl::string_view op, Named t);
absl::Status CheckDType(absl::string_view op, Named t, DType dtype);
absl::Status CheckShape(absl::string_view op, Named t, const Shape& shape);
absl::Status CheckRankAtLeast(absl::string_view op, Named t, int rank);
absl::Status CheckSameNumel(absl::string_view op, Named a, Named b);
// Every tensor defined and on the first one's device.
absl::Status CheckSameDevice(absl::string_view op, std::initializer_list<Named> tensors);

// x [..., cols] viewed as [rows, cols].
inline int64_t Cols(const Tensor& x) { return x.rank() == 0 ? 1 : x.dim(-1); }
inline int64_t Rows(const Tensor& x) { return Cols(x) == 0 ? 0 : x.numel() / Cols(x); }

}  // namespace nf::ops
