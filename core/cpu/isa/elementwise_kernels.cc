// Compiled once per ISA level (nf_add_isa_sources): see elementwise_kernels.h.
//
// The activations need erf and exp in a form the vectoriser takes: std::erf / std::exp are
// library calls, one element at a time. The functions below use only arithmetic and integer bit
// operations, so the loops calling them vectorise at every level, and an element's result does
// not depend on whether the vector body or the scalar remainder of a loop computes it.
//
// They have no conditional expressions on floats (`x > 0 ? 1 - t : t`, `a > 16 ? 16 : a`):
// GCC turns those into branches, threads known values through them (on the capped path the whole
// exp folds to a constant) and then cannot vectorise the loop below AVX-512, as under its default
// -ftrapping-math it may not speculate the float arithmetic of the other path. Selects are bit
// masks (Select) and caps integer minima (CapNonNegative) instead.
#include "core/cpu/isa/elementwise_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

// ---- Branch-free fp32 math ----------------------------------------------------------------------

// All ones where `condition` holds, else zero.
inline uint32_t MaskIf(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// a where mask is all ones, b where it is zero (both computed).
inline float Select(uint32_t mask, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

// min(a, cap) for a >= 0 (a NaN gives cap): non-negative floats order as their bit patterns.
inline float CapNonNegative(float a, float cap) {
  return std::bit_cast<float>(std::min(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(cap)));
}

// exp(hi + lo) for -174 <= hi + lo <= 0 (or NaN: NaN), given as a sum so that -x^2/2 can be
// passed exactly; lo must be small (|lo| <= |hi| / 512). Relative error <= 2 ulp on the normal
// range; results below 2^-126 are subnormal (one rounding), below 2^-150 zero.
//
// exp(a) = 2^n exp(r) with n = round(a / ln 2) and r = a - n ln 2 in [-ln2/2, ln2/2]; ln 2 is
// split in two (Cody and Waite) so that n * kLn2Hi is exact, and exp(r) = 1 + r + r^2 q(r) with
// q a degree-4 minimax fit of ours (relative error of exp(r) <= 4.8e-9 with these fp32
// coefficients).
inline float ExpNonPositive(float hi, float lo) {
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2Hi = 0.693359375f;     // 355/512: 9 significant bits
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
  constexpr float kRound = 0x1.8p23f;        // v + kRound rounds |v| < 2^22 to an integer
  const float shifted = (hi + lo) * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = ((hi - n * kLn2Hi) - n * kLn2Lo) + lo;
  const float q = 4.999999404e-01f +
                  r * (1.666651517e-01f +
                       r * (4.166845605e-02f + r * (8.369412273e-03f + r * 1.381316222e-03f)));
  const float exp_r = 1.0f + r + r * r * q;
  // 2^n as two normal powers of two (n >= -251): exact while the result is normal, one rounding
  // into the subnormals otherwise. The integer n sits in shifted's low bits.
  const int32_t n_int =
      static_cast<int32_t>(std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRound));
  const int32_t n_half = n_int >> 1;
  const auto power_of_two = [](int32_t e) {
    return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23);
  };
  return exp_r * power_of_two(n_half) * power_of_two(n_int - n_half);
}

// exp(-x^2 / 2), relative error <= 2 ulp: x^2 is split into the exact square of x's leading 12
// bits and a small remainder, so rounding x^2 costs no accuracy (in fp32 it would: at x = 5 the
// rounded -x^2/2 puts exp off by up to 12.5 ulp). |x| is capped at 16, where the result is 0
// already (and inf - inf is avoided); NaN gives 0 (the callers propagate x's NaN themselves).
inline float ExpMinusHalfSquare(float x) {
  const float a = CapNonNegative(std::abs(x), 16.0f);
  const float lead = std::bit_cast<float>(std::bit_cast<uint32_t>(a) & 0xFFFFF000u);
  const float rest = a - lead;  // exact; |rest| < 2^-11 a
  return ExpNonPositive(-0.5f * lead * lead, -0.5f * rest * (a + lead));
}

