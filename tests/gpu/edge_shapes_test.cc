// Every op of the CUDA backend against its CPU twin, fp32, fp16 and bf16 where the op takes them,
// at the edges of its shapes: odd widths (1, 31, 33 and 257 columns: a lone column, one lane
// short of and one past a warp, one past a 256-thread block), heads 1 and 25, sequence length
// 1, head_dim 1 and 128 (the own attention kernel's maximum; 129 is refused), a vocabulary of
// 1001 (not a multiple of 8) split into slices with padding (ids and targets just past it are
// reported as the CPU reports them), fp32 parameters and scales next to 16-bit activations,
// dropout's largest p, zero-sized dimensions (an empty GEMM product, no rows, no tokens), and the
// launch limits of core/cuda's grids:
//   - the row kernels (LayerNorm, softmax, cross-entropy, the fused rows) put one row per block
//     on gridDim.x (up to 2^31 - 1): LayerNorm runs 65537 rows to show rows past 65535 are fine;
//   - the attention kernels put batch * heads on gridDim.y (at most 65535): 65535 pairs run and
//     match the CPU, 65536 are refused with an InvalidArgument naming the limit (the CPU has no
//     such limit), for the causal kernels and the KV-cache kernel;
//   - the KV-cache kernel keeps dim + past + new floats in shared memory next to 128 bytes of
//     static scratch: 12256 floats fill the 48 KiB exactly and run, one more is refused;
//   - the column sums (bias, LayerNorm and scale gradients) tile rows into at most 1024 chunks
//     on gridDim.y: 65 rows make a second chunk of one row, 65537 rows 1009 chunks;
//   - SquaredNorm's first pass is at most 1024 blocks: 1024 * 256 + 1 elements wrap its
//     grid-stride loop.
// The grid-stride elementwise kernels clamp their grids at 65536 blocks of 256 threads; a tensor
// past 2^24 elements would wrap them but costs ~17 s per launch on the emulated GPU (one fiber per
// thread), so the wrap is shown by SquaredNorm's smaller grid instead. The whole program takes
// ~25 s of CPU time on the emulated GPU, most of it the 65535-pair and 65537-row launches.
//
// Tolerances are cuda_ops_test.cc's (relative to the CPU result's largest magnitude,
// ExpectTwinClose): kElementwise = 4 u32 for one rounded function evaluation per element,
// kReduction = 2e-5 for sums in another order, plus 2 u(dtype) for results stored in fp16/bf16
// (Tol); SquaredNorm 1e-6 (both sum in double); masks, permutations, copies and maxima are
// identical bit for bit. The fused ops follow fused_kernels_test.cc: fp32 outputs kReduction,
// 16-bit outputs and the branch LayerNorm's parameter gradients (sums of a 16-bit dz)
// Tol(dtype, kReduction). Results whose terms cancel to 0 at these shapes (a LayerNorm over one
// column, attention over one key, GELU near its zeros) take the same tolerances relative to the
// size of their terms instead (ExpectCloseToTerms).
//
// Attention runs the project's own kernels (NF_ATTENTION=own for the attention tests): their
// grids are attention.cu's, and cuDNN's masks under dropout are not the CPU's
// (cudnn_attention_test.cc tests cuDNN's path).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using testing::ScopedAttentionPolicy;

using testing::ExpectTwinClose;
using testing::ExpectTwinIdentical;
using testing::kElementwise;
using testing::kGpu;
using testing::kReduction;
using testing::MakeIds;
using testing::MakeTwin;
using testing::OnBoth;
using testing::RandomTwin;
using testing::Tol;
using testing::Twin;
using testing::UnitRoundoff;
using testing::ZerosTwin;

// A lone column, one lane short of a warp, one past it, one past a 256-thread block.
constexpr int64_t kOddWidths[] = {1, 31, 33, 257};

// CUDA's limit on gridDim.y and gridDim.z (attention.cu's kMaxGridY).
constexpr int64_t kMaxGridY = 65535;

// ExpectTwinClose where the result may be 0 in exact arithmetic: the tolerance is relative to
// the larger of the CPU result's largest magnitude and `terms`, the magnitude of the terms it is
// computed from (the input gradient of a LayerNorm over one column, whose rstd is
// 1/sqrt(eps) = 316; attention's dq and dk over a single key; a GELU derivative next to its
// zero). Where nothing cancels, `terms` is of the result's own magnitude.
void ExpectCloseToTerms(const Twin& t, double tol, double terms, const std::string& what) {
  ExpectTwinClose(t, tol, what, terms);
}

// The largest magnitude of the CPU side's values.
double MaxAbsOf(const Twin& t) { return testing::MaxAbs(testing::ToDoubles(t.cpu)); }

std::string ShapeName(const Shape& shape) {
  std::string name = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&name, i ? "," : "", shape[i]);
  return name + "]";
}

class EdgeShapesTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { NF_REQUIRE_GPU(); }
  DType dtype() const { return GetParam(); }
};

// ---- GEMM --------------------------------------------------------------------------------------

TEST_P(EdgeShapesTest, GemmAtOddShapes) {
  struct Case {
    int64_t m, k, n;
  };
  // A 1x1x1 product, a row times a matrix, a matrix into one column, every odd size at once.
  for (const Case& s : {Case{1, 1, 1}, Case{1, 257, 33}, Case{33, 31, 1}, Case{31, 33, 257}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(absl::StrCat("m=", s.m, " k=", s.k, " n=", s.n, " trans_a=", trans_a,
                                  " trans_b=", trans_b));
        Twin a = RandomTwin(dtype(), trans_a ? Shape{s.k, s.m} : Shape{s.m, s.k}, 1);
        Twin b = RandomTwin(dtype(), trans_b ? Shape{s.n, s.k} : Shape{s.k, s.n}, 2);
        Twin c = RandomTwin(dtype(), {s.m, s.n}, 3);
        Twin bias = RandomTwin(dtype(), {s.n}, 4);
        OnBoth([&](auto on) {
          return ops::Gemm({.a = on(a),
                            .b = on(b),
                            .c = on(c),
                            .trans_a = trans_a,
                            .trans_b = trans_b,
                            .alpha = 0.5f,
                            .beta = 1.0f,
                            .bias = on(bias)});
        });
        ExpectTwinClose(c, Tol(dtype(), kReduction), "Gemm with bias");
      }
    }
    // 25 products sharing B, into fp32 C accumulating (main grads).
    Twin a = RandomTwin(dtype(), {25, s.m, s.k}, 5);
    Twin b = RandomTwin(dtype(), {s.k, s.n}, 6);
    Twin c = RandomTwin(DType::kF32, {25, s.m, s.n}, 7);
    OnBoth([&](auto on) { return ops::Gemm({on(a), on(b), on(c), false, false, 1.0f, 1.0f}); });
    ExpectTwinClose(c, kReduction, "batched Gemm into fp32");
  }
}

// An empty product (k = 0): C = beta C (+ bias), and with beta = 0 C is not read, as cuBLASLt
// and BLAS do not read it: a C holding NaN (memory not yet written) becomes 0 (+ bias).
TEST_P(EdgeShapesTest, GemmOfAnEmptyProduct) {
  const int64_t m = 3, n = 33;
  for (const float beta : {0.0f, 0.5f}) {
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE(absl::StrCat("beta=", beta, with_bias ? " with bias" : ""));
      Twin a = ZerosTwin(dtype(), {m, 0}), b = ZerosTwin(dtype(), {0, n});
      std::vector<float> c_values = testing::RandomFloats(m * n, 3);
      if (beta == 0.0f) {
        c_values[0] = std::numeric_limits<float>::quiet_NaN();
        c_values[1] = std::numeric_limits<float>::infinity();
      }
      Twin c = MakeTwin(testing::MakeTensor(dtype(), {m, n}, c_values));
      Twin bias = RandomTwin(dtype(), {n}, 4);
      OnBoth([&](auto on) {
        return ops::Gemm({.a = on(a),
                          .b = on(b),
                          .c = on(c),
                          .alpha = 2.0f,
                          .beta = beta,
                          .bias = with_bias ? on(bias) : Tensor()});
      });
      ExpectTwinIdentical(c, "Gemm with k = 0");
    }
  }
}

