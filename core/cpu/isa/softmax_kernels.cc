// Compiled once per ISA level (nf_add_isa_sources): see softmax_kernels.h. Every array is one
// row of n floats.
#include "core/cpu/isa/softmax_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/cpu/isa/lanes.h"

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// 2^k for k in [-126, 127], built in the exponent bits.
inline float Pow2(int32_t k) { return std::bit_cast<float>((k + 127) << 23); }

// cond ? a : b as bit operations under a mask. Written as a select, GCC's PRE evaluates exp's
// arithmetic on the clamped constant for the out-of-range paths and leaves the in-range path
// behind a branch (it may not speculate trapping FP operations), which the loop vectoriser
// gives up on below AVX-512. The comparisons are quiet ones (std::isless, std::isgreater) for
// the same reason: an ordinary < may trap on NaN.
inline float Blend(bool cond, float a, float b) {
  const int32_t mask = -static_cast<int32_t>(cond);
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & mask) |
                              (std::bit_cast<int32_t>(b) & ~mask));
}

// exp(x) in fp32 without branches or tables, so that loops calling it vectorise. With
// n = round(x / ln 2), x = n ln 2 + r and |r| <= ln(2) / 2; r is formed in two steps
// (Cody-Waite: n * kLn2Hi is exact, as n has at most 8 bits and kLn2Hi 15). exp(r) is its
// degree-7 Taylor polynomial, whose truncation (r^8 / 8! < 6e-9 relative) is well under
// rounding; 2^n is applied as two factors so that n = 128 (x near ln FLT_MAX) stays finite.
// Results below 2^-126 flush to 0; x above ln(FLT_MAX) gives inf; NaN stays NaN (r is NaN).
// Every select is a Blend, so the compiler sees no branch.
inline float Exp(float x) {
  constexpr float kMinArg = -87.33654f;   // ln(2^-126)
  constexpr float kMaxArg = 88.7228317f;  // the largest x with exp(x) <= FLT_MAX
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2Hi = 0x1.62e4p-1f;
  constexpr float kLn2Lo = static_cast<float>(0.69314718055994531 - 0x1.62e4p-1);
  constexpr float kRound = 0x1.8p23f;  // t + kRound rounds t to an integer (|t| < 2^22)
  // Clamped so that n stays in [-126, 128]; NaN passes.
  const float xc =
      Blend(std::isless(x, kMinArg), kMinArg, Blend(std::isgreater(x, kMaxArg), kMaxArg, x));
  const float shifted = xc * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t half = ni >> 1;
  const float result = p * Pow2(half) * Pow2(ni - half);
  return Blend(std::isless(x, kMinArg), 0.0f, Blend(std::isgreater(x, kMaxArg), kInf, result));
}

void ExpShifted(const float* x, int64_t n, float shift, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Exp(x[i] - shift);
}

float Max(const float* x, int64_t n) { return LaneMax(x, n); }

// The exps go through a stack block first: GCC does not vectorise Exp inside the lane sum, but
// does each loop on its own. kBlock is a multiple of kLanes, so the lanes see LaneSum's order.
double SumExpShifted(const float* x, int64_t n, float shift) {
  constexpr int64_t kBlock = 64 * kLanes;
  float block[kBlock];
  double lanes[kLanes] = {};
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t length = std::min(kBlock, n - begin);
    ExpShifted(x + begin, length, shift, block);
    AddToLanes(lanes, length, [&](int64_t i) { return double{block[i]}; });
  }
  return CombineLanes(lanes);
}

float SoftmaxRow(const float* x, int64_t n, float* y) {
  const float max = Max(x, n);
  if (max == -kInf) {
    for (int64_t i = 0; i < n; ++i) y[i] = 0.0f;
    return -kInf;
  }
  ExpShifted(x, n, max, y);
  const double sum = LaneSum(n, [&](int64_t i) { return double{y[i]}; });
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  return max + static_cast<float>(std::log(sum));
}

void ScaledExpShifted(const float* x, int64_t n, float shift, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale * Exp(x[i] - shift);
}

double Dot(const float* a, const float* b, int64_t n) {
  return LaneSum(n, [&](int64_t i) { return double{a[i]} * b[i]; });
}

void SoftmaxGrad(const float* p, const float* g, int64_t n, float row_dot, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = p[i] * (g[i] - row_dot);
}

}  // namespace

const SoftmaxKernels kSoftmaxKernels = {
    .exp_shifted = ExpShifted,
    .max = Max,
    .sum_exp_shifted = SumExpShifted,
    .softmax = SoftmaxRow,
    .scaled_exp_shifted = ScaledExpShifted,
    .dot = Dot,
    .softmax_grad = SoftmaxGrad,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
