// Helpers for the communicator tests: tensors of any dtype from doubles and back, and an
// allocator that claims to be a GPU, to check that host-only code refuses device tensors.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/allocator.h"
#include "core/half.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace nf::testing {

// Writes `values` into a CPU tensor of any dtype (rounded to nearest even for fp16/bf16).
inline void SetValues(const Tensor& t, const std::vector<double>& values) {
  ASSERT_EQ(static_cast<int64_t>(values.size()), t.numel()) << t.DebugString();
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (t.dtype()) {
      case DType::kF32:
        t.data<float>()[i] = static_cast<float>(v);
        break;
      case DType::kF64:
        t.data<double>()[i] = v;
        break;
      case DType::kF16:
        t.data<Half>()[i] = FromFloat<Half>(static_cast<float>(v));
        break;
      case DType::kBF16:
        t.data<BFloat16>()[i] = FromFloat<BFloat16>(static_cast<float>(v));
        break;
      case DType::kI32:
        t.data<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::kI64:
        t.data<int64_t>()[i] = static_cast<int64_t>(v);
        break;
      case DType::kU16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(v);
        break;
      case DType::kU8:
        t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
        break;
    }
  }
}

// The values of a CPU tensor of any dtype.
inline std::vector<double> Values(const Tensor& t) {
  std::vector<double> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::kF32:
        out[i] = t.data<float>()[i];
        break;
      case DType::kF64:
        out[i] = t.data<double>()[i];
        break;
      case DType::kF16:
        out[i] = ToFloat(t.data<Half>()[i]);
        break;
      case DType::kBF16:
        out[i] = ToFloat(t.data<BFloat16>()[i]);
        break;
      case DType::kI32:
        out[i] = t.data<int32_t>()[i];
        break;
      case DType::kI64:
        out[i] = static_cast<double>(t.data<int64_t>()[i]);
        break;
      case DType::kU16:
        out[i] = t.data<uint16_t>()[i];
        break;
      case DType::kU8:
        out[i] = t.data<uint8_t>()[i];
        break;
    }
  }
  return out;
}

// A tensor of `dtype` and `shape` holding `values`; aborts the test on allocation failure.
inline Tensor TensorOf(DType dtype, Shape shape, const std::vector<double>& values) {
  auto t = Tensor::HostEmpty(dtype, std::move(shape));
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    std::abort();
  }
  SetValues(*t, values);
  return *std::move(t);
}

// Host memory labelled cuda:0: tensors from it look like GPU tensors to every check.
class FakeGpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    return std::aligned_alloc(
        kCpuAlignment, (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment + kCpuAlignment);
  }
  void Deallocate(void* ptr, size_t /*bytes*/) override { std::free(ptr); }
};

inline Tensor FakeGpuTensor(DType dtype, Shape shape) {
  static FakeGpuAllocator allocator;
  auto t = Tensor::Empty(dtype, std::move(shape), allocator);
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    std::abort();
  }
  return *std::move(t);
}

}  // namespace nf::testing
