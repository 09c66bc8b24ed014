#include "core/ops/checks.h"

#include "absl/strings/str_cat.h"

namespace nf::ops {
namespace {

absl::Status Mismatch(absl::string_view op, Named t, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", t.name, " is ", t.tensor.DebugString(), ", expected ", expected));
}

}  // namespace

absl::Status CheckDefined(absl::string_view op, Named t) {
  if (t.tensor.defined()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", t.name, " is missing (undefined)"));
}

absl::Status CheckFloating(absl::string_view op, Named t) {
  if (absl::Status s = CheckDefined(op, t); !s.ok()) return s;
  if (IsFloating(t.tensor.dtype())) return absl::OkStatus();
  return Mismatch(op, t, "a floating dtype (f32, f16, bf16)");
}

absl::Status CheckDType(absl::string_view op, Named t, DType dtype) {
  if (absl::Status s = CheckDefined(op, t); !s.ok()) return s;
  if (t.tensor.dtype() == dtype) return absl::OkStatus();
  return Mismatch(op, t, absl::StrCat("dtype ", DTypeName(dtype)));
}

absl::Status CheckShape(absl::string_view op, Named t, const Shape& shape) {
  if (absl::Status s = CheckDefined(op, t); !s.ok()) return s;
  if (t.tensor.shape() == shape) return absl::OkStatus();
  return Mismatch(op, t, absl::StrCat("shape ", ShapeToString(shape)));
}

absl::Status CheckRankAtLeast(absl::string_view op, Named t, int rank) {
  if (absl::Status s = CheckDefined(op, t); !s.ok()) return s;
  if (t.tensor.rank() >= rank) return absl::OkStatus();
  return Mismatch(op, t, absl::StrCat("at least ", rank, " dimensions"));
}

absl::Status CheckSameNumel(absl::string_view op, Named a, Named b) {
  if (a.tensor.numel() == b.tensor.numel()) return absl::OkStatus();
  return Mismatch(op, b, absl::StrCat(a.tensor.numel(), " elements like ", a.name));
}

absl::Status CheckSameDevice(absl::string_view op, std::initializer_list<Named> tensors) {
  const Named& first = *tensors.begin();
  for (const Named& t : tensors) {
    if (absl::Status s = CheckDefined(op, t); !s.ok()) return s;
    if (!(t.tensor.device() == first.tensor.device())) {
      return Mismatch(op, t,
                      absl::StrCat("on ", first.tensor.device().ToString(), " like ", first.name));
    }
  }
  return absl::OkStatus();
}

}  // namespace nf::ops