// The normal distribution's lower tail Phi(-a) for a = |x| >= 0, given e = exp(-a^2 / 2):
// Phi(-a) = t R(t) e with t = 1 / (1 + kScale a) in (0, 1] and R a degree-10 polynomial fit of
// ours (minimax relative over all a >= 0: 2.3e-8 with these fp32 coefficients; t R(t) as
// evaluated is within 3.4 ulp). One formula covers a = 0 (t = 1) to infinity (t = 0, where R
// tends to kScale / sqrt(2 pi)), so there is no branch and the tail keeps its relative accuracy
// (1 + erf(x / sqrt 2) loses it to cancellation). NaN gives NaN.
inline float NormalTail(float a, float e) {
  constexpr float kScale = 0.28125f;  // exact in fp32
  constexpr float kR[] = {
      -1.466748770e-02f, 7.187873870e-02f, -1.242017224e-01f, 7.779800147e-02f,
      -2.821167000e-02f, 4.472427070e-02f, 5.919459090e-02f,  8.576237410e-02f,
      1.033176854e-01f,  1.122027040e-01f, 1.122025177e-01f};  // highest degree first
  const float t = 1.0f / (1.0f + kScale * a);
  float r = 0.0f;
  for (float c : kR) r = r * t + c;
  return t * r * e;
}

// Phi(x) = 0.5 erfc(-x / sqrt 2), given e = exp(-x^2 / 2). Measured over a 2^-16 grid of
// [-14, 8] against erfc in double: relative error <= 5.5 ulp for x <= 0 and absolute error
// <= 3 * 2^-24 for x > 0 (isa_elementwise_test checks x Phi(x) and its derivative).
inline float NormalCdf(float x, float e) {
  const float tail = NormalTail(std::abs(x), e);
  return Select(MaskIf(x > 0.0f), 1.0f - tail, tail);
}

// sigmoid(2u) = (1 + tanh u) / 2 and 1 - sigmoid(2u) from q = exp(-2|u|) in [0, 1], which
// cannot overflow: for u >= 0 they are 1 / (1 + q) and q / (1 + q), mirrored for u < 0. 2|u| is
// capped at 104, where q is 0 already.
struct Sigmoid {
  float s, one_minus_s;
};
inline Sigmoid SigmoidOfTwice(float u) {
  const float q = ExpNonPositive(-CapNonNegative(2.0f * std::abs(u), 104.0f), 0.0f);
  const float r = 1.0f / (1.0f + q);
  const float qr = q * r;
  const uint32_t positive = MaskIf(u >= 0.0f);
  return {Select(positive, r, qr), Select(positive, qr, r)};
}

inline float GeluTanhInner(float x) { return kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x); }

// ---- Activations (ops::Activation) -------------------------------------------------------------

void GeluForward(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * NormalCdf(v, ExpMinusHalfSquare(v));
  }
}

// d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi).
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float e = ExpMinusHalfSquare(v);
    dx[i] = dy[i] * (NormalCdf(v, e) + v * (kInvSqrt2Pi * e));
  }
}

void GeluValueAndDerivative(const float* x, float* y, float* dydx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float e = ExpMinusHalfSquare(v);
    const float cdf = NormalCdf(v, e);
    y[i] = v * cdf;
    dydx[i] = cdf + v * (kInvSqrt2Pi * e);
  }
}

// 0.5 x (1 + tanh u) = x sigmoid(2u).
void GeluTanhForward(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * SigmoidOfTwice(GeluTanhInner(v)).s;
  }
}

// d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'(x), where
// 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s) with s = sigmoid(2u); 1 - s is computed
// directly, so there is no cancellation for large u.
void GeluTanhBackward(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const Sigmoid sig = SigmoidOfTwice(GeluTanhInner(v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * v * v);
    dx[i] = dy[i] * (sig.s + 2.0f * v * sig.s * sig.one_minus_s * dinner);
  }
}

void GeluTanhValueAndDerivative(const float* x, float* y, float* dydx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const Sigmoid sig = SigmoidOfTwice(GeluTanhInner(v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * v * v);
    y[i] = v * sig.s;
    dydx[i] = sig.s + 2.0f * v * sig.s * sig.one_minus_s * dinner;
  }
}

// x for x > 0, else +0 (NaN and -0 included), as `x > 0 ? x : 0`.
inline float PositivePart(float x) { return Select(MaskIf(x > 0.0f), x, 0.0f); }

void ReluSquaredForward(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float positive = PositivePart(x[i]);
    y[i] = positive * positive;
  }
}

void ReluSquaredBackward(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (2.0f * PositivePart(x[i]));
}