// ---- Elementwise -------------------------------------------------------------------------------

TEST_P(EdgeShapesTest, BiasAndActivationsAtOddWidths) {
  // One row, and rows enough for the bias gradient's column sums to take a second chunk of one
  // row (chunks of at least 64 rows: 65 rows of one 32-column block are 64 + 1).
  for (const int64_t rows : {int64_t{1}, int64_t{65}}) {
    for (const int64_t cols : kOddWidths) {
      SCOPED_TRACE(absl::StrCat("rows=", rows, " cols=", cols));
      Twin x = RandomTwin(dtype(), {rows, cols}, 7, -3.0f, 3.0f);
      Twin bias = RandomTwin(dtype(), {cols}, 8);
      OnBoth([&](auto on) { return ops::AddBias(on(x), on(bias)); });
      ExpectTwinClose(x, Tol(dtype(), kElementwise), "AddBias");
      Twin bias32 = RandomTwin(DType::kF32, {cols}, 8);  // an fp32 bias on a 16-bit x
      OnBoth([&](auto on) { return ops::AddBias(on(x), on(bias32)); });
      ExpectTwinClose(x, Tol(dtype(), kElementwise), "AddBias of an fp32 bias");
      Twin dbias = RandomTwin(DType::kF32, {cols}, 9);
      OnBoth([&](auto on) { return ops::BiasBackward(on(x), on(dbias)); });
      ExpectTwinClose(dbias, kReduction, "BiasBackward");
      for (ops::Activation act :
           {ops::Activation::kGelu, ops::Activation::kGeluTanh, ops::Activation::kReluSquared}) {
        Twin y = ZerosTwin(dtype(), {rows, cols});
        Twin dy = RandomTwin(dtype(), {rows, cols}, 10);
        Twin dx = ZerosTwin(dtype(), {rows, cols});
        OnBoth([&](auto on) { return ops::ActivationForward(act, on(x), on(y)); });
        OnBoth([&](auto on) { return ops::ActivationBackward(act, on(x), on(dy), on(dx)); });
        // GELU's 0.5 x (1 + erf) and cdf + x pdf cancel near x = -3 and x = -0.75: terms of
        // |x| and |dy| (cdf, |x pdf| <= 1).
        ExpectCloseToTerms(y, Tol(dtype(), kElementwise), MaxAbsOf(x), "ActivationForward");
        ExpectCloseToTerms(dx, Tol(dtype(), kElementwise), MaxAbsOf(dy), "ActivationBackward");
      }
    }
  }
}

TEST_P(EdgeShapesTest, DropoutMasksAtOddWidthsAndOffsets) {
  // Column offsets that put the shard's first and last columns mid-group (groups of 4 global
  // columns per Philox call), samples of one token and of two.
  // p = 0.3, and the largest p below 1 (keep 1 in 2^24, scaled by 2^24).
  for (const float p : {0.3f, std::nextafter(1.0f, 0.0f)}) {
    for (const int64_t cols : kOddWidths) {
      for (const int64_t col_offset : {0, 3, 6}) {
        for (const int64_t seq_len : {1, 2}) {
          SCOPED_TRACE(
              absl::StrCat("p=", p, " cols=", cols, " col_offset=", col_offset, " seq=", seq_len));
          Twin x = RandomTwin(dtype(), {3, cols}, 11);
          Twin y = ZerosTwin(dtype(), {3, cols});
          const ops::DropoutSpec spec{.p = p,
                                      .seed = 17,
                                      .site = 5,
                                      .first_sample = 9,
                                      .seq_len = seq_len,
                                      .token_offset = 1,
                                      .col_offset = col_offset};
          OnBoth([&](auto on) { return ops::Dropout(on(x), on(y), spec); });
          ExpectTwinIdentical(y, "Dropout");
        }
      }
    }
  }
}

TEST_P(EdgeShapesTest, ChannelScalesWithOneAnd25Channels) {
  struct Case {
    int64_t outer, channels, inner;
  };
  // inner 1 takes the column sums for the scale gradient, inner > 1 a block per channel.
  for (const Case& s : {Case{1, 1, 1}, Case{65, 1, 1}, Case{3, 25, 1}, Case{1, 1, 257},
                        Case{2, 25, 33}, Case{1, 257, 1}}) {
    SCOPED_TRACE(absl::StrCat("outer=", s.outer, " channels=", s.channels, " inner=", s.inner));
    const Shape shape{s.outer, s.channels, s.inner};
    Twin x = RandomTwin(dtype(), shape, 12);
    Twin scale = RandomTwin(dtype(), {s.channels}, 13, 0.5f, 1.5f);
    Twin y = ZerosTwin(dtype(), shape);
    Twin dy = RandomTwin(dtype(), shape, 14);
    Twin dx = ZerosTwin(dtype(), shape);
    Twin dscale = RandomTwin(DType::kF32, {s.channels}, 15);
    OnBoth([&](auto on) { return ops::ScaleChannels(on(x), on(scale), s.inner, on(y)); });
    OnBoth([&](auto on) {
      return ops::ScaleChannelsBackward(on(x), on(scale), s.inner, on(dy), on(dx), on(dscale));
    });
    ExpectTwinClose(y, Tol(dtype(), kElementwise), "ScaleChannels");
    ExpectTwinClose(dx, Tol(dtype(), kElementwise), "ScaleChannelsBackward dx");
    ExpectTwinClose(dscale, kReduction, "ScaleChannelsBackward dscale");
    Twin scale32 = RandomTwin(DType::kF32, {s.channels}, 16, 0.5f, 1.5f);  // fp32 scales
    OnBoth([&](auto on) { return ops::ScaleChannels(on(x), on(scale32), s.inner, on(y)); });
    OnBoth([&](auto on) {
      return ops::ScaleChannelsBackward(on(x), on(scale32), s.inner, on(dy), on(dx), on(dscale));
    });
    ExpectTwinClose(y, Tol(dtype(), kElementwise), "ScaleChannels by fp32 scales");
    ExpectTwinClose(dx, Tol(dtype(), kElementwise), "ScaleChannelsBackward dx, fp32 scales");
    ExpectTwinClose(dscale, kReduction, "ScaleChannelsBackward dscale, fp32 scales");
  }
}

// ---- Layout ------------------------------------------------------------------------------------

// [batch, heads, seq, head_dim] shapes with 1 and 25 heads, sequences of 1, odd head sizes.
const Shape kHeadShapes[] = {
    {1, 1, 1, 1}, {2, 25, 1, 33}, {1, 25, 3, 1}, {3, 1, 1, 31}, {1, 1, 5, 257}};

TEST_P(EdgeShapesTest, HeadLayoutsWithOneAnd25Heads) {
  for (const Shape& shape : kHeadShapes) {
    SCOPED_TRACE(ShapeName(shape));
    const int64_t b = shape[0], h = shape[1], s = shape[2], d = shape[3];
    Twin tokens = RandomTwin(dtype(), {b * s, h * d}, 16);
    Twin heads = ZerosTwin(dtype(), shape);
    Twin back = ZerosTwin(dtype(), {b * s, h * d});
    OnBoth([&](auto on) { return ops::SplitHeads(on(tokens), on(heads)); });
    OnBoth([&](auto on) { return ops::MergeHeads(on(heads), on(back)); });
    ExpectTwinIdentical(heads, "SplitHeads");
    ExpectTwinIdentical(back, "MergeHeads");

    // The fused q, k, v side: three groups.
    Twin qkv = RandomTwin(dtype(), {b * s, 3 * h * d}, 17);
    Twin grouped = ZerosTwin(dtype(), {3, b, h, s, d});
    Twin qkv_back = ZerosTwin(dtype(), {b * s, 3 * h * d});
    OnBoth([&](auto on) { return ops::SplitHeads(on(qkv), on(grouped)); });
    OnBoth([&](auto on) { return ops::MergeHeads(on(grouped), on(qkv_back)); });
    ExpectTwinIdentical(grouped, "SplitHeads into groups");
    ExpectTwinIdentical(qkv_back, "MergeHeads from groups");

    // NormFormer's head scale fused with the merge, and its backward; scales of the stream's
    // dtype, then fp32 scales.
    for (const DType scale_dtype : {dtype(), DType::kF32}) {
      Twin scale = RandomTwin(scale_dtype, {h}, 18, 0.5f, 1.5f);
      Twin scaled = ZerosTwin(dtype(), {b * s, h * d});
      Twin d_tokens = RandomTwin(dtype(), {b * s, h * d}, 19);
      Twin d_heads = ZerosTwin(dtype(), shape);
      Twin dscale = RandomTwin(DType::kF32, {h}, 20);
      OnBoth([&](auto on) {
        NF_RETURN_IF_ERROR(ops::MergeScaledHeads(on(heads), on(scale), on(scaled)));
        return ops::MergeScaledHeadsBackward(on(d_tokens), on(heads), on(scale), on(d_heads),
                                             on(dscale));
      });
      ExpectTwinClose(scaled, Tol(dtype(), kElementwise), "MergeScaledHeads");
      ExpectTwinClose(d_heads, Tol(dtype(), kElementwise), "MergeScaledHeadsBackward d_heads");
      ExpectTwinClose(dscale, kReduction, "MergeScaledHeadsBackward dscale");
    }
  }
}

