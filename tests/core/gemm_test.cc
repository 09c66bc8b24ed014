// ops::Gemm against a float64 reference written here: every transpose combination, alpha and
// beta, strided batches and shared 2-D operands, fp32/fp16/bf16 operands with fp32 or
// input-dtype C, odd and degenerate sizes, and argument validation.
//
// Tolerances. The kernel multiplies and accumulates in fp32 (u = 2^-24), in an order we do not
// know (OpenBLAS blocks and may fuse multiply-adds). For any order, a dot product of length K
// plus the alpha scaling and the beta term has a rounding error of at most
//   gamma * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|),   gamma = (K + 2) u
// (Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5, first order), so the
// reference is checked per element against that bound, computed from the same inputs. When C is
// fp16 or bf16 the one final rounding adds half an ulp: 2^-11 (fp16) or 2^-8 (bf16) relative, and
// 2^-25 absolute for fp16's subnormal range. The inputs the reference sees are the values after
// rounding to the operand dtype (what the kernel reads), so no input-rounding error is tolerated.
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Half an ulp, relative, of a result stored in `dtype`, and the absolute floor of its subnormals.
double OutputRelativeRounding(DType dtype) {
  return dtype == DType::kF16 ? 0x1p-11 : dtype == DType::kBF16 ? 0x1p-8 : 0.0;
}
double OutputAbsoluteRounding(DType dtype) { return dtype == DType::kF16 ? 0x1p-25 : 0.0; }

struct GemmCase {
  int64_t batch = 0;  // 0: every operand 2-D; else C is [batch, M, N]
  int64_t m = 1, n = 1, k = 1;
  bool trans_a = false, trans_b = false;
  bool a_shared = false, b_shared = false;  // with batch > 0: this operand is 2-D (stride 0)
  DType ab = DType::kF32;
  DType c = DType::kF32;
  float alpha = 1.0f;
  float beta = 0.0f;

  std::string Name() const {
    return absl::StrCat("batch=", batch, " m=", m, " n=", n, " k=", k, " trans_a=", trans_a,
                        " trans_b=", trans_b, " a_shared=", a_shared, " b_shared=", b_shared,
                        " ab=", DTypeName(ab), " c=", DTypeName(c), " alpha=", alpha,
                        " beta=", beta);
  }
};

// The expected C and a rigorous per-element error bound for it.
struct Expected {
  std::vector<double> value;
  std::vector<double> bound;
};

// C = alpha op(A) op(B) + beta C in double. a, b hold `a_batches` / `b_batches` stored matrices
// (1 when shared); c0 holds the initial C (ignored when beta == 0, as BLAS does).
Expected ReferenceGemm(const GemmCase& gc, const std::vector<double>& a,
                       const std::vector<double>& b, const std::vector<double>& c0) {
  const int64_t batches = std::max<int64_t>(1, gc.batch);
  const int64_t a_stride = (gc.batch > 0 && !gc.a_shared) ? gc.m * gc.k : 0;
  const int64_t b_stride = (gc.batch > 0 && !gc.b_shared) ? gc.k * gc.n : 0;
  const double gamma = static_cast<double>(gc.k + 2) * kU32;
  const double rel_out = OutputRelativeRounding(gc.c), abs_out = OutputAbsoluteRounding(gc.c);
  Expected out{std::vector<double>(batches * gc.m * gc.n),
               std::vector<double>(batches * gc.m * gc.n)};
  for (int64_t p = 0; p < batches; ++p) {
    for (int64_t i = 0; i < gc.m; ++i) {
      for (int64_t j = 0; j < gc.n; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (int64_t l = 0; l < gc.k; ++l) {
          const double av = a[p * a_stride + (gc.trans_a ? l * gc.m + i : i * gc.k + l)];
          const double bv = b[p * b_stride + (gc.trans_b ? j * gc.k + l : l * gc.n + j)];
          sum += av * bv;
          magnitude += std::abs(av * bv);
        }
        const int64_t idx = (p * gc.m + i) * gc.n + j;
        const double c_term = gc.beta == 0.0f ? 0.0 : gc.beta * c0[idx];
        const double value = gc.alpha * sum + c_term;
        const double fp32_error = gamma * (std::abs(gc.alpha) * magnitude + std::abs(c_term));
        out.value[idx] = value;
        out.bound[idx] = fp32_error + rel_out * (std::abs(value) + fp32_error) + abs_out;
      }
    }
  }
  return out;
}

