// Tests of core/tensor.h: creation, alignment, views (View/Reshape/Slice) and their errors, the
// typed accessor, and the host float conversions.
#include "core/tensor.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/allocator_usage.h"
#include "core/half.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

bool IsAligned(const void* ptr, size_t alignment) {
  return reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
}

// Expects `status` to be an error of `code` whose message contains every one of `needles`.
void ExpectError(const absl::Status& status, absl::StatusCode code,
                 std::initializer_list<std::string> needles) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& needle : needles) {
    EXPECT_NE(std::string(status.message()).find(needle), std::string::npos)
        << "'" << needle << "' not in: " << status;
  }
}

Tensor MustEmpty(DType dtype, Shape shape) {
  auto t = Tensor::HostEmpty(dtype, std::move(shape));
  NF_EXPECT_OK(t);
  return t.ok() ? *std::move(t) : Tensor();
}

// An f32 tensor holding 0, 1, 2, ... so that views can be checked by value.
Tensor Iota(Shape shape) {
  Tensor t = MustEmpty(DType::kF32, std::move(shape));
  float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) data[i] = static_cast<float>(i);
  return t;
}

TEST(ShapeTest, NumElementsAndToString) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({0}), 0);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({5, 0, 7}), 0);
  EXPECT_EQ(ShapeToString({2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(ShapeToString({}), "[]");
}

TEST(TensorTest, DefaultIsUndefined) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.raw_data(), nullptr);
  EXPECT_EQ(t.device(), Device::Cpu());
}

TEST(TensorTest, EmptyHasShapeDtypeAndSize) {
  auto t = Tensor::HostEmpty(DType::kBF16, {2, 3, 5});
  NF_ASSERT_OK(t);
  EXPECT_TRUE(t->defined());
  EXPECT_EQ(t->dtype(), DType::kBF16);
  EXPECT_EQ(t->shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(t->rank(), 3);
  EXPECT_EQ(t->dim(0), 2);
  EXPECT_EQ(t->dim(2), 5);
  EXPECT_EQ(t->dim(-1), 5);
  EXPECT_EQ(t->dim(-3), 2);
  EXPECT_EQ(t->numel(), 30);
  EXPECT_EQ(t->nbytes(), 60u);
  EXPECT_EQ(t->offset(), 0);
  EXPECT_EQ(t->device(), Device::Cpu());
  EXPECT_NE(t->raw_data(), nullptr);
  EXPECT_EQ(t->DebugString(), "bf16[2, 3, 5] on cpu");
  // Scalar: rank 0, one element.
  auto scalar = Tensor::HostEmpty(DType::kI64, {});
  NF_ASSERT_OK(scalar);
  EXPECT_EQ(scalar->rank(), 0);
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(scalar->nbytes(), 8u);
}

TEST(TensorTest, ZerosIsZeroFilled) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU16,
                      DType::kU8}) {
    // Dirty the heap first so that zero-filling is not a coincidence of fresh pages.
    {
      auto dirty = Tensor::HostEmpty(DType::kU8, {4099});
      NF_ASSERT_OK(dirty);
      std::memset(dirty->raw_data(), 0xAB, dirty->nbytes());
    }
    auto t = Tensor::HostZeros(dtype, {3, 1365});
    NF_ASSERT_OK(t);
    const auto* bytes = static_cast<const unsigned char*>(t->raw_data());
    size_t nonzero = 0;
    for (size_t i = 0; i < t->nbytes(); ++i) nonzero += bytes[i] != 0;
    EXPECT_EQ(nonzero, 0u) << DTypeName(dtype);
  }
}

TEST(TensorTest, CpuAllocationsAre64ByteAligned) {
  std::vector<Tensor> keep;  // held alive so that successive blocks are distinct
  for (int64_t n : {0, 1, 2, 3, 7, 63, 64, 65, 127, 129, 1000, 4097, 65537, 1000003}) {
    for (DType dtype : {DType::kU8, DType::kF16, DType::kF32, DType::kI64}) {
      auto t = Tensor::HostEmpty(dtype, {n});
      NF_ASSERT_OK(t);
      EXPECT_NE(t->raw_data(), nullptr) << n;  // non-null even for 0 bytes
      EXPECT_TRUE(IsAligned(t->raw_data(), 64)) << n << " x " << DTypeName(dtype);
      // The whole block is usable (ASan reports an overflow here if it is short).
      if (t->nbytes() > 0) std::memset(t->raw_data(), 1, t->nbytes());
      keep.push_back(*std::move(t));
    }
  }
  // The allocator directly, including 0 bytes.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{33}, size_t{64}, size_t{100}}) {
    auto ptr = CpuAllocator().Allocate(bytes);
    NF_ASSERT_OK(ptr);
    EXPECT_NE(*ptr, nullptr);
    EXPECT_TRUE(IsAligned(*ptr, kCpuAlignment)) << bytes;
    CpuAllocator().Deallocate(*ptr, bytes);
  }
  EXPECT_EQ(kCpuAlignment, 64u);
}