void ReluSquaredValueAndDerivative(const float* x, float* y, float* dydx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float positive = PositivePart(x[i]);
    y[i] = positive * positive;
    dydx[i] = 2.0f * positive;
  }
}

// ---- Dropout -----------------------------------------------------------------------------------

// Philox calls per block of a row: 16 groups of 4 columns, one vector of counters at AVX-512.
constexpr int64_t kGroupsPerBlock = 16;
constexpr int64_t kColumnsPerBlock = 4 * kGroupsPerBlock;

// words[4 g + k] = DropoutWords(...)[k] of column group first_group + g, for g < 16. The calls
// are independent, so the loop over g vectorises: the 10 rounds unroll and each round's 32 x 32
// -> 64-bit products become vector multiplies of 16 counters at once.
void PhiloxBlock(PhiloxKey key, uint32_t first_group, uint32_t row, uint32_t head, uint32_t sample,
                 uint32_t* words) {
  for (uint32_t g = 0; g < kGroupsPerBlock; ++g) {
    const PhiloxCounter w = Philox4x32_10({first_group + g, row, head, sample}, key);
    for (int k = 0; k < 4; ++k) words[4 * g + k] = w[k];
  }
}

// Columns [start, start + 64) of the row share one block of words (start is column 0 minus
// first_col & 3, so blocks begin on a group boundary); column c takes words[c - start].
void DropoutRow(const DropoutRowArgs& args, const float* x, float* y, int64_t n) {
  const PhiloxKey key = {args.seed, args.site};
  const auto row = static_cast<uint32_t>(args.row), head = static_cast<uint32_t>(args.head);
  const auto sample = static_cast<uint32_t>(args.sample);
  const auto first_group = static_cast<uint32_t>(args.first_col >> 2);
  const int64_t first_start = -static_cast<int64_t>(args.first_col & 3);
  uint32_t words[kColumnsPerBlock];
  for (int64_t start = first_start; start < n; start += kColumnsPerBlock) {
    const auto block = static_cast<uint32_t>((start - first_start) / kColumnsPerBlock);
    PhiloxBlock(key, first_group + block * kGroupsPerBlock, row, head, sample, words);
    const int64_t end = std::min(start + kColumnsPerBlock, n);
    for (int64_t c = std::max<int64_t>(start, 0); c < end; ++c) {
      const uint32_t keep = MaskIf(words[c - start] >= args.threshold);
      y[c] = Select(keep, x[c] * args.keep_scale, 0.0f);
    }
  }
}

// ---- Bias, scaling, BLAS-1 ---------------------------------------------------------------------

void AddBias(float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void SumRows(const float* dy, int64_t rows, int64_t cols, int64_t stride, double* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * stride;
    for (int64_t c = 0; c < cols; ++c) sums[c] += static_cast<double>(row[c]);
  }
}

void SumRowsProduct(const float* a, const float* b, int64_t rows, int64_t cols, int64_t stride,
                    double* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row_a = a + r * stride;
    const float* row_b = b + r * stride;
    for (int64_t c = 0; c < cols; ++c) {
      sums[c] += static_cast<double>(row_a[c]) * static_cast<double>(row_b[c]);
    }
  }
}

void ScaleColumns(const float* x, const float* scale, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * scale[c];
  }
}

void Scale(const float* x, float alpha, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// A dropout mask applied again from the multipliers dropout_row gave a row of ones: kept
// elements times keep_scale, dropped ones +0, as dropout_row itself computes them.
void ApplyDropoutMultipliers(const float* multipliers, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = Select(MaskIf(multipliers[i] != 0.0f), x[i] * multipliers[i], 0.0f);
  }
}

}  // namespace

const ElementwiseKernels kElementwiseKernels = {
    .add_bias = AddBias,
    .sum_rows = SumRows,
    .sum_rows_product = SumRowsProduct,
    .scale_columns = ScaleColumns,
    .scale = Scale,
    .axpy = Axpy,
    .gelu = {GeluForward, GeluBackward, GeluValueAndDerivative},
    .gelu_tanh = {GeluTanhForward, GeluTanhBackward, GeluTanhValueAndDerivative},
    .relu_squared = {ReluSquaredForward, ReluSquaredBackward, ReluSquaredValueAndDerivative},
    .dropout_row = DropoutRow,
    .apply_dropout_multipliers = ApplyDropoutMultipliers,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
