// Element types of tensors. fp32/fp16/bf16 ("floating" below) carry model data; integer types
// carry token ids, targets and masks; f64 carries statistics that are exchanged between ranks.
// Statistics and accumulation are always fp32 whatever the storage type.
#pragma once

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace nf {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kU16,
  kU8,
  kF64,  // host-side statistics and reductions that must not lose bits
};

// Bytes per element.
size_t SizeOf(DType dtype);

// "f32", "f16", "bf16", "i32", "i64", "u16", "u8", "f64".
absl::string_view DTypeName(DType dtype);

// Parses a DTypeName() spelling (also "fp32", "fp16", "fp64", "float32", "float16", "float64",
// "bfloat16").
absl::StatusOr<DType> ParseDType(absl::string_view name);

inline bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

}  // namespace nf