void ExpectWithinBound(const std::vector<double>& actual, const Expected& expected,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.value.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    // Failing on the first bad element keeps the output short; NaN fails the comparison.
    ASSERT_LE(std::abs(actual[i] - expected.value[i]), expected.bound[i])
        << what << ": element " << i << " is " << actual[i] << ", expected " << expected.value[i];
  }
}

Shape OperandShape(int64_t batch, bool shared, int64_t rows, int64_t cols) {
  if (batch > 0 && !shared) return {batch, rows, cols};
  return {rows, cols};
}

// Runs one case on random inputs and checks it. C starts random, or filled with c_init_fill
// when use_c_init_fill (e.g. NaN, to check that beta = 0 never reads it).
void CheckGemm(const GemmCase& gc, uint32_t seed, float c_init_fill = 0.0f,
               bool use_c_init_fill = false) {
  SCOPED_TRACE(gc.Name());
  const Shape a_shape = gc.trans_a ? OperandShape(gc.batch, gc.a_shared, gc.k, gc.m)
                                   : OperandShape(gc.batch, gc.a_shared, gc.m, gc.k);
  const Shape b_shape = gc.trans_b ? OperandShape(gc.batch, gc.b_shared, gc.n, gc.k)
                                   : OperandShape(gc.batch, gc.b_shared, gc.k, gc.n);
  const Shape c_shape = gc.batch > 0 ? Shape{gc.batch, gc.m, gc.n} : Shape{gc.m, gc.n};
  const std::vector<float> a_values = RandomFloats(NumElements(a_shape), seed);
  const std::vector<float> b_values = RandomFloats(NumElements(b_shape), seed + 1);
  std::vector<float> c_values = RandomFloats(NumElements(c_shape), seed + 2, -2.0f, 2.0f);
  if (use_c_init_fill) c_values.assign(c_values.size(), c_init_fill);

  const Tensor a = MakeTensor(gc.ab, a_shape, a_values);
  const Tensor b = MakeTensor(gc.ab, b_shape, b_values);
  const Tensor c = MakeTensor(gc.c, c_shape, c_values);
  const Expected expected = ReferenceGemm(gc, Rounded(gc.ab, a_values), Rounded(gc.ab, b_values),
                                          Rounded(gc.c, c_values));
  NF_ASSERT_OK(ops::Gemm({a, b, c, gc.trans_a, gc.trans_b, gc.alpha, gc.beta}));
  ExpectWithinBound(ToDoubles(c), expected, "C");
}

class GemmTransposeTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmTransposeTest, MatchesReferenceOnOddSizes) {
  const auto [trans_a, trans_b] = GetParam();
  // (m, n, k): ones, odd sizes around SIMD widths, and non-square in every direction.
  const int64_t sizes[][3] = {{1, 1, 1},   {1, 17, 3},  {3, 1, 17},   {17, 33, 1},
                              {33, 17, 3}, {3, 33, 33}, {33, 33, 17}, {65, 3, 31}};
  uint32_t seed = 10;
  for (const auto& s : sizes) {
    GemmCase gc;
    gc.m = s[0];
    gc.n = s[1];
    gc.k = s[2];
    gc.trans_a = trans_a;
    gc.trans_b = trans_b;
    gc.alpha = 1.5f;
    gc.beta = -0.75f;
    CheckGemm(gc, seed += 3);
  }
}