// ---- LayerNorm and the fused rows --------------------------------------------------------------

// Local and tensor-parallel LayerNorm of x [rows, cols], forward and backward, against the CPU.
void CheckLayerNorm(DType dtype, DType param_dtype, int64_t rows, int64_t cols, bool parallel) {
  SCOPED_TRACE(absl::StrCat("rows=", rows, " cols=", cols, " params ", DTypeName(param_dtype)));
  Twin x = RandomTwin(dtype, {rows, cols}, 17, -2.0f, 4.0f);
  Twin w = RandomTwin(param_dtype, {cols}, 18, 0.5f, 1.5f);
  Twin b = RandomTwin(param_dtype, {cols}, 19);
  Twin y = ZerosTwin(dtype, {rows, cols});
  Twin mean = ZerosTwin(DType::kF32, {rows});
  Twin rstd = ZerosTwin(DType::kF32, {rows});
  OnBoth([&](auto on) {
    return ops::LayerNormForward({on(x), on(w), on(b), on(y), on(mean), on(rstd), 1e-5f});
  });
  ExpectTwinClose(y, Tol(dtype, kReduction), "LayerNormForward y");
  ExpectTwinClose(mean, kReduction, "LayerNormForward mean");
  ExpectTwinClose(rstd, kReduction, "LayerNormForward rstd");

  Twin dy = RandomTwin(dtype, {rows, cols}, 20);
  Twin dx = ZerosTwin(dtype, {rows, cols});
  Twin dw = RandomTwin(DType::kF32, {cols}, 21);
  Twin db = RandomTwin(DType::kF32, {cols}, 22);
  OnBoth([&](auto on) {
    return ops::LayerNormBackward(
        {on(dy), on(x), on(w), on(mean), on(rstd), on(dx), on(dw), on(db)});
  });
  // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w: terms of rstd |dy| |w|.
  const double dx_terms = MaxAbsOf(rstd) * MaxAbsOf(dy) * MaxAbsOf(w);
  ExpectCloseToTerms(dx, Tol(dtype, kReduction), dx_terms, "LayerNormBackward dx");
  ExpectTwinClose(dw, kReduction, "LayerNormBackward dweight");
  ExpectTwinClose(db, kReduction, "LayerNormBackward dbias");
  if (!parallel) return;

  // The tensor-parallel path as one rank of a group of one: partial statistics are the global
  // ones.
  Twin stats = ZerosTwin(DType::kF64, {rows, 2});
  Twin sums = ZerosTwin(DType::kF32, {rows, 2});
  OnBoth([&](auto on) {
    NF_RETURN_IF_ERROR(ops::LayerNormPartialStats(on(x), on(stats)));
    NF_RETURN_IF_ERROR(ops::LayerNormForwardFromStats(
        {on(x), on(w), on(b), on(y), on(mean), on(rstd), 1e-5f}, on(stats), cols));
    const ops::LayerNormBackwardArgs args{on(dy),   on(x),  on(w),  on(mean),
                                          on(rstd), on(dx), on(dw), on(db)};
    NF_RETURN_IF_ERROR(ops::LayerNormBackwardPartialSums(args, on(sums)));
    return ops::LayerNormBackwardFromSums(args, on(sums), cols);
  });
  ExpectTwinClose(stats, kReduction, "LayerNormPartialStats");
  ExpectTwinClose(y, Tol(dtype, kReduction), "LayerNormForwardFromStats y");
  ExpectTwinClose(rstd, kReduction, "LayerNormForwardFromStats rstd");
  ExpectTwinClose(sums, kReduction, "LayerNormBackwardPartialSums");
  ExpectCloseToTerms(dx, Tol(dtype, kReduction), dx_terms, "LayerNormBackwardFromSums dx");
  ExpectTwinClose(dw, kReduction, "LayerNormBackwardFromSums dweight");
  ExpectTwinClose(db, kReduction, "LayerNormBackwardFromSums dbias");
}

TEST_P(EdgeShapesTest, LayerNormAtOddWidths) {
  for (const int64_t cols : kOddWidths) {
    for (const int64_t rows : {1, 3}) CheckLayerNorm(dtype(), dtype(), rows, cols, true);
  }
  CheckLayerNorm(dtype(), DType::kF32, 3, 33, true);  // fp32 parameters of a 16-bit stream
}

TEST_P(EdgeShapesTest, ActivationNormAtOddWidths) {
  for (const int64_t cols : kOddWidths) {
    for (const float p : {0.0f, 0.2f}) {
      const int64_t rows = 3;
      SCOPED_TRACE(absl::StrCat("cols=", cols, " p=", p));
      const ops::DropoutSpec dropout{
          .p = p, .seed = 5, .site = 3, .first_sample = 2, .seq_len = 2, .col_offset = 3};
      Twin x = RandomTwin(dtype(), {rows, cols}, 1, -2.0f, 2.0f);
      Twin dy = RandomTwin(dtype(), {rows, cols}, 2, -2.0f, 2.0f);
      Twin w = RandomTwin(DType::kF32, {cols}, 3, 0.5f, 1.5f),
           b = RandomTwin(DType::kF32, {cols}, 4);
      Twin y = ZerosTwin(dtype(), {rows, cols}), scratch = ZerosTwin(dtype(), {rows, cols});
      Twin mean = ZerosTwin(DType::kF32, {rows}), rstd = ZerosTwin(DType::kF32, {rows});
      Twin dx = ZerosTwin(dtype(), {rows, cols});
      Twin dw = RandomTwin(DType::kF32, {cols}, 5), db = RandomTwin(DType::kF32, {cols}, 6);
      OnBoth([&](auto on) {
        NF_RETURN_IF_ERROR(ops::ActivationNormForward({.act = ops::Activation::kGelu,
                                                       .dropout = dropout,
                                                       .x = on(x),
                                                       .weight = on(w),
                                                       .bias = on(b),
                                                       .y = on(y),
                                                       .mean = on(mean),
                                                       .rstd = on(rstd),
                                                       .scratch = on(scratch)}));
        return ops::ActivationNormBackward({.act = ops::Activation::kGelu,
                                            .dropout = dropout,
                                            .dy = on(dy),
                                            .x = on(x),
                                            .weight = on(w),
                                            .mean = on(mean),
                                            .rstd = on(rstd),
                                            .dx = on(dx),
                                            .dweight = on(dw),
                                            .dbias = on(db),
                                            .scratch = on(scratch)});
      });
      ExpectTwinClose(y, Tol(dtype(), kReduction), "ActivationNormForward y");
      ExpectTwinClose(mean, kReduction, "ActivationNormForward mean");
      ExpectTwinClose(rstd, kReduction, "ActivationNormForward rstd");
      // The LayerNorm's input gradient (terms rstd |dy| |w|) through the dropout (1 / (1 - p))
      // and GELU's derivative (at most 1.13).
      const double dx_terms = MaxAbsOf(rstd) * MaxAbsOf(dy) * MaxAbsOf(w) / (1.0f - p) * 1.13;
      ExpectCloseToTerms(dx, Tol(dtype(), kReduction), dx_terms, "ActivationNormBackward dx");
      ExpectTwinClose(dw, kReduction, "ActivationNormBackward dweight");
      ExpectTwinClose(db, kReduction, "ActivationNormBackward dbias");
    }
  }
}