// The allocator's live and peak counts follow the tensors' storage (the bytes asked for); views
// share it and count nothing. (Single-threaded: nothing else allocates meanwhile.)
TEST(TensorTest, CpuAllocatorUsageCountsLiveAndPeakStorage) {
  const int64_t start = CpuAllocatorUsage().live_bytes;
  ResetCpuAllocatorPeak();
  EXPECT_EQ(CpuAllocatorUsage().peak_bytes, start);
  {
    auto a = Tensor::HostEmpty(DType::kF32, {1000});
    auto b = Tensor::HostEmpty(DType::kF16, {3, 7});
    NF_ASSERT_OK(a);
    NF_ASSERT_OK(b);
    EXPECT_EQ(CpuAllocatorUsage().live_bytes, start + 4000 + 42);
    auto view = a->Slice(10, 100);
    NF_ASSERT_OK(view);
    EXPECT_EQ(CpuAllocatorUsage().live_bytes, start + 4000 + 42);
  }
  EXPECT_EQ(CpuAllocatorUsage().live_bytes, start);
  EXPECT_EQ(CpuAllocatorUsage().peak_bytes, start + 4042);
  ResetCpuAllocatorPeak();
  EXPECT_EQ(CpuAllocatorUsage().peak_bytes, start);
}

TEST(TensorTest, NegativeDimensionsAreRejected) {
  for (const Shape& shape : {Shape{-1}, Shape{2, -3}, Shape{-2, -3}, Shape{0, -1}}) {
    auto t = Tensor::HostEmpty(DType::kF32, shape);
    ExpectError(t.status(), absl::StatusCode::kInvalidArgument, {ShapeToString(shape)});
    auto z = Tensor::HostZeros(DType::kF32, shape);
    ExpectError(z.status(), absl::StatusCode::kInvalidArgument, {ShapeToString(shape)});
  }
  Tensor base = Iota({6});
  // Same element count (6) as the tensor, but negative: View must still reject it.
  ExpectError(base.Reshape({-2, -3}).status(), absl::StatusCode::kInvalidArgument, {"[-2, -3]"});
  ExpectError(base.View(0, {-1}).status(), absl::StatusCode::kInvalidArgument, {"[-1]"});
}

TEST(TensorTest, ViewSharesStorageAtOffset) {
  Tensor base = Iota({4, 6});
  auto view = base.View(5, {3, 2});
  NF_ASSERT_OK(view);
  EXPECT_TRUE(view->SharesStorageWith(base));
  EXPECT_EQ(view->offset(), 5);
  EXPECT_EQ(view->shape(), (Shape{3, 2}));
  EXPECT_EQ(view->dtype(), DType::kF32);
  EXPECT_EQ(view->raw_data(), base.data<float>() + 5);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(view->data<float>()[i], 5.0f + i);
  // Writes through the view are seen by the base.
  view->data<float>()[0] = -1.0f;
  EXPECT_EQ(base.data<float>()[5], -1.0f);
  // A view of a view accumulates offsets, and its bounds are the inner view's.
  auto inner = view->View(2, {4});
  NF_ASSERT_OK(inner);
  EXPECT_EQ(inner->offset(), 7);
  EXPECT_EQ(inner->data<float>()[0], 7.0f);
  EXPECT_TRUE(inner->SharesStorageWith(base));
  EXPECT_FALSE(view->View(2, {5}).ok());  // 2 + 5 > 6 elements of the view
  // The full extent and an empty view at the end are fine.
  NF_EXPECT_OK(base.View(0, {24}));
  NF_EXPECT_OK(base.View(24, {0}));
  // A different tensor does not share storage.
  EXPECT_FALSE(Iota({4, 6}).SharesStorageWith(base));
  // Views keep the storage alive after the base handle is gone.
  Tensor survivor;
  {
    Tensor temp = Iota({8});
    survivor = *temp.View(4, {4});
  }
  EXPECT_EQ(survivor.data<float>()[3], 7.0f);
}