TEST_P(GemmTransposeTest, BatchedAndSharedOperands) {
  const auto [trans_a, trans_b] = GetParam();
  uint32_t seed = 100;
  // Every batch is distinct data, so a wrong batch stride (or none) changes the result.
  for (const auto& [a_shared, b_shared] :
       {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
    GemmCase gc;
    gc.batch = 3;
    gc.m = 5;
    gc.n = 7;
    gc.k = 9;
    gc.trans_a = trans_a;
    gc.trans_b = trans_b;
    gc.a_shared = a_shared;
    gc.b_shared = b_shared;
    gc.alpha = 0.5f;
    gc.beta = 1.0f;
    CheckGemm(gc, seed += 3);
  }
}

TEST_P(GemmTransposeTest, TilesAndKChunks) {
  // Shapes the CPU kernel cuts into row and column blocks with short last ones, or into K
  // chunks added afterwards (core/cpu/gemm_partition.h), one of them batched: alpha must scale
  // every chunk and beta apply once.
  const auto [trans_a, trans_b] = GetParam();
  uint32_t seed = 200;
  for (const auto& [batch, m, n, k] :
       {std::array<int64_t, 4>{0, 300, 250, 150}, {0, 70, 130, 3000}, {2, 40, 70, 4100}}) {
    GemmCase gc;
    gc.batch = batch;
    gc.m = m;
    gc.n = n;
    gc.k = k;
    gc.trans_a = trans_a;
    gc.trans_b = trans_b;
    gc.alpha = 1.5f;
    gc.beta = -0.75f;
    CheckGemm(gc, seed += 3);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTransposeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "At" : "A",
                                               std::get<1>(info.param) ? "Bt" : "B");
                         });

TEST(GemmTest, SingleBatchThreeDimensional) {
  // [1, M, K] x [1, K, N] -> [1, M, N], and 2-D A/B into a [1, M, N] C.
  GemmCase gc;
  gc.batch = 1;
  gc.m = 4;
  gc.n = 3;
  gc.k = 5;
  CheckGemm(gc, 7);
  gc.a_shared = gc.b_shared = true;
  CheckGemm(gc, 8);
}

TEST(GemmTest, ReducedPrecisionOperands) {
  uint32_t seed = 200;
  for (DType ab : {DType::kF16, DType::kBF16}) {
    // C in fp32 (weight-gradient accumulation), in the input dtype, and in the other 16-bit type.
    for (DType c : {DType::kF32, ab, ab == DType::kF16 ? DType::kBF16 : DType::kF16}) {
      for (bool trans_a : {false, true}) {
        for (bool trans_b : {false, true}) {
          GemmCase gc;
          gc.m = 17;
          gc.n = 33;
          gc.k = 19;
          gc.trans_a = trans_a;
          gc.trans_b = trans_b;
          gc.ab = ab;
          gc.c = c;
          gc.alpha = 0.75f;
          gc.beta = 0.5f;  // the initial C is read in its dtype, so it is rounded too
          CheckGemm(gc, seed += 3);
          gc.batch = 2;
          gc.b_shared = true;
          gc.beta = 0.0f;
          CheckGemm(gc, seed += 3);
        }
      }
    }
  }
}

// A few rows against a transposed fp16/bf16 B take the CPU's skinny path (decoding: one row per
// sequence; core/cpu/gemm.cc, up to 16 rows), 17 rows the sgemm path: both within the bound, with
// A stored either way, C in fp32 or 16 bits, beta 0 (C poisoned, never read) or not, K from 0
// to past the 32 lanes.
TEST(GemmTest, SkinnyRowsAgainstHalfPrecisionWeights) {
  uint32_t seed = 400;
  for (DType ab : {DType::kF16, DType::kBF16}) {
    for (const int64_t m : {1, 2, 7, 16, 17}) {
      for (const int64_t k : {0, 5, 67}) {
        for (bool trans_a : {false, true}) {
          for (DType c : {DType::kF32, ab}) {
            GemmCase gc;
            gc.m = m;
            gc.n = 37;
            gc.k = k;
            gc.trans_a = trans_a;
            gc.trans_b = true;
            gc.ab = ab;
            gc.c = c;
            gc.alpha = 0.75f;
            gc.beta = 0.5f;
            CheckGemm(gc, seed += 3);
            gc.beta = 0.0f;
            CheckGemm(gc, seed += 3, std::numeric_limits<float>::quiet_NaN(),
                      /*use_c_init_fill=*/true);
          }
        }
      }
    }
  }
}