TEST_P(EdgeShapesTest, ResidualNormAtOddWidths) {
  for (const int64_t cols : kOddWidths) {
    for (const bool norms_branch : {false, true}) {
      const int64_t rows = 3;
      SCOPED_TRACE(absl::StrCat("cols=", cols, norms_branch ? " NormFormer" : " Pre-LN"));
      const ops::DropoutSpec dropout{.p = 0.2f,
                                     .seed = 23,
                                     .site = 4,
                                     .first_sample = 3,
                                     .seq_len = 2,
                                     .token_offset = 1,
                                     .col_offset = 6};
      const Shape shape{rows, cols};
      Twin x = RandomTwin(DType::kF32, shape, 1, -2.0f, 2.0f);  // an fp32 residual stream
      Twin branch = RandomTwin(dtype(), shape, 2, -1.0f, 3.0f);
      Twin residual = ZerosTwin(dtype(), shape), y = ZerosTwin(dtype(), shape);
      Twin scratch = ZerosTwin(dtype(), shape), back_scratch = ZerosTwin(dtype(), shape);
      Twin w = RandomTwin(DType::kF32, {cols}, 3, 0.5f, 1.5f),
           b = RandomTwin(DType::kF32, {cols}, 4);
      Twin mean = ZerosTwin(DType::kF32, {rows}), rstd = ZerosTwin(DType::kF32, {rows});
      Twin bw = RandomTwin(DType::kF32, {cols}, 9, 0.5f, 1.5f);
      Twin bb = RandomTwin(DType::kF32, {cols}, 10);
      Twin bmean = ZerosTwin(DType::kF32, {rows}), brstd = ZerosTwin(DType::kF32, {rows});
      Twin dy = RandomTwin(dtype(), shape, 5), d_residual = RandomTwin(dtype(), shape, 6);
      Twin d_branch = ZerosTwin(dtype(), shape);
      Twin dw = RandomTwin(DType::kF32, {cols}, 7), db = RandomTwin(DType::kF32, {cols}, 8);
      Twin dbw = RandomTwin(DType::kF32, {cols}, 11), dbb = RandomTwin(DType::kF32, {cols}, 12);
      const double d_residual_before = MaxAbsOf(d_residual);
      OnBoth([&](auto on) {
        ops::ResidualNormArgs forward{.dropout = dropout,
                                      .x = on(x),
                                      .branch = on(branch),
                                      .residual = on(residual),
                                      .weight = on(w),
                                      .bias = on(b),
                                      .y = on(y),
                                      .mean = on(mean),
                                      .rstd = on(rstd),
                                      .scratch = on(scratch)};
        ops::ResidualNormBackwardArgs backward{.dropout = dropout,
                                               .dy = on(dy),
                                               .residual = on(residual),
                                               .weight = on(w),
                                               .mean = on(mean),
                                               .rstd = on(rstd),
                                               .branch = on(branch),
                                               .d_residual = on(d_residual),
                                               .d_branch = on(d_branch),
                                               .dweight = on(dw),
                                               .dbias = on(db),
                                               .scratch = on(back_scratch)};
        if (norms_branch) {
          forward.branch_weight = backward.branch_weight = on(bw);
          forward.branch_bias = on(bb);
          forward.branch_mean = backward.branch_mean = on(bmean);
          forward.branch_rstd = backward.branch_rstd = on(brstd);
          backward.d_branch_weight = on(dbw);
          backward.d_branch_bias = on(dbb);
        }
        NF_RETURN_IF_ERROR(ops::ResidualNormForward(forward));
        return ops::ResidualNormBackward(backward);
      });
      ExpectTwinClose(residual, Tol(dtype(), kReduction), "ResidualNormForward residual");
      ExpectTwinClose(y, Tol(dtype(), kReduction), "ResidualNormForward y");
      ExpectTwinClose(mean, kReduction, "ResidualNormForward mean");
      ExpectTwinClose(rstd, kReduction, "ResidualNormForward rstd");
      // d_residual gains the LayerNorm's input gradient (terms rstd |dy| |w|, see CheckLayerNorm);
      // the dropout passes it to dz (1 / (1 - p)), and the branch LayerNorm's input gradient
      // multiplies that by its rstd |w| again. The branch's bias gradient sums dz over rows.
      const double d_residual_terms =
          d_residual_before + MaxAbsOf(rstd) * MaxAbsOf(dy) * MaxAbsOf(w);
      const double dz_terms = d_residual_terms / (1.0f - dropout.p);
      ExpectCloseToTerms(d_residual, Tol(dtype(), kReduction), d_residual_terms,
                         "ResidualNormBackward d_residual");
      ExpectCloseToTerms(d_branch, Tol(dtype(), kReduction),
                         norms_branch ? dz_terms * MaxAbsOf(brstd) * MaxAbsOf(bw) : dz_terms,
                         "ResidualNormBackward d_branch");
      ExpectTwinClose(dw, kReduction, "ResidualNormBackward dweight");
      ExpectTwinClose(db, kReduction, "ResidualNormBackward dbias");
      if (norms_branch) {
        ExpectTwinClose(bmean, kReduction, "ResidualNormForward branch_mean");
        ExpectTwinClose(brstd, kReduction, "ResidualNormForward branch_rstd");
        ExpectTwinClose(dbw, Tol(dtype(), kReduction), "ResidualNormBackward d_branch_weight");
        ExpectCloseToTerms(dbb, Tol(dtype(), kReduction), static_cast<double>(rows) * dz_terms,
                           "ResidualNormBackward d_branch_bias");
      }
    }
  }
}

// ---- Softmax and attention ---------------------------------------------------------------------

TEST_P(EdgeShapesTest, SoftmaxAtOddWidths) {
  for (const int64_t cols : kOddWidths) {
    SCOPED_TRACE(absl::StrCat("cols=", cols));
    const int64_t rows = 3;
    std::vector<float> values = testing::RandomFloats(rows * cols, 21, -4.0f, 4.0f);
    // Row 1 masked entirely (zeros), row 2 but for its last column.
    for (int64_t c = 0; c < cols; ++c) values[cols + c] = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c + 1 < cols; ++c) {
      values[2 * cols + c] = -std::numeric_limits<float>::infinity();
    }
    Twin x = MakeTwin(testing::MakeTensor(dtype(), {rows, cols}, values));
    Twin y = ZerosTwin(dtype(), {rows, cols});
    Twin dy = RandomTwin(dtype(), {rows, cols}, 22);
    Twin dx = ZerosTwin(dtype(), {rows, cols});
    OnBoth([&](auto on) { return ops::SoftmaxForward(on(x), on(y)); });
    OnBoth([&](auto on) { return ops::SoftmaxBackward(on(y), on(dy), on(dx)); });
    ExpectTwinClose(y, Tol(dtype(), kReduction), "SoftmaxForward");
    ExpectTwinClose(dx, Tol(dtype(), kReduction), "SoftmaxBackward");
  }
}