TEST(TensorTest, ViewOutOfRangeIsAnError) {
  Tensor base = Iota({4, 6});
  ExpectError(base.View(20, {5}).status(), absl::StatusCode::kOutOfRange,
              {"[5]", "20", "f32[4, 6]"});
  ExpectError(base.View(-1, {2}).status(), absl::StatusCode::kOutOfRange, {"[2]", "-1"});
  ExpectError(base.View(0, {5, 5}).status(), absl::StatusCode::kOutOfRange, {"[5, 5]"});
  ExpectError(base.View(25, {0}).status(), absl::StatusCode::kOutOfRange, {"[0]"});
  // Offsets so large that offset + size overflows int64 must still be rejected.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ExpectError(base.View(kMax, {1}).status(), absl::StatusCode::kOutOfRange, {"[1]"});
  ExpectError(base.View(kMax - 2, {4}).status(), absl::StatusCode::kOutOfRange, {"[4]"});
}

TEST(TensorTest, ReshapeSharesStorage) {
  Tensor base = Iota({2, 3, 4});
  auto r = base.Reshape({6, 4});
  NF_ASSERT_OK(r);
  EXPECT_EQ(r->shape(), (Shape{6, 4}));
  EXPECT_TRUE(r->SharesStorageWith(base));
  EXPECT_EQ(r->raw_data(), base.raw_data());
  auto flat = base.Reshape({24});
  NF_ASSERT_OK(flat);
  EXPECT_EQ(flat->data<float>()[23], 23.0f);
  auto scalar_like = Iota({1}).Reshape({});
  NF_ASSERT_OK(scalar_like);
  EXPECT_EQ(scalar_like->rank(), 0);
  // Reshape of a slice keeps the slice's offset.
  auto slice = base.Slice(1, 1);
  NF_ASSERT_OK(slice);
  auto reshaped = slice->Reshape({12});
  NF_ASSERT_OK(reshaped);
  EXPECT_EQ(reshaped->offset(), 12);
  EXPECT_EQ(reshaped->data<float>()[0], 12.0f);
}

TEST(TensorTest, BadReshapeIsAnError) {
  Tensor base = Iota({2, 3, 4});
  ExpectError(base.Reshape({5, 5}).status(), absl::StatusCode::kInvalidArgument,
              {"[5, 5]", "f32[2, 3, 4]"});
  ExpectError(base.Reshape({25}).status(), absl::StatusCode::kInvalidArgument, {"[25]"});
  ExpectError(base.Reshape({}).status(), absl::StatusCode::kInvalidArgument, {"[]"});
  ExpectError(base.Reshape({-24}).status(), absl::StatusCode::kInvalidArgument, {"[-24]"});
}

