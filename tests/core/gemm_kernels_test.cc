// The skinny GEMM path's kernels (core/cpu/isa/gemm_kernels.h) at every ISA level this CPU
// runs: the widenings against core/half.h on every one of the 65,536 bit patterns, and the row
// dot products against a float64 reference.
//
// Error model of dot_rows. Products and sums are fp32 (u = 2^-24); a sum of k terms over the 32
// fixed lanes puts each term through at most L(k) = ceil(k / 32) + 5 roundings (its product, its
// lane's additions, the 5 levels of the lane tree), so the error is at most L(k) u times the sum
// of the terms' magnitudes (first order; the inputs are read exactly).
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/isa/gemm_kernels.h"
#include "core/half.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::cpu {
namespace {

using ::nf::testing::kU32;
using ::nf::testing::RandomFloats;

std::vector<uint16_t> EveryBitPattern() {
  std::vector<uint16_t> bits(1 << 16);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  return bits;
}

// Widens every pattern in one call (the vector loop) and in short calls of 1 to 17 values at
// every offset of a window (the tails), and compares each value's bits with `reference`.
template <typename Widen, typename Reference>
void ExpectWidensLike(Widen widen, Reference reference, const std::string& what) {
  const std::vector<uint16_t> bits = EveryBitPattern();
  std::vector<float> out(bits.size());
  widen(bits.data(), static_cast<int64_t>(bits.size()), out.data());
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(reference(bits[i])))
        << what << ": bits 0x" << std::hex << bits[i];
  }
  // The window covers zero, subnormals, the largest normals, inf and NaNs of both signs.
  for (const size_t start : {size_t{0}, size_t{0x03F8}, size_t{0x7BF8}, size_t{0xFC00 - 9}}) {
    for (int64_t k = 1; k <= 17; ++k) {
      std::vector<float> part(k);
      widen(bits.data() + start, k, part.data());
      for (int64_t c = 0; c < k; ++c) {
        ASSERT_EQ(std::bit_cast<uint32_t>(part[c]),
                  std::bit_cast<uint32_t>(reference(bits[start + c])))
            << what << ": k=" << k << " bits 0x" << std::hex << bits[start + c];
      }
    }
  }
}

TEST(GemmKernelsTest, WidenF16IsHalfBitsToFloatForEveryPattern) {
  for (Isa isa : RunnableIsas()) {
    ExpectWidensLike(GemmKernelsFor(isa).widen_f16, HalfBitsToFloat, IsaName(isa));
  }
}

TEST(GemmKernelsTest, WidenBf16IsBFloat16BitsToFloatForEveryPattern) {
  for (Isa isa : RunnableIsas()) {
    ExpectWidensLike(GemmKernelsFor(isa).widen_bf16, BFloat16BitsToFloat, IsaName(isa));
  }
}

TEST(GemmKernelsTest, DotRowsWithinTheLaneSumBound) {
  for (Isa isa : RunnableIsas()) {
    // Lengths below, at and around the 32 lanes, and a 2.7B layer's d_model.
    for (const int64_t k : {1, 3, 31, 32, 33, 100, 2560}) {
      for (const int64_t rows : {1, 3, 16}) {
        const std::string what = absl::StrCat(IsaName(isa), " k=", k, " rows=", rows);
        const std::vector<float> a = RandomFloats(rows * k, 7 + k, -2.0f, 2.0f);
        const std::vector<float> w = RandomFloats(k, 11 + k, -2.0f, 2.0f);
        std::vector<float> out(rows, -1.0f);
        GemmKernelsFor(isa).dot_rows(a.data(), rows, w.data(), k, out.data());
        const double roundings = static_cast<double>((k + 31) / 32 + 5);
        for (int64_t i = 0; i < rows; ++i) {
          double sum = 0.0, magnitude = 0.0;
          for (int64_t c = 0; c < k; ++c) {
            sum += static_cast<double>(a[i * k + c]) * w[c];
            magnitude += std::abs(static_cast<double>(a[i * k + c]) * w[c]);
          }
          EXPECT_LE(std::abs(out[i] - sum), roundings * kU32 * magnitude)
              << what << " row " << i << ": " << out[i] << ", expected " << sum;
        }
      }
    }
  }
}

TEST(GemmKernelsTest, DotRowsOfNothingAreZero) {
  for (Isa isa : RunnableIsas()) {
    float out[2] = {-1.0f, -1.0f};
    const float unused = 1.0f;
    GemmKernelsFor(isa).dot_rows(&unused, 2, &unused, 0, out);
    EXPECT_EQ(out[0], 0.0f) << IsaName(isa);
    EXPECT_EQ(out[1], 0.0f) << IsaName(isa);
  }
}

}  // namespace
}  // namespace nf::cpu