// Causal attention forward and (unless `forward_only`) backward of [batch, heads, seq, dim] on
// both backends.
void CheckAttention(DType dtype, const Shape& shape, const ops::DropoutSpec& dropout,
                    bool forward_only = false) {
  SCOPED_TRACE(absl::StrCat(ShapeName(shape), " p=", dropout.p));
  const Shape lse_shape{shape[0], shape[1], shape[2]};
  Twin q = RandomTwin(dtype, shape, 23), k = RandomTwin(dtype, shape, 24);
  Twin v = RandomTwin(dtype, shape, 25), dout = RandomTwin(dtype, shape, 26);
  Twin out = ZerosTwin(dtype, shape), lse = ZerosTwin(DType::kF32, lse_shape);
  Twin dq = ZerosTwin(dtype, shape), dk = ZerosTwin(dtype, shape), dv = ZerosTwin(dtype, shape);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape[3]));
  OnBoth([&](auto on) {
    NF_RETURN_IF_ERROR(
        ops::AttentionForward({on(q), on(k), on(v), on(out), on(lse), scale, dropout}));
    if (forward_only) return absl::OkStatus();
    return ops::AttentionBackward(
        {on(q), on(k), on(v), on(out), on(lse), on(dout), on(dq), on(dk), on(dv), scale, dropout});
  });
  ExpectTwinClose(out, Tol(dtype, kReduction), "AttentionForward out");
  ExpectTwinClose(lse, kReduction, "AttentionForward lse");
  if (forward_only) return;
  // Over a single key (seq 1) the softmax has no gradient: dq = scale dS K and dk = scale dS Q
  // with dS = P (dP - rowdot) = (dO.V - dO.O) = 0 in exact arithmetic, so both backends keep
  // rounding noise of the terms scale |dO.V| |K| (|Q|), |dO.V| <= dim |dO| |V|, through the
  // dropout's 1 / (1 - p). Longer sequences compare as ExpectTwinClose does.
  const double ds_terms = shape[2] == 1 ? scale * static_cast<double>(shape[3]) * MaxAbsOf(dout) *
                                              MaxAbsOf(v) / (1.0f - dropout.p)
                                        : 0.0;
  ExpectCloseToTerms(dq, Tol(dtype, kReduction), ds_terms * MaxAbsOf(k), "AttentionBackward dq");
  ExpectCloseToTerms(dk, Tol(dtype, kReduction), ds_terms * MaxAbsOf(q), "AttentionBackward dk");
  ExpectTwinClose(dv, Tol(dtype, kReduction), "AttentionBackward dv");
}

TEST_P(EdgeShapesTest, AttentionWithOneAnd25HeadsAndOneToken) {
  const ScopedAttentionPolicy own("own");
  const ops::DropoutSpec dropout{
      .p = 0.1f, .seed = 3, .site = 9, .first_sample = 7, .seq_len = 1, .head_offset = 2};
  // Sequences of one token, and of 33 (one past a 32-key tile, in the fifth block of 8 rows);
  // head_dim 1, 31, 33 (a second 32-wide chunk with one dimension) and 128 (the maximum).
  for (const Shape& shape : {Shape{1, 1, 1, 1}, Shape{2, 25, 1, 33}, Shape{1, 25, 33, 1},
                             Shape{3, 1, 33, 31}, Shape{1, 1, 33, 128}}) {
    CheckAttention(dtype(), shape, {});
    CheckAttention(dtype(), shape, dropout);
  }
  // head_dim 129 is past the own kernel's maximum: refused on the GPU (the CPU has no limit).
  const Shape shape{1, 1, 2, 129};
  Twin q = RandomTwin(dtype(), shape, 27), out = ZerosTwin(dtype(), shape);
  Twin lse = ZerosTwin(DType::kF32, {1, 1, 2});
  const absl::Status refused =
      ops::AttentionForward({q.gpu, q.gpu, q.gpu, out.gpu, lse.gpu, 1.0f, {}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("maximum of 128")) << refused;
  NF_EXPECT_OK(ops::Synchronize(kGpu)) << "a refused call leaves the device usable";
}

// KV-cache attention of `fresh` new tokens after `past` cached ones, in a cache of `capacity`.
void CheckKvCacheAttention(DType dtype, int64_t batch, int64_t heads, int64_t fresh, int64_t dim,
                           int64_t past, int64_t capacity) {
  SCOPED_TRACE(absl::StrCat("batch=", batch, " heads=", heads, " new=", fresh, " dim=", dim,
                            " past=", past, " capacity=", capacity));
  const Shape new_shape{batch, heads, fresh, dim}, cache{batch, heads, capacity, dim};
  Twin q = RandomTwin(dtype, new_shape, 31), k = RandomTwin(dtype, new_shape, 32);
  Twin v = RandomTwin(dtype, new_shape, 33), out = ZerosTwin(dtype, new_shape);
  Twin k_cache = RandomTwin(dtype, cache, 34), v_cache = RandomTwin(dtype, cache, 35);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  OnBoth([&](auto on) {
    return ops::KvCacheAttention({.q = on(q),
                                  .k = on(k),
                                  .v = on(v),
                                  .k_cache = on(k_cache),
                                  .v_cache = on(v_cache),
                                  .out = on(out),
                                  .past = past,
                                  .scale = scale});
  });
  ExpectTwinClose(out, Tol(dtype, kReduction), "KvCacheAttention out");
  ExpectTwinIdentical(k_cache, "KvCacheAttention k_cache");
  ExpectTwinIdentical(v_cache, "KvCacheAttention v_cache");
}

TEST_P(EdgeShapesTest, KvCacheAttentionEdges) {
  CheckKvCacheAttention(dtype(), 1, 1, 1, 1, 0, 1);    // the first token into a cache of one
  CheckKvCacheAttention(dtype(), 2, 25, 1, 33, 5, 6);  // 25 heads, a full cache
  CheckKvCacheAttention(dtype(), 1, 25, 3, 31, 0, 3);  // a prompt of 3, nothing cached
  CheckKvCacheAttention(dtype(), 1, 1, 2, 257, 1, 4);  // head_dim past 128 threads
  // The scores share 48 KiB of shared memory with the kernel's 128 bytes of static scratch:
  // dim + past + new = 12256 floats fill it exactly.
  CheckKvCacheAttention(dtype(), 1, 1, 1, 1, 12254, 12255);
  // One float more is refused on the GPU (the CPU has no such limit).
  const Shape new_shape{1, 1, 1, 1}, cache{1, 1, 12256, 1};
  Twin q = RandomTwin(dtype(), new_shape, 36), out = ZerosTwin(dtype(), new_shape);
  Twin k_cache = RandomTwin(dtype(), cache, 37), v_cache = RandomTwin(dtype(), cache, 38);
  const absl::Status refused = ops::KvCacheAttention({.q = q.gpu,
                                                      .k = q.gpu,
                                                      .v = q.gpu,
                                                      .k_cache = k_cache.gpu,
                                                      .v_cache = v_cache.gpu,
                                                      .out = out.gpu,
                                                      .past = 12255});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("48 KiB")) << refused;
  NF_EXPECT_OK(ops::Synchronize(kGpu)) << "a refused call leaves the device usable";
}

// ---- Embedding and loss ------------------------------------------------------------------------

// A vocabulary of 1001 words (not a multiple of 8), padded to 1008 and split in 8 slices of
// 126: the last slice holds global ids [882, 1008), of which [1001, 1008) are padding.
constexpr int64_t kVocab = 1001, kSlice = 126, kLastSliceOffset = 882;

TEST_P(EdgeShapesTest, EmbeddingWithAnOddVocabulary) {
  for (const int64_t width : kOddWidths) {
    SCOPED_TRACE(absl::StrCat("width=", width));
    // The whole vocabulary on one rank, one token and 9 with repeats.
    for (const std::vector<int32_t>& ids :
         {std::vector<int32_t>{1000}, std::vector<int32_t>{0, 1000, 7, 1000, 999, 0, 500, 7, 7}}) {
      const int64_t tokens = static_cast<int64_t>(ids.size());
      Twin id_twin = MakeTwin(MakeIds({tokens}, ids));
      Twin table = RandomTwin(dtype(), {kVocab, width}, 27);
      Twin out = ZerosTwin(dtype(), {tokens, width});
      Twin dout = RandomTwin(dtype(), {tokens, width}, 28);
      Twin dtable = RandomTwin(DType::kF32, {kVocab, width}, 29);
      OnBoth([&](auto on) {
        NF_RETURN_IF_ERROR(ops::EmbeddingForward({on(id_twin), on(table), on(out), 0, kVocab}));
        return ops::EmbeddingBackward(on(id_twin), on(dout), on(dtable), 0);
      });
      ExpectTwinIdentical(out, "EmbeddingForward");
      ExpectTwinClose(dtable, kReduction, "EmbeddingBackward");
    }
    // The last slice of a vocab-parallel table, padding rows included: ids of other slices
    // give zeros and no gradient here.
    const std::vector<int32_t> ids = {1000, 881, 882, 0, 1000, 950};
    Twin id_twin = MakeTwin(MakeIds({6}, ids));
    Twin table = RandomTwin(dtype(), {kSlice, width}, 30);
    Twin out = ZerosTwin(dtype(), {6, width});
    Twin dout = RandomTwin(dtype(), {6, width}, 31);
    Twin dtable = RandomTwin(DType::kF32, {kSlice, width}, 32);
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(
          ops::EmbeddingForward({on(id_twin), on(table), on(out), kLastSliceOffset, kVocab}));
      return ops::EmbeddingBackward(on(id_twin), on(dout), on(dtable), kLastSliceOffset);
    });
    ExpectTwinIdentical(out, "EmbeddingForward, last slice");
    ExpectTwinClose(dtable, kReduction, "EmbeddingBackward, last slice");
  }
}