// A [1, n, k] B beside a 2-D C is the 2-D B (ops::Gemm allows it): the skinny path reads K from
// B's last dimension, bit for bit as with the 2-D B.
TEST(GemmTest, SkinnyPathTakesAThreeDimensionalSingleBatchB) {
  const std::vector<float> a_values = RandomFloats(2 * 24, 31);
  const std::vector<float> b_values = RandomFloats(40 * 24, 32);
  const Tensor a = MakeTensor(DType::kBF16, {2, 24}, a_values);
  const Tensor c2 = MakeZeros(DType::kF32, {2, 40});
  const Tensor c3 = MakeZeros(DType::kF32, {2, 40});
  NF_ASSERT_OK(ops::Gemm(
      {.a = a, .b = MakeTensor(DType::kBF16, {40, 24}, b_values), .c = c2, .trans_b = true}));
  NF_ASSERT_OK(ops::Gemm(
      {.a = a, .b = MakeTensor(DType::kBF16, {1, 40, 24}, b_values), .c = c3, .trans_b = true}));
  EXPECT_EQ(ToDoubles(c3), ToDoubles(c2));
  GemmCase gc;
  gc.m = 2;
  gc.n = 40;
  gc.k = 24;
  gc.trans_b = true;
  gc.ab = DType::kBF16;
  const Expected expected =
      ReferenceGemm(gc, Rounded(DType::kBF16, a_values), Rounded(DType::kBF16, b_values), {});
  ExpectWithinBound(ToDoubles(c3), expected, "C");
}

TEST(GemmTest, ReducedPrecisionOutputIsRoundedToNearest) {
  // 1x1x1 products exact in fp32 that lie 3/4 of an ulp above an fp16 / bf16 number: rounding to
  // nearest must go up one ulp, where truncating the fp32 result would stay below.
  const Tensor b = MakeTensor(DType::kF16, {1, 1}, {1.75f});
  const Tensor a16 = MakeTensor(DType::kF16, {1, 1}, {1.0f + 0x1p-10f});
  // (1 + 2^-10) 1.75 = 1.75 + 7 2^-12; fp16 spacing in [1, 2) is 2^-10 = 4 2^-12: 1.75 ulp
  // above 1.75, so the nearest fp16 is 1.75 + 2 2^-10.
  const Tensor c16 = MakeZeros(DType::kF16, {1, 1});
  NF_ASSERT_OK(ops::Gemm({a16, b, c16}));
  EXPECT_EQ(ToDoubles(c16)[0], 1.75 + 0x1p-9);

  const Tensor b_bf = MakeTensor(DType::kBF16, {1, 1}, {1.75f});
  const Tensor a_bf = MakeTensor(DType::kBF16, {1, 1}, {1.0f + 0x1p-7f});
  // (1 + 2^-7) 1.75 = 1.75 + 7 2^-9; bf16 spacing in [1, 2) is 2^-7 = 4 2^-9: the nearest bf16
  // is 1.75 + 2 2^-7.
  const Tensor c_bf = MakeZeros(DType::kBF16, {1, 1});
  NF_ASSERT_OK(ops::Gemm({a_bf, b_bf, c_bf}));
  EXPECT_EQ(ToDoubles(c_bf)[0], 1.75 + 0x1p-6);
  // With fp32 C the same product is exact.
  const Tensor c32 = MakeZeros(DType::kF32, {1, 1});
  NF_ASSERT_OK(ops::Gemm({a_bf, b_bf, c32}));
  EXPECT_EQ(ToDoubles(c32)[0], 1.75 + 7 * 0x1p-9);
}

TEST(GemmTest, BetaZeroIgnoresNonFiniteC) {
  // BLAS semantics: with beta = 0, C is written, never read, so NaN or inf already in C (fresh,
  // uninitialised buffers) must not leak into the result (0 * NaN would be NaN).
  uint32_t seed = 300;
  for (DType c_dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (float poison :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      GemmCase gc;
      gc.m = 9;
      gc.n = 5;
      gc.k = 7;
      gc.c = c_dtype;
      gc.alpha = 2.0f;
      gc.beta = 0.0f;
      CheckGemm(gc, seed += 3, poison, /*use_c_init_fill=*/true);
      gc.batch = 2;
      gc.a_shared = true;
      gc.trans_b = true;
      CheckGemm(gc, seed += 3, poison, /*use_c_init_fill=*/true);
      gc.k = 0;  // the K = 0 path too: C = 0 * C = 0
      CheckGemm(gc, seed += 3, poison, /*use_c_init_fill=*/true);
    }
  }
}

