#include "core/dtype.h"

#include "absl/strings/str_cat.h"

namespace nf {

size_t SizeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kU16:
      return 2;
    case DType::kI64:
    case DType::kF64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU16:
      return "u16";
    case DType::kU8:
      return "u8";
    case DType::kF64:
      return "f64";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "i64" || name == "int64") return DType::kI64;
  if (name == "u16" || name == "uint16") return DType::kU16;
  if (name == "u8" || name == "uint8") return DType::kU8;
  if (name == "f64" || name == "fp64" || name == "float64") return DType::kF64;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "'; use one of f32, f16, bf16, i32, i64, u16, u8, f64"));
}

}  // namespace nf