// Cross-entropy over logits [rows, cols] holding global columns [offset, offset + cols) of a
// vocabulary of `valid` words; `loss` only where the slice holds the whole vocabulary (the
// vocab-parallel loss is computed from all-reduced sums).
void CheckCrossEntropy(DType dtype, int64_t cols, int64_t offset, int64_t valid,
                       const std::vector<int32_t>& targets) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  SCOPED_TRACE(absl::StrCat("rows=", rows, " cols=", cols, " offset=", offset, " valid=", valid));
  Twin target_twin = MakeTwin(MakeIds({rows}, targets));
  Twin logits = RandomTwin(dtype, {rows, cols}, 30, -5.0f, 5.0f);
  Twin row_max = ZerosTwin(DType::kF32, {rows}), sum_exp = ZerosTwin(DType::kF32, {rows});
  Twin target_logit = ZerosTwin(DType::kF32, {rows}), loss = ZerosTwin(DType::kF32, {rows});
  Twin dloss = RandomTwin(DType::kF32, {rows}, 31);
  Twin dlogits = ZerosTwin(dtype, {rows, cols});
  const bool whole = offset == 0 && cols >= valid;
  OnBoth([&](auto on) {
    const ops::CrossEntropyArgs args{on(logits), on(target_twin), offset, valid};
    NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(args, on(row_max)));
    NF_RETURN_IF_ERROR(ops::CrossEntropySumExp(args, on(row_max), on(sum_exp), on(target_logit)));
    if (whole) {
      NF_RETURN_IF_ERROR(ops::CrossEntropyLoss(on(target_twin), on(row_max), on(sum_exp),
                                               on(target_logit), on(loss)));
    }
    return ops::CrossEntropyBackward(args, on(row_max), on(sum_exp), on(dloss), on(dlogits));
  });
  ExpectTwinIdentical(row_max, "CrossEntropyRowMax");
  ExpectTwinClose(sum_exp, kReduction, "CrossEntropySumExp");
  ExpectTwinIdentical(target_logit, "CrossEntropySumExp target logit");
  ExpectTwinClose(dlogits, Tol(dtype, kReduction), "CrossEntropyBackward");
  if (!whole) return;
  ExpectTwinClose(loss, kReduction, "CrossEntropyLoss");
  Twin totals = ZerosTwin(DType::kF64, {2});
  OnBoth([&](auto on) { return ops::AccumulateLoss(on(loss), on(target_twin), on(totals)); });
  ExpectTwinClose(totals, kReduction, "AccumulateLoss");
}

TEST_P(EdgeShapesTest, CrossEntropyWithAnOddVocabulary) {
  // The whole vocabulary (1001 columns: 3 full 256-thread passes and 233 more), one row and
  // several, the first and last words, an ignored row.
  CheckCrossEntropy(dtype(), kVocab, 0, kVocab, {1000});
  CheckCrossEntropy(dtype(), kVocab, 0, kVocab, {0, 1000, -1, 500, 999});
  // Padded to 1008 on one rank: the 7 padding columns never count.
  CheckCrossEntropy(dtype(), 1008, 0, kVocab, {1000, 3, -1});
  // The last slice of 8 (119 real columns, 7 padding), targets inside and outside it.
  CheckCrossEntropy(dtype(), kSlice, kLastSliceOffset, kVocab, {1000, 881, 882, -1, 0, 950});
  // A slice holding only padding: its row max is -inf and it adds nothing.
  CheckCrossEntropy(dtype(), 7, kVocab, kVocab, {1000, 3});
  // A vocabulary of one word, and of 31 and 33.
  CheckCrossEntropy(dtype(), 1, 0, 1, {0, -1, 0});
  CheckCrossEntropy(dtype(), 31, 0, 31, {30, 0});
  CheckCrossEntropy(dtype(), 33, 0, 33, {32, 31});
}

// ---- Casts, fills, BLAS-1, copies --------------------------------------------------------------

// The raw bytes of a tensor, on the host.
std::vector<unsigned char> BytesOf(const Tensor& t) {
  const Tensor host = t.device().type == DeviceType::kCpu ? t : testing::ToCpu(t);
  const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
  return std::vector<unsigned char>(bytes, bytes + host.nbytes());
}

TEST_P(EdgeShapesTest, CastsFillsBlasOneAndCopiesOfOddSizes) {
  for (const int64_t n : {1, 31, 33, 257}) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    Twin x = RandomTwin(dtype(), {n}, 32, -100.0f, 100.0f);
    for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
      Twin y = ZerosTwin(to, {n});
      OnBoth([&](auto on) { return ops::Cast(on(x), on(y)); });
      ExpectTwinIdentical(y, "Cast");
      Twin z = RandomTwin(to, {n}, 33);
      OnBoth([&](auto on) {
        NF_RETURN_IF_ERROR(ops::Scale(on(z), 0.37f));
        return ops::Axpy(-1.5f, on(x), on(z));
      });
      ExpectTwinClose(z, Tol(to, kElementwise), "Scale, Axpy");
    }
    Twin y = RandomTwin(dtype(), {n}, 34);
    OnBoth([&](auto on) { return ops::Fill(on(y), 2.5f); });
    ExpectTwinIdentical(y, "Fill");

    // A device-to-device copy of an odd number of bytes from an odd element offset, and back.
    Twin storage = RandomTwin(dtype(), {n + 1}, 35);
    const Twin view = {*storage.cpu.View(1, {n}), *storage.gpu.View(1, {n})};
    Twin copy = ZerosTwin(dtype(), {n});
    OnBoth([&](auto on) { return ops::Copy(on(view), on(copy)); });
    ExpectTwinIdentical(copy, "Copy from a view");
    Twin target = ZerosTwin(dtype(), {n + 1});
    const Twin target_view = {*target.cpu.View(1, {n}), *target.gpu.View(1, {n})};
    OnBoth([&](auto on) { return ops::Copy(on(copy), on(target_view)); });
    ExpectTwinIdentical(target, "Copy into a view");
  }
}