TEST(GemmTest, BetaOneAccumulatesIntoFp32) {
  // Two micro-batches of a bf16 weight gradient dW = X^T dY accumulated into one fp32 main grad.
  const int64_t tokens = 13, in = 6, out = 5;
  const std::vector<float> x0 = RandomFloats(tokens * in, 1), dy0 = RandomFloats(tokens * out, 2);
  const std::vector<float> x1 = RandomFloats(tokens * in, 3), dy1 = RandomFloats(tokens * out, 4);
  const std::vector<float> start = RandomFloats(in * out, 5);
  const Tensor grad = MakeTensor(DType::kF32, {in, out}, start);
  for (const auto* pair : {&x0, &x1}) {
    const std::vector<float>& x = *pair;
    const std::vector<float>& dy = pair == &x0 ? dy0 : dy1;
    NF_ASSERT_OK(ops::Gemm({MakeTensor(DType::kBF16, {tokens, in}, x),
                            MakeTensor(DType::kBF16, {tokens, out}, dy), grad,
                            /*trans_a=*/true, /*trans_b=*/false, 1.0f, 1.0f}));
  }
  const std::vector<double> rx0 = Rounded(DType::kBF16, x0), rdy0 = Rounded(DType::kBF16, dy0);
  const std::vector<double> rx1 = Rounded(DType::kBF16, x1), rdy1 = Rounded(DType::kBF16, dy1);
  const std::vector<double> actual = ToDoubles(grad);
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double expected = start[i * out + j], magnitude = std::abs(expected);
      for (int64_t t = 0; t < tokens; ++t) {
        const double p0 = rx0[t * in + i] * rdy0[t * out + j];
        const double p1 = rx1[t * in + i] * rdy1[t * out + j];
        expected += p0 + p1;
        magnitude += std::abs(p0) + std::abs(p1);
      }
      // Two fp32 GEMMs chained through fp32 C: at most gamma = (2 tokens + 4) u relative to the
      // sum of magnitudes (each call: tokens products, the alpha scaling and the beta add).
      EXPECT_NEAR(actual[i * out + j], expected, (2 * tokens + 4) * kU32 * magnitude)
          << "(" << i << ", " << j << ")";
    }
  }
}

TEST(GemmTest, BetaScalesAndAlphaZeroKeepsBetaC) {
  GemmCase gc;
  gc.m = 3;
  gc.n = 4;
  gc.k = 5;
  gc.alpha = 0.0f;
  gc.beta = 3.0f;
  CheckGemm(gc, 400);  // C = 3 C exactly up to one rounding
  gc.alpha = -1.0f;
  gc.beta = 1.0f;
  CheckGemm(gc, 401);
}

TEST(GemmTest, ZeroInnerDimensionScalesC) {
  // K = 0: op(A) op(B) is an empty sum, so C = beta * C; with beta = 0, C = 0.
  uint32_t seed = 500;
  for (DType c_dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool trans_a : {false, true}) {
      for (float beta : {0.0f, 1.0f, -2.5f}) {
        GemmCase gc;
        gc.m = 3;
        gc.n = 5;
        gc.k = 0;
        gc.trans_a = trans_a;
        gc.trans_b = !trans_a;
        gc.c = c_dtype;
        gc.beta = beta;
        CheckGemm(gc, seed += 3);
        gc.batch = 2;
        CheckGemm(gc, seed += 3);
      }
    }
  }
}

TEST(GemmTest, EmptyOutputsAreNoOps) {
  // M = 0 or N = 0: nothing to write. The operands are views into the middle of larger buffers so
  // AddressSanitizer or the sentinels catch a kernel that touches memory anyway.
  const Tensor c_storage = MakeTensor(DType::kF32, {8}, std::vector<float>(8, 42.0f));
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> sizes = {
      {0, 4, 3}, {4, 0, 3}, {0, 0, 3}, {0, 4, 0}};
  for (const auto& [m, n, k] : sizes) {
    SCOPED_TRACE(absl::StrCat("m=", m, " n=", n, " k=", k));
    const Tensor a = MakeTensor(DType::kF32, {m, k}, RandomFloats(m * k, 1));
    const Tensor b = MakeTensor(DType::kF32, {k, n}, RandomFloats(k * n, 2));
    const Tensor c = *c_storage.View(4, {m, n});
    NF_ASSERT_OK(ops::Gemm({a, b, c, false, false, 1.0f, 1.0f}));
    for (double v : ToDoubles(c_storage)) ASSERT_EQ(v, 42.0);
  }
  // An empty batch, with 3-D and with shared 2-D operands.
  const Tensor a3 = MakeZeros(DType::kF16, {0, 3, 2});
  const Tensor b3 = MakeZeros(DType::kF16, {0, 2, 4});
  const Tensor b2 = MakeZeros(DType::kF16, {2, 4});
  const Tensor c3 = MakeZeros(DType::kF16, {0, 3, 4});
  NF_EXPECT_OK(ops::Gemm({a3, b3, c3}));
  NF_EXPECT_OK(ops::Gemm({a3, b2, c3}));
}

