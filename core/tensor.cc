#include "core/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nf {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(Allocator& allocator, size_t bytes) {
  auto ptr = allocator.Allocate(bytes);
  if (!ptr.ok()) return ptr.status();
  return std::shared_ptr<Storage>(new Storage(&allocator, *ptr, bytes));
}

Storage::~Storage() { allocator_->Deallocate(data_, bytes_); }

namespace {

absl::Status ValidateShape(const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape ", ShapeToString(shape), " has a negative dimension"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, Shape shape, Allocator& allocator) {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto storage = Storage::Allocate(allocator, t.nbytes());
  if (!storage.ok()) return storage.status();
  t.storage_ = *std::move(storage);
  return t;
}

absl::StatusOr<Tensor> Tensor::HostEmpty(DType dtype, Shape shape) {
  return Empty(dtype, std::move(shape), CpuAllocator());
}

absl::StatusOr<Tensor> Tensor::HostZeros(DType dtype, Shape shape) {
  auto t = HostEmpty(dtype, std::move(shape));
  if (t.ok()) std::memset(t->raw_data(), 0, t->nbytes());
  return t;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(SizeOf(dtype_));
}

void Tensor::CheckDType(DType expected) const {
  if (expected != dtype_) {
    std::fprintf(stderr, "normformer: internal error: %s tensor accessed as %s\n",
                 DebugString().c_str(), std::string(DTypeName(expected)).c_str());
    std::abort();
  }
}

absl::StatusOr<Tensor> Tensor::View(int64_t element_offset, Shape shape) const {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  const int64_t n = NumElements(shape);
  // Written so that a huge offset cannot overflow int64 and wrap back into range.
  if (element_offset < 0 || n > numel() - element_offset) {
    return absl::OutOfRangeError(absl::StrCat("view of ", ShapeToString(shape), " at offset ",
                                              element_offset, " exceeds ", DebugString()));
  }
  Tensor view = *this;
  view.offset_ = offset_ + element_offset;
  view.shape_ = std::move(shape);
  return view;
}

absl::StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  if (NumElements(shape) != numel()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", DebugString(), " to ",
                                                   ShapeToString(shape), ": sizes differ"));
  }
  return View(0, std::move(shape));
}

absl::StatusOr<Tensor> Tensor::Slice(int64_t start, int64_t length) const {
  if (rank() == 0) return absl::InvalidArgumentError("cannot slice a scalar tensor");
  // Written so that a huge start or length cannot overflow int64 and wrap back into range.
  if (start < 0 || length < 0 || start > shape_[0] - length) {
    return absl::OutOfRangeError(absl::StrCat("slice of length ", length, " at row ", start,
                                              " exceeds dimension 0 of ", DebugString()));
  }
  Shape shape = shape_;
  shape[0] = length;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  return View(start * row, std::move(shape));
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), " on ", device().ToString());
}

namespace {

absl::Status CheckHostFloat(const Tensor& tensor) {
  if (!tensor.defined() || tensor.device().type != DeviceType::kCpu ||
      !IsFloating(tensor.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a floating CPU tensor, got ", tensor.DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> ToFloatVector(const Tensor& tensor) {
  if (absl::Status s = CheckHostFloat(tensor); !s.ok()) return s;
  std::vector<float> out(tensor.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    switch (tensor.dtype()) {
      case DType::kF16:
        out[i] = ToFloat(tensor.data<Half>()[i]);
        break;
      case DType::kBF16:
        out[i] = ToFloat(tensor.data<BFloat16>()[i]);
        break;
      default:
        out[i] = tensor.data<float>()[i];
    }
  }
  return out;
}

absl::Status CopyFromFloats(const Tensor& tensor, std::span<const float> values) {
  if (absl::Status s = CheckHostFloat(tensor); !s.ok()) return s;
  if (static_cast<int64_t>(values.size()) != tensor.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot copy ", values.size(), " values into ", tensor.DebugString()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    switch (tensor.dtype()) {
      case DType::kF16:
        tensor.data<Half>()[i] = FromFloat<Half>(values[i]);
        break;
      case DType::kBF16:
        tensor.data<BFloat16>()[i] = FromFloat<BFloat16>(values[i]);
        break;
      default:
        tensor.data<float>()[i] = values[i];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> TensorFromFloats(DType dtype, Shape shape, std::span<const float> values) {
  auto tensor = Tensor::HostEmpty(dtype, std::move(shape));
  if (!tensor.ok()) return tensor.status();
  if (absl::Status s = CopyFromFloats(*tensor, values); !s.ok()) return s;
  return tensor;
}

}  // namespace nf