// Zero-sized dimensions: nothing is launched (a grid of 0 blocks is a launch error), outputs
// of the empty parts stay as they were, and accumulated gradients gain nothing.
TEST_P(EdgeShapesTest, EmptyDimensions) {
  {  // A LayerNorm of no rows (its parameter gradients gain nothing); softmax and the bias
     // gradient over no rows and over rows of no columns.
    Twin x = ZerosTwin(dtype(), {0, 33}), y = ZerosTwin(dtype(), {0, 33});
    Twin w = RandomTwin(dtype(), {33}, 2), b = RandomTwin(dtype(), {33}, 3);
    Twin mean = ZerosTwin(DType::kF32, {0}), rstd = ZerosTwin(DType::kF32, {0});
    Twin dw = RandomTwin(DType::kF32, {33}, 6), db = RandomTwin(DType::kF32, {33}, 7);
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(
          ops::LayerNormForward({on(x), on(w), on(b), on(y), on(mean), on(rstd), 1e-5f}));
      return ops::LayerNormBackward(
          {on(x), on(x), on(w), on(mean), on(rstd), on(y), on(dw), on(db)});
    });
    ExpectTwinIdentical(dw, "LayerNormBackward dweight of no rows");
    ExpectTwinIdentical(db, "LayerNormBackward dbias of no rows");
    for (const Shape& shape : {Shape{3, 0}, Shape{0, 33}}) {
      SCOPED_TRACE(ShapeName(shape));
      Twin z = ZerosTwin(dtype(), shape), dbias = RandomTwin(DType::kF32, {shape[1]}, 8);
      OnBoth([&](auto on) {
        NF_RETURN_IF_ERROR(ops::BiasBackward(on(z), on(dbias)));
        NF_RETURN_IF_ERROR(ops::SoftmaxForward(on(z), on(z)));
        return ops::SoftmaxBackward(on(z), on(z), on(z));
      });
      ExpectTwinIdentical(dbias, "BiasBackward");
    }
  }
  {  // Cross-entropy over a slice of no columns: row max -inf, nothing summed.
    Twin logits = ZerosTwin(dtype(), {2, 0});
    Twin targets = MakeTwin(MakeIds({2}, {5, -1}));
    Twin row_max = ZerosTwin(DType::kF32, {2}), sum_exp = RandomTwin(DType::kF32, {2}, 8);
    Twin target_logit = RandomTwin(DType::kF32, {2}, 9), dloss = RandomTwin(DType::kF32, {2}, 10);
    OnBoth([&](auto on) {
      const ops::CrossEntropyArgs args{on(logits), on(targets), 1001, 1001};
      NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(args, on(row_max)));
      NF_RETURN_IF_ERROR(ops::CrossEntropySumExp(args, on(row_max), on(sum_exp), on(target_logit)));
      return ops::CrossEntropyBackward(args, on(row_max), on(sum_exp), on(dloss), on(logits));
    });
    ExpectTwinIdentical(row_max, "CrossEntropyRowMax of no columns");
    ExpectTwinIdentical(sum_exp, "CrossEntropySumExp of no columns");
    ExpectTwinIdentical(target_logit, "CrossEntropySumExp target logit of no columns");
    Twin loss = ZerosTwin(DType::kF32, {0}), no_targets = MakeTwin(MakeIds({0}, {}));
    Tensor totals_values = testing::MakeZeros(DType::kF64, {2});
    totals_values.data<double>()[0] = 12.5;
    totals_values.data<double>()[1] = 3.0;
    Twin totals = MakeTwin(totals_values);
    OnBoth([&](auto on) { return ops::AccumulateLoss(on(loss), on(no_targets), on(totals)); });
    ExpectTwinIdentical(totals, "AccumulateLoss of no rows");
  }
  {  // Attention of no tokens; a KV-cache call with no new tokens.
    const ScopedAttentionPolicy own("own");
    const Shape shape{2, 25, 0, 33};
    Twin q = ZerosTwin(dtype(), shape), lse = ZerosTwin(DType::kF32, {2, 25, 0});
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(ops::AttentionForward({on(q), on(q), on(q), on(q), on(lse), 1.0f, {}}));
      return ops::AttentionBackward(
          {on(q), on(q), on(q), on(q), on(lse), on(q), on(q), on(q), on(q), 1.0f, {}});
    });
    Twin cache = RandomTwin(dtype(), {2, 25, 4, 33}, 12);
    OnBoth([&](auto on) {
      return ops::KvCacheAttention({.q = on(q),
                                    .k = on(q),
                                    .v = on(q),
                                    .k_cache = on(cache),
                                    .v_cache = on(cache),
                                    .out = on(q),
                                    .past = 4});
    });
    ExpectTwinIdentical(cache, "KvCacheAttention of no new tokens");
  }
  // Head layouts and scales of no tokens and of heads of size 0: the scale gradients gain
  // nothing.
  for (const Shape& shape : {Shape{2, 25, 0, 33}, Shape{2, 25, 3, 0}}) {
    SCOPED_TRACE(ShapeName(shape));
    Twin heads = ZerosTwin(dtype(), shape);
    Twin tokens = ZerosTwin(dtype(), {shape[0] * shape[2], 25 * shape[3]});
    Twin scale = RandomTwin(dtype(), {25}, 13), dscale = RandomTwin(DType::kF32, {25}, 14);
    Twin x = ZerosTwin(dtype(), {0, 25, 1});
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(ops::SplitHeads(on(tokens), on(heads)));
      NF_RETURN_IF_ERROR(ops::MergeHeads(on(heads), on(tokens)));
      NF_RETURN_IF_ERROR(ops::MergeScaledHeads(on(heads), on(scale), on(tokens)));
      NF_RETURN_IF_ERROR(
          ops::MergeScaledHeadsBackward(on(tokens), on(heads), on(scale), on(heads), on(dscale)));
      NF_RETURN_IF_ERROR(ops::ScaleChannelsBackward(on(x), on(scale), 1, on(x), on(x), on(dscale)));
      if (shape[3] == 0) return absl::OkStatus();  // ScaleChannels takes inner >= 1
      return ops::ScaleChannelsBackward(on(heads), on(scale), shape[3], on(heads), on(heads),
                                        on(dscale));
    });
    ExpectTwinIdentical(dscale, "scale gradients of no tokens");
  }
  {  // Embedding of no tokens; norms and updates of no elements.
    Twin ids = MakeTwin(MakeIds({0}, {})), table = RandomTwin(dtype(), {1001, 33}, 15);
    Twin out = ZerosTwin(dtype(), {0, 33}), dtable = RandomTwin(DType::kF32, {1001, 33}, 16);
    Twin empty = ZerosTwin(dtype(), {0}), empty32 = ZerosTwin(DType::kF32, {0});
    Twin norm = RandomTwin(DType::kF32, {1}, 17), found = ZerosTwin(DType::kF32, {1});
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(ops::EmbeddingForward({on(ids), on(table), on(out), 0, 1001}));
      NF_RETURN_IF_ERROR(ops::EmbeddingBackward(on(ids), on(out), on(dtable), 0));
      NF_RETURN_IF_ERROR(ops::SquaredNorm(on(empty), on(norm)));
      NF_RETURN_IF_ERROR(ops::UnscaleAndCheck(on(empty32), 0.5f, on(found)));
      NF_RETURN_IF_ERROR(ops::AdamWStep({on(empty32), on(empty32), on(empty32), on(empty32)}));
      NF_RETURN_IF_ERROR(ops::Cast(on(empty), on(empty32)));
      NF_RETURN_IF_ERROR(ops::Fill(on(empty), 1.0f));
      NF_RETURN_IF_ERROR(ops::Scale(on(empty), 2.0f));
      NF_RETURN_IF_ERROR(ops::Axpy(2.0f, on(empty), on(empty32)));
      NF_RETURN_IF_ERROR(ops::Dropout(on(out), on(out), {.p = 0.5f}));
      return ops::Copy(on(empty), on(empty));
    });
    ExpectTwinIdentical(dtable, "EmbeddingBackward of no tokens");
    ExpectTwinIdentical(norm, "SquaredNorm of no elements");
    ExpectTwinIdentical(found, "UnscaleAndCheck of no elements");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EdgeShapesTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Fills of the other dtypes Fill takes, at odd sizes.
TEST(EdgeShapesFillTest, IntegerAndDoubleFillsOfOddSizes) {
  NF_REQUIRE_GPU();
  for (const DType dtype : {DType::kI32, DType::kI64, DType::kU16, DType::kU8, DType::kF64}) {
    for (const int64_t n : {1, 31, 33, 257}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      Twin x = ZerosTwin(dtype, {n});
      OnBoth([&](auto on) { return ops::Fill(on(x), 7.0f); });
      NF_ASSERT_OK(ops::Synchronize(kGpu));
      EXPECT_EQ(BytesOf(x.gpu), BytesOf(x.cpu));
    }
  }
}

// The first id and target past a vocabulary of 1001 whose table and logits carry padding up to
// 1008: the padding rows and columns exist, but ids and targets there are errors, reported at
// the next Synchronize with the CPU's message; the device goes on afterwards.
TEST(EdgeShapesFaultTest, IdsAndTargetsJustPastAPaddedVocabulary) {
  NF_REQUIRE_GPU();
  Twin ids = MakeTwin(MakeIds({3}, {1000, 1001, 0}));
  Twin table = RandomTwin(DType::kF32, {1008, 5}, 46);
  Twin out = ZerosTwin(DType::kF32, {3, 5});
  const absl::Status cpu = ops::EmbeddingForward({ids.cpu, table.cpu, out.cpu, 0, kVocab});
  NF_ASSERT_OK(ops::EmbeddingForward({ids.gpu, table.gpu, out.gpu, 0, kVocab}));
  EXPECT_EQ(ops::Synchronize(kGpu), cpu);  // "token id 1001 at position 1 is outside [0, 1001)"
  EXPECT_FALSE(cpu.ok());

  Twin targets = MakeTwin(MakeIds({3}, {1000, -1, 1001}));
  Twin logits = RandomTwin(DType::kF32, {3, 1008}, 47);
  Twin row_max = ZerosTwin(DType::kF32, {3}), sum_exp = ZerosTwin(DType::kF32, {3});
  Twin target_logit = ZerosTwin(DType::kF32, {3});
  auto sum_exp_on = [&](auto on) {
    const ops::CrossEntropyArgs args{on(logits), on(targets), 0, kVocab};
    NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(args, on(row_max)));
    return ops::CrossEntropySumExp(args, on(row_max), on(sum_exp), on(target_logit));
  };
  const absl::Status cpu_loss = sum_exp_on([](const Twin& t) { return t.cpu; });
  NF_ASSERT_OK(sum_exp_on([](const Twin& t) { return t.gpu; }));
  EXPECT_EQ(ops::Synchronize(kGpu), cpu_loss);  // "target 1001 of row 2 is outside [0, 1001)"
  EXPECT_FALSE(cpu_loss.ok());
  NF_EXPECT_OK(ops::Synchronize(kGpu)) << "a reported fault is cleared";
}