TEST(GemmTest, WritesOnlyItsViewOfAFlatBuffer) {
  // Main grads are views of one flat fp32 buffer: a GEMM into one view must leave its
  // neighbours alone and read/write at the view's offset.
  const int64_t m = 3, n = 5, k = 4;
  std::vector<float> flat = RandomFloats(2 + m * n + 3, 9);
  const Tensor storage = MakeTensor(DType::kF32, {static_cast<int64_t>(flat.size())}, flat);
  const Tensor c = *storage.View(2, {m, n});
  const std::vector<float> a = RandomFloats(m * k, 10), b = RandomFloats(k * n, 11);
  NF_ASSERT_OK(ops::Gemm({MakeTensor(DType::kF32, {m, k}, a), MakeTensor(DType::kF32, {k, n}, b), c,
                          false, false, 1.0f, 1.0f}));
  const std::vector<double> after = ToDoubles(storage);
  for (size_t i = 0; i < flat.size(); ++i) {
    if (i >= 2 && i < static_cast<size_t>(2 + m * n)) {
      const int64_t row = (i - 2) / n, col = (i - 2) % n;
      double expected = flat[i], magnitude = std::abs(expected);
      for (int64_t l = 0; l < k; ++l) {
        expected += static_cast<double>(a[row * k + l]) * b[l * n + col];
        magnitude += std::abs(static_cast<double>(a[row * k + l]) * b[l * n + col]);
      }
      EXPECT_NEAR(after[i], expected, (k + 2) * kU32 * magnitude) << i;  // gamma bound
    } else {
      EXPECT_EQ(after[i], flat[i]) << "neighbour " << i << " was written";
    }
  }
}

// ---- Validation --------------------------------------------------------------------------------