TEST(TensorTest, SliceSharesStorageAtRowOffset) {
  Tensor base = Iota({5, 2, 3});
  auto s = base.Slice(2, 2);
  NF_ASSERT_OK(s);
  EXPECT_EQ(s->shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(s->offset(), 12);
  EXPECT_TRUE(s->SharesStorageWith(base));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(s->data<float>()[i], 12.0f + i);
  // Slicing a slice: offsets add up.
  auto ss = s->Slice(1, 1);
  NF_ASSERT_OK(ss);
  EXPECT_EQ(ss->offset(), 18);
  EXPECT_EQ(ss->data<float>()[0], 18.0f);
  // Empty slices at either end, and the whole tensor.
  auto empty = base.Slice(5, 0);
  NF_ASSERT_OK(empty);
  EXPECT_EQ(empty->numel(), 0);
  NF_EXPECT_OK(base.Slice(0, 0));
  auto all = base.Slice(0, 5);
  NF_ASSERT_OK(all);
  EXPECT_EQ(all->shape(), base.shape());
  // A tensor with zero rows can be sliced empty.
  Tensor no_rows = MustEmpty(DType::kF32, {0, 4});
  auto none = no_rows.Slice(0, 0);
  NF_ASSERT_OK(none);
  EXPECT_EQ(none->shape(), (Shape{0, 4}));
  // Slices of other dtypes step in elements, not bytes.
  Tensor halves = MustEmpty(DType::kF16, {4, 3});
  auto hs = halves.Slice(3, 1);
  NF_ASSERT_OK(hs);
  EXPECT_EQ(hs->raw_data(), static_cast<void*>(halves.data<Half>() + 9));
}

TEST(TensorTest, SliceOutOfRangeIsAnError) {
  Tensor base = Iota({5, 2});
  ExpectError(base.Slice(4, 2).status(), absl::StatusCode::kOutOfRange,
              {"f32[5, 2]", "length 2", "row 4"});
  ExpectError(base.Slice(6, 0).status(), absl::StatusCode::kOutOfRange, {"f32[5, 2]"});
  ExpectError(base.Slice(-1, 1).status(), absl::StatusCode::kOutOfRange, {"f32[5, 2]"});
  ExpectError(base.Slice(1, -1).status(), absl::StatusCode::kOutOfRange, {"f32[5, 2]"});
  // start + length overflowing int64 must not wrap around into range.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ExpectError(base.Slice(kMax, 1).status(), absl::StatusCode::kOutOfRange, {"f32[5, 2]"});
  ExpectError(base.Slice(1, kMax).status(), absl::StatusCode::kOutOfRange, {"f32[5, 2]"});
  Tensor scalar = MustEmpty(DType::kF32, {});
  ExpectError(scalar.Slice(0, 1).status(), absl::StatusCode::kInvalidArgument, {"scalar"});
}

TEST(TensorTest, TypedAccessReturnsTheData) {
  Tensor t = MustEmpty(DType::kI32, {3});
  EXPECT_EQ(static_cast<void*>(t.data<int32_t>()), t.raw_data());
  Tensor h = MustEmpty(DType::kF16, {3});
  EXPECT_EQ(static_cast<void*>(h.data<Half>()), h.raw_data());
  Tensor b = MustEmpty(DType::kBF16, {3});
  EXPECT_EQ(static_cast<void*>(b.data<BFloat16>()), b.raw_data());
  Tensor u = MustEmpty(DType::kU16, {3});
  EXPECT_EQ(static_cast<void*>(u.data<uint16_t>()), u.raw_data());
}

TEST(TensorDeathTest, DataTypeMismatchAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor t = MustEmpty(DType::kF32, {2, 3});
  EXPECT_DEATH(t.data<Half>(), "f32\\[2, 3\\] on cpu tensor accessed as f16");
  EXPECT_DEATH(t.data<int32_t>(), "accessed as i32");
  Tensor ids = MustEmpty(DType::kI32, {4});
  EXPECT_DEATH(ids.data<float>(), "i32\\[4\\] on cpu tensor accessed as f32");
  EXPECT_DEATH(ids.data<int64_t>(), "accessed as i64");
  Tensor bf = MustEmpty(DType::kBF16, {1});
  EXPECT_DEATH(bf.data<Half>(), "bf16\\[1\\] on cpu tensor accessed as f16");
}

// ---- host float conversions ---------------------------------------------------------------

TEST(TensorFloatsTest, F32RoundTripIsExact) {
  const std::vector<float> values = {
      0.0f,        -0.0f,  1.0f,   -2.5f,
      3.14159265f, 1e-30f, -1e30f, std::numeric_limits<float>::denorm_min()};
  auto t = TensorFromFloats(DType::kF32, {2, 4}, values);
  NF_ASSERT_OK(t);
  EXPECT_EQ(t->dtype(), DType::kF32);
  EXPECT_EQ(t->shape(), (Shape{2, 4}));
  auto back = ToFloatVector(*t);
  NF_ASSERT_OK(back);
  ASSERT_EQ(back->size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>((*back)[i]), std::bit_cast<uint32_t>(values[i])) << i;
  }
}