// ---- Optimizer ---------------------------------------------------------------------------------

TEST(EdgeShapesOptimizerTest, AdamWUnscaleAndNormAtOddSizes) {
  NF_REQUIRE_GPU();
  // One element, 257 (a last block of one thread), and 1024 * 256 + 1: one element past what
  // SquaredNorm's 1024 first-pass blocks cover in one sweep, so its grid-stride loop wraps.
  for (const int64_t n : {int64_t{1}, int64_t{257}, int64_t{1024 * 256 + 1}}) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    Twin params = RandomTwin(DType::kF32, {n}, 34), grads = RandomTwin(DType::kF32, {n}, 35);
    Twin m = RandomTwin(DType::kF32, {n}, 36, 0.0f, 0.1f);
    Twin v = RandomTwin(DType::kF32, {n}, 37, 0.0f, 0.1f);
    Twin found = ZerosTwin(DType::kF32, {1});
    auto args = [&](auto on) {
      return ops::AdamWArgs{on(params), on(grads), on(m), on(v), 1e-3f,
                            0.9f,       0.98f,     1e-8f, 0.1f,  7};
    };
    OnBoth(
        [&](auto on) { return ops::AdamWWouldOverflow(args(on), 1.0f, DType::kF16, on(found)); });
    ExpectTwinIdentical(found, "AdamWWouldOverflow");
    OnBoth([&](auto on) { return ops::AdamWStep(args(on)); });
    ExpectTwinClose(params, kElementwise, "AdamW params");
    ExpectTwinClose(m, kElementwise, "AdamW exp_avg");
    ExpectTwinClose(v, kElementwise, "AdamW exp_avg_sq");

    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      Twin x = RandomTwin(dtype, {n}, 38);
      Twin norm = RandomTwin(DType::kF32, {1}, 39);
      OnBoth([&](auto on) { return ops::SquaredNorm(on(x), on(norm)); });
      ExpectTwinClose(norm, 1e-6, absl::StrCat("SquaredNorm ", DTypeName(dtype)));
    }

    OnBoth([&](auto on) { return ops::UnscaleAndCheck(on(grads), 0.5f, on(found)); });
    ExpectTwinIdentical(grads, "UnscaleAndCheck grads");
    ExpectTwinIdentical(found, "UnscaleAndCheck with finite grads");
    // An overflow in the very last element (the last, partly filled warp).
    std::vector<float> values = testing::RandomFloats(n, 40);
    values.back() = 3e38f;
    Twin big = MakeTwin(testing::MakeTensor(DType::kF32, {n}, values));
    Twin found_big = ZerosTwin(DType::kF32, {1});
    OnBoth([&](auto on) { return ops::UnscaleAndCheck(on(big), 4.0f, on(found_big)); });
    ExpectTwinIdentical(found_big, "UnscaleAndCheck with an overflow last");
    ExpectTwinIdentical(big, "UnscaleAndCheck grads with an overflow");

    // An fp16 overflow of the last element only: 65519 moved outwards by ~1 (lr 1, step 1).
    std::vector<float> p = testing::RandomFloats(n, 41), g(n, 0.0f);
    p.back() = 65519.0f;
    g.back() = -1.0f;
    Twin p16 = MakeTwin(testing::MakeTensor(DType::kF32, {n}, p));
    Twin g16 = MakeTwin(testing::MakeTensor(DType::kF32, {n}, g));
    Twin m16 = ZerosTwin(DType::kF32, {n}), v16 = ZerosTwin(DType::kF32, {n});
    Twin found16 = ZerosTwin(DType::kF32, {1});
    OnBoth([&](auto on) {
      return ops::AdamWWouldOverflow(
          {on(p16), on(g16), on(m16), on(v16), 1.0f, 0.9f, 0.98f, 1e-8f, 0.0f, 1}, 1.0f,
          DType::kF16, on(found16));
    });
    ExpectTwinIdentical(found16, "AdamWWouldOverflow with the last element overflowing");
    EXPECT_EQ(testing::ToDoubles(testing::ToCpu(found16.gpu))[0], 1.0);
  }
}

// ---- Launch limits -----------------------------------------------------------------------------

// 65537 rows of one column: a block per row on gridDim.x past 65535 (fp32; the grid does not
// depend on the dtype), and the parameter gradients' column sums in 1009 chunks of 65 rows.
TEST(EdgeShapesGridTest, LayerNormAndBiasGradientOver65537Rows) {
  NF_REQUIRE_GPU();
  CheckLayerNorm(DType::kF32, DType::kF32, 65537, 1, false);
  Twin dy = RandomTwin(DType::kF32, {65537, 1}, 42);
  Twin dbias = RandomTwin(DType::kF32, {1}, 43);
  OnBoth([&](auto on) { return ops::BiasBackward(on(dy), on(dbias)); });
  ExpectTwinClose(dbias, kReduction, "BiasBackward over 65537 rows");
}

// batch x heads on gridDim.y: 65535 pairs run and match the CPU; 65536 are refused with the
// limit named, and the device stays usable. fp32 (the own kernel on every GPU), one token of
// head_dim 1: the smallest problem with that many pairs.
TEST(EdgeShapesGridTest, AttentionPairsAtTheGridLimit) {
  NF_REQUIRE_GPU();
  const ScopedAttentionPolicy own("own");
  // The forward only: its backward's two kernels take the same grid (attention.cu's RowGrid)
  // and would add ~35 s on the emulated GPU.
  CheckAttention(DType::kF32, {kMaxGridY, 1, 1, 1}, {}, /*forward_only=*/true);
  CheckKvCacheAttention(DType::kF32, kMaxGridY, 1, 1, 1, 0, 1);
  for (const int64_t pairs : {kMaxGridY + 1}) {
    const Shape shape{pairs, 1, 1, 1};
    Twin q = RandomTwin(DType::kF32, shape, 44);
    Twin out = ZerosTwin(DType::kF32, shape), lse = ZerosTwin(DType::kF32, {pairs, 1, 1});
    Twin dq = ZerosTwin(DType::kF32, shape);
    const absl::Status forward =
        ops::AttentionForward({q.gpu, q.gpu, q.gpu, out.gpu, lse.gpu, 1.0f, {}});
    testing::ExpectInvalidArgument(forward, "exceeds CUDA's 65535 grid rows");
    const absl::Status backward = ops::AttentionBackward(
        {q.gpu, q.gpu, q.gpu, out.gpu, lse.gpu, q.gpu, dq.gpu, dq.gpu, dq.gpu, 1.0f, {}});
    testing::ExpectInvalidArgument(backward, "exceeds CUDA's 65535 grid rows");
    Twin cache = RandomTwin(DType::kF32, shape, 45);
    const absl::Status kv = ops::KvCacheAttention({.q = q.gpu,
                                                   .k = q.gpu,
                                                   .v = q.gpu,
                                                   .k_cache = cache.gpu,
                                                   .v_cache = cache.gpu,
                                                   .out = out.gpu});
    testing::ExpectInvalidArgument(kv, "exceeds CUDA's 65535 grid rows");
    NF_EXPECT_OK(ops::Synchronize(kGpu)) << "a refused call leaves the device usable";
  }
}

}  // namespace
}  // namespace nf