void ExpectGemmError(const ops::GemmArgs& args, const std::string& mentions) {
  const absl::Status status = ops::Gemm(args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("Gemm: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr(mentions));
}

TEST(GemmTest, RejectsInconsistentShapes) {
  const Tensor a = MakeZeros(DType::kF32, {3, 4});
  const Tensor b = MakeZeros(DType::kF32, {4, 5});
  const Tensor c = MakeZeros(DType::kF32, {3, 5});
  NF_ASSERT_OK(ops::Gemm({a, b, c}));  // the consistent baseline
  // Mismatched K, with and without transposes.
  ExpectGemmError({a, MakeZeros(DType::kF32, {5, 5}), c}, "shapes do not multiply");
  ExpectGemmError({a, b, c, /*trans_a=*/true}, "(transposed)");
  ExpectGemmError({a, b, c, false, /*trans_b=*/true}, "shapes do not multiply");
  // C of the wrong shape.
  ExpectGemmError({a, b, MakeZeros(DType::kF32, {5, 3})}, "into C f32[5, 3]");
  ExpectGemmError({a, b, MakeZeros(DType::kF32, {3, 6})}, "shapes do not multiply");
  // Batches that disagree, and a batched product into a 2-D C.
  const Tensor a2 = MakeZeros(DType::kF32, {2, 3, 4});
  const Tensor b3 = MakeZeros(DType::kF32, {3, 4, 5});
  ExpectGemmError({a2, b3, MakeZeros(DType::kF32, {3, 3, 5})}, "shapes do not multiply");
  ExpectGemmError({a2, b, c}, "shapes do not multiply");
  ExpectGemmError({a, b, MakeZeros(DType::kF32, {2, 3, 5})}, "shapes do not multiply");
  // Ranks other than 2 and 3.
  ExpectGemmError({MakeZeros(DType::kF32, {12}), b, c}, "A is f32[12] on cpu");
  ExpectGemmError({a, MakeZeros(DType::kF32, {1, 1, 4, 5}), c}, "B is f32[1, 1, 4, 5]");
  ExpectGemmError({a, b, MakeZeros(DType::kF32, {15})}, "C is f32[15]");
}

TEST(GemmTest, RejectsBadDTypes) {
  const Tensor a = MakeZeros(DType::kF32, {3, 4});
  const Tensor b = MakeZeros(DType::kF32, {4, 5});
  const Tensor c = MakeZeros(DType::kF32, {3, 5});
  // Mixed A/B dtypes, both ways round.
  ExpectGemmError({a, MakeZeros(DType::kF16, {4, 5}), c},
                  "B is f16[4, 5] on cpu, expected dtype f32");
  ExpectGemmError({MakeZeros(DType::kBF16, {3, 4}), MakeZeros(DType::kF16, {4, 5}), c},
                  "B is f16[4, 5]");
  // Integer tensors in every position.
  ExpectGemmError({MakeZeros(DType::kI32, {3, 4}), b, c}, "A is i32[3, 4]");
  ExpectGemmError({a, MakeZeros(DType::kI64, {4, 5}), c}, "B is i64[4, 5]");
  ExpectGemmError({a, b, MakeZeros(DType::kU8, {3, 5})}, "C is u8[3, 5]");
  ExpectGemmError({MakeZeros(DType::kU16, {3, 4}), MakeZeros(DType::kU16, {4, 5}), c},
                  "A is u16[3, 4]");
  // A missing tensor.
  ExpectGemmError({a, Tensor(), c}, "B is missing");
}

TEST(GemmTest, RejectionLeavesCUntouched) {
  const Tensor c = MakeTensor(DType::kF32, {2, 2}, {1, 2, 3, 4});
  EXPECT_FALSE(ops::Gemm({MakeZeros(DType::kF32, {2, 3}), MakeZeros(DType::kF32, {2, 2}), c}).ok());
  EXPECT_EQ(ToDoubles(c), (std::vector<double>{1, 2, 3, 4}));
}

// A bias is the product then AddBias, bit for bit, in every dtype; it must be [n] in C's dtype
// and needs a 2-D product.
TEST(GemmTest, BiasIsAddedToEveryRowAfterTheProduct) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor a = MakeTensor(dtype, {7, 12}, RandomFloats(84, 71));
    const Tensor b = MakeTensor(dtype, {9, 12}, RandomFloats(108, 72));
    const Tensor bias = MakeTensor(dtype, {9}, RandomFloats(9, 73));
    const std::vector<float> c0 = RandomFloats(63, 74);
    const Tensor fused = MakeTensor(dtype, {7, 9}, c0), separate = MakeTensor(dtype, {7, 9}, c0);
    NF_ASSERT_OK(
        ops::Gemm({.a = a, .b = b, .c = fused, .trans_b = true, .beta = 1.0f, .bias = bias}));
    NF_ASSERT_OK(ops::Gemm({.a = a, .b = b, .c = separate, .trans_b = true, .beta = 1.0f}));
    NF_ASSERT_OK(ops::AddBias(separate, bias));
    EXPECT_EQ(ToDoubles(fused), ToDoubles(separate)) << DTypeName(dtype);
  }
  const Tensor a = MakeZeros(DType::kF32, {2, 3}), b = MakeZeros(DType::kF32, {3, 4});
  const Tensor c = MakeZeros(DType::kF32, {2, 4});
  const absl::Status wrong_size =
      ops::Gemm({.a = a, .b = b, .c = c, .bias = MakeZeros(DType::kF32, {3})});
  EXPECT_EQ(wrong_size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_size.message(), HasSubstr("bias"));
  const absl::Status wrong_dtype =
      ops::Gemm({.a = a, .b = b, .c = c, .bias = MakeZeros(DType::kF16, {4})});
  EXPECT_EQ(wrong_dtype.code(), absl::StatusCode::kInvalidArgument);
  const absl::Status batched = ops::Gemm({.a = MakeZeros(DType::kF32, {2, 2, 3}),
                                          .b = b,
                                          .c = MakeZeros(DType::kF32, {2, 2, 4}),
                                          .bias = MakeZeros(DType::kF32, {4})});
  EXPECT_EQ(batched.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batched.message(), HasSubstr("a bias needs a 2-D product"));
}

}  // namespace
}  // namespace nf
