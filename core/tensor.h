// Tensor: dtype + shape + device over contiguous storage. A view shares its parent's storage at
// an element offset with a shape of its own; there are no strides, so every tensor is dense
// and row-major, and flat parameter buffers are carved into per-parameter views.
//
// A Tensor is a handle: copying it copies the reference, not the data, and writing through a
// const Tensor& is allowed (ops take their outputs as const Tensor&, like pointers).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/half.h"

namespace nf {

using Shape = absl::InlinedVector<int64_t, 4>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[2, 3, 4]"

// Maps a C++ element type to its DType (float, Half, BFloat16, int32_t, int64_t, uint16_t,
// uint8_t, double).
template <typename T>
constexpr DType DTypeOf();

// A block of device memory, returned to its allocator when the last tensor using it dies.
class Storage {
 public:
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(Allocator& allocator, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return allocator_->device(); }

 private:
  Storage(Allocator* allocator, void* data, size_t bytes)
      : allocator_(allocator), data_(data), bytes_(bytes) {}
  Allocator* allocator_;
  void* data_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage

  // Uninitialised storage for `shape` elements of `dtype` from `allocator` (any device). There
  // is no default: where a tensor lives is always said, so a buffer meant for a model's device
  // cannot silently land in host memory (ops::Zeros(dtype, shape, device) for device buffers).
  static absl::StatusOr<Tensor> Empty(DType dtype, Shape shape, Allocator& allocator);
  // Host memory: uninitialised, and zero-filled.
  static absl::StatusOr<Tensor> HostEmpty(DType dtype, Shape shape);
  static absl::StatusOr<Tensor> HostZeros(DType dtype, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension `d`; negative d counts from the end (-1 is the last).
  int64_t dim(int d) const { return shape_[d < 0 ? d + rank() : d]; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device::Cpu(); }
  // Element offset of this view inside its storage.
  int64_t offset() const { return offset_; }

  void* raw_data() const;
  // Typed pointer to the first element; aborts when T does not match dtype() (a programming
  // error, not a data error).
  template <typename T>
  T* data() const;

  // A view of `shape` starting `element_offset` elements into this tensor.
  absl::StatusOr<Tensor> View(int64_t element_offset, Shape shape) const;
  // The same elements under another shape of equal size.
  absl::StatusOr<Tensor> Reshape(Shape shape) const;
  // Rows [start, start + length) along dimension 0.
  absl::StatusOr<Tensor> Slice(int64_t start, int64_t length) const;

  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }
  std::string DebugString() const;  // "f32[2, 3] on cpu"

 private:
  void CheckDType(DType expected) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

// Host-side conversions for CPU tensors of a floating dtype (fp32 values, rounded to nearest
// even on the way in). Used by tests, tools and checkpoint I/O, never on the hot path.
absl::StatusOr<std::vector<float>> ToFloatVector(const Tensor& tensor);
absl::Status CopyFromFloats(const Tensor& tensor, std::span<const float> values);
// A new CPU tensor of `dtype` holding `values` (rounded when dtype is fp16/bf16).
absl::StatusOr<Tensor> TensorFromFloats(DType dtype, Shape shape, std::span<const float> values);

// ---- implementation details ----

template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<Half>() {
  return DType::kF16;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType DTypeOf<uint16_t>() {
  return DType::kU16;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}

template <typename T>
T* Tensor::data() const {
  CheckDType(DTypeOf<T>());
  return static_cast<T*>(raw_data());
}

}  // namespace nf