// For f16/bf16 every value comes back as exactly FromFloat's round-to-nearest-even (bitwise,
// signed zeros included), and values already representable come back unchanged.
TEST(TensorFloatsTest, HalfAndBFloat16RoundTrip) {
  const std::vector<float> values = {0.0f,  -0.0f,    1.0f,     -2.5f,  0.1f,          1.0f / 3,
                                     1e-6f, 65504.0f, 70000.0f, -1e-9f, 1.00048828125f};
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto t = TensorFromFloats(dtype, {static_cast<int64_t>(values.size())}, values);
    NF_ASSERT_OK(t);
    EXPECT_EQ(t->dtype(), dtype);
    auto back = ToFloatVector(*t);
    NF_ASSERT_OK(back);
    ASSERT_EQ(back->size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = dtype == DType::kF16 ? ToFloat(FromFloat<Half>(values[i]))
                                                  : ToFloat(FromFloat<BFloat16>(values[i]));
      EXPECT_EQ(std::bit_cast<uint32_t>((*back)[i]), std::bit_cast<uint32_t>(expected))
          << DTypeName(dtype) << " element " << i << " (" << values[i] << ")";
      // Stored bits are the conversion's bits.
      const uint16_t stored =
          dtype == DType::kF16 ? t->data<Half>()[i].bits : t->data<BFloat16>()[i].bits;
      const uint16_t want =
          dtype == DType::kF16 ? FloatToHalfBits(values[i]) : FloatToBFloat16Bits(values[i]);
      EXPECT_EQ(stored, want) << DTypeName(dtype) << " element " << i;
    }
    // Spot checks that rounding really happened (and to the right neighbour).
    if (dtype == DType::kF16) {
      EXPECT_EQ((*back)[4], 0.0999755859375f);  // 0.1 -> 0x2E66
      EXPECT_EQ((*back)[8], INFINITY);          // 70000 overflows fp16
      EXPECT_EQ((*back)[10], 1.0f);             // 1 + 2^-11 ties to even 1.0
    } else {
      EXPECT_EQ((*back)[4], 0.10009765625f);  // 0.1 -> 0x3DCD
      EXPECT_EQ((*back)[8], 70144.0f);        // bf16 has range but 8 bits of precision
    }
    // Representable values are unchanged.
    for (size_t i : {0, 1, 2, 3}) EXPECT_EQ((*back)[i], values[i]);
  }
}

TEST(TensorFloatsTest, CopyFromFloatsIntoASliceTouchesOnlyTheSlice) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto base = Tensor::HostZeros(dtype, {4, 3});
    NF_ASSERT_OK(base);
    auto rows = base->Slice(1, 2);
    NF_ASSERT_OK(rows);
    const std::vector<float> values = {1, 2, 3, 4, 5, 6};
    NF_ASSERT_OK(CopyFromFloats(*rows, values));
    auto all = ToFloatVector(*base);
    NF_ASSERT_OK(all);
    const std::vector<float> expected = {0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0};
    EXPECT_EQ(*all, expected) << DTypeName(dtype);
    auto part = ToFloatVector(*rows);
    NF_ASSERT_OK(part);
    EXPECT_EQ(*part, values) << DTypeName(dtype);
  }
}

TEST(TensorFloatsTest, IntegerTensorsAreRejected) {
  const std::vector<float> values = {1, 2, 3};
  for (DType dtype : {DType::kI32, DType::kI64, DType::kU16, DType::kU8}) {
    const std::string name(DTypeName(dtype));
    ExpectError(TensorFromFloats(dtype, {3}, values).status(), absl::StatusCode::kInvalidArgument,
                {name + "[3]"});
    auto t = Tensor::HostZeros(dtype, {3});
    NF_ASSERT_OK(t);
    ExpectError(ToFloatVector(*t).status(), absl::StatusCode::kInvalidArgument, {name + "[3]"});
    ExpectError(CopyFromFloats(*t, values), absl::StatusCode::kInvalidArgument, {name + "[3]"});
    // Nothing was written.
    const auto* bytes = static_cast<const unsigned char*>(t->raw_data());
    for (size_t i = 0; i < t->nbytes(); ++i) EXPECT_EQ(bytes[i], 0) << name;
  }
}

TEST(TensorFloatsTest, SizeMismatchIsAnError) {
  const std::vector<float> values = {1, 2, 3, 4, 5};
  ExpectError(TensorFromFloats(DType::kF32, {2, 3}, values).status(),
              absl::StatusCode::kInvalidArgument, {"5", "f32[2, 3]"});
  auto t = Tensor::HostZeros(DType::kF16, {4});
  NF_ASSERT_OK(t);
  ExpectError(CopyFromFloats(*t, values), absl::StatusCode::kInvalidArgument, {"f16[4]"});
  ExpectError(TensorFromFloats(DType::kF32, {-5}, values).status(),
              absl::StatusCode::kInvalidArgument, {"[-5]"});
}

TEST(TensorFloatsTest, UndefinedTensorIsAnError) {
  // A default Tensor has no storage (its shape [] would otherwise claim one element).
  const Tensor undefined;
  EXPECT_FALSE(ToFloatVector(undefined).ok());
  const std::vector<float> one = {1.0f};
  EXPECT_FALSE(CopyFromFloats(undefined, one).ok());
}

TEST(TensorFloatsTest, EmptyTensorsConvert) {
  auto t = TensorFromFloats(DType::kBF16, {0, 7}, std::vector<float>{});
  NF_ASSERT_OK(t);
  auto back = ToFloatVector(*t);
  NF_ASSERT_OK(back);
  EXPECT_TRUE(back->empty());
}

}  // namespace
}  // namespace nf
