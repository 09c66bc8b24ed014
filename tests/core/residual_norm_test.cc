// The residual add fused with the LayerNorms around it (ops::ResidualNormForward / Backward)
// against the unfused ops it stands for (core/ops/composed_ops.h) on the CPU: the fp32 kernel
// runs every row through the same row kernels and parameter-gradient blocks as the unfused ops,
// so every output must be the composition's bit for bit (the composition itself is what
// layer_norm_test, elementwise_test and the model reference tests check against float64 and
// fairseq). Rows span several of the backward's 64-row blocks and of the forward's 16-row chunks
// and a partial one of each; columns a vector multiple, a ragged width and one; with and without
// the branch LayerNorm (NormFormer, Pre-LN); dropout off and on.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/backend.h"
#include "core/ops/composed_ops.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::ExpectSameBits;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;
using ::nf::testing::ToDoubles;

Tensor Random(Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return MakeTensor(DType::kF32, shape, RandomFloats(NumElements(shape), seed, lo, hi));
}

// Everything one forward + backward of the op reads and writes.
struct Case {
  Tensor x, branch, dy, d_residual_in;
  Tensor branch_weight, branch_bias, branch_mean, branch_rstd;
  Tensor residual, weight, bias, y, mean, rstd, scratch;
  Tensor d_residual, d_branch, dweight, dbias, d_branch_weight, d_branch_bias;
  bool norms_branch;

  Case(int64_t rows, int64_t cols, bool norms_branch, uint32_t seed) : norms_branch(norms_branch) {
    // An out_proj output of a few units on a residual stream with a non-zero mean.
    x = Random({rows, cols}, seed, -2.0f, 3.0f);
    branch = Random({rows, cols}, seed + 1, -4.0f, 4.0f);
    dy = Random({rows, cols}, seed + 2);
    branch_weight = Random({cols}, seed + 3, 0.5f, 1.5f);
    branch_bias = Random({cols}, seed + 4, -0.2f, 0.2f);
    weight = Random({cols}, seed + 5, 0.5f, 1.5f);
    bias = Random({cols}, seed + 6, -0.2f, 0.2f);
    branch_mean = MakeZeros(DType::kF32, {rows});
    branch_rstd = MakeZeros(DType::kF32, {rows});
    residual = MakeZeros(DType::kF32, {rows, cols});
    y = MakeZeros(DType::kF32, {rows, cols});
    mean = MakeZeros(DType::kF32, {rows});
    rstd = MakeZeros(DType::kF32, {rows});
    scratch = MakeZeros(DType::kF32, {rows, cols});
    // The gradient from after the block, and accumulated gradients starting non-zero.
    d_residual = Random({rows, cols}, seed + 7);
    d_branch = MakeZeros(DType::kF32, {rows, cols});
    dweight = Random({cols}, seed + 8);
    dbias = Random({cols}, seed + 9);
    d_branch_weight = Random({cols}, seed + 10);
    d_branch_bias = Random({cols}, seed + 11);
  }

  ops::ResidualNormArgs Forward(const ops::DropoutSpec& dropout) const {
    ops::ResidualNormArgs args{.dropout = dropout,
                               .x = x,
                               .branch = branch,
                               .residual = residual,
                               .weight = weight,
                               .bias = bias,
                               .y = y,
                               .mean = mean,
                               .rstd = rstd,
                               .scratch = scratch};
    if (norms_branch) {
      args.branch_weight = branch_weight;
      args.branch_bias = branch_bias;
      args.branch_mean = branch_mean;
      args.branch_rstd = branch_rstd;
    }
    return args;
  }
  ops::ResidualNormBackwardArgs Backward(const ops::DropoutSpec& dropout) const {
    ops::ResidualNormBackwardArgs args{.dropout = dropout,
                                       .dy = dy,
                                       .residual = residual,
                                       .weight = weight,
                                       .mean = mean,
                                       .rstd = rstd,
                                       .branch = branch,
                                       .d_residual = d_residual,
                                       .d_branch = d_branch,
                                       .dweight = dweight,
                                       .dbias = dbias,
                                       .scratch = scratch};
    if (norms_branch) {
      args.branch_weight = branch_weight;
      args.branch_mean = branch_mean;
      args.branch_rstd = branch_rstd;
      args.d_branch_weight = d_branch_weight;
      args.d_branch_bias = d_branch_bias;
    }
    return args;
  }
};

TEST(ResidualNormTest, FusedEqualsTheUnfusedOpsBitForBit) {
  auto backend = ops::BackendFor(Device::Cpu());
  NF_ASSERT_OK(backend);
  const ops::DropoutSpec dropouts[] = {
      {},
      {.p = 0.1f, .seed = 7, .site = 11, .first_sample = 3, .seq_len = 5},
      // A sequence-parallel shard starting inside a sample.
      {.p = 0.1f, .seed = 7, .site = 11, .first_sample = 3, .seq_len = 5, .token_offset = 12},
  };
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{130, 128}, {70, 37}, {3, 1}}) {
    for (const bool norms_branch : {true, false}) {
      for (const ops::DropoutSpec& dropout : dropouts) {
        const std::string what = absl::StrCat(
            rows, "x", cols, norms_branch ? " NormFormer" : " Pre-LN", " p=", dropout.p);
        const uint32_t seed = static_cast<uint32_t>(rows * cols);
        Case fused(rows, cols, norms_branch, seed), composed(rows, cols, norms_branch, seed);
        NF_ASSERT_OK(ops::ResidualNormForward(fused.Forward(dropout)));
        NF_ASSERT_OK(ops::ComposedResidualNormForward(**backend, composed.Forward(dropout)));
        for (const auto& [name, a, b] :
             {std::tuple{"residual", fused.residual, composed.residual},
              {"y", fused.y, composed.y},
              {"mean", fused.mean, composed.mean},
              {"rstd", fused.rstd, composed.rstd},
              {"branch mean", fused.branch_mean, composed.branch_mean},
              {"branch rstd", fused.branch_rstd, composed.branch_rstd}}) {
          ExpectSameBits(a, b, absl::StrCat(what, " ", name));
        }

        NF_ASSERT_OK(ops::ResidualNormBackward(fused.Backward(dropout)));
        NF_ASSERT_OK(ops::ComposedResidualNormBackward(**backend, composed.Backward(dropout)));
        for (const auto& [name, a, b] :
             {std::tuple{"d_residual", fused.d_residual, composed.d_residual},
              {"d_branch", fused.d_branch, composed.d_branch},
              {"dweight", fused.dweight, composed.dweight},
              {"dbias", fused.dbias, composed.dbias},
              {"d_branch_weight", fused.d_branch_weight, composed.d_branch_weight},
              {"d_branch_bias", fused.d_branch_bias, composed.d_branch_bias}}) {
          ExpectSameBits(a, b, absl::StrCat(what, " ", name));
        }
      }
    }
  }
}

// What the composition means, checked without it on one small case: residual = x + LayerNorm
// of the branch (mean 0, variance 1 before the affine), and without the branch LayerNorm the
// branch's gradient is the residual's total gradient.
TEST(ResidualNormTest, ResidualIsXPlusTheNormalisedBranch) {
  const int64_t rows = 2, cols = 64;
  Case c(rows, cols, /*norms_branch=*/true, 5);
  NF_ASSERT_OK(ops::Fill(c.branch_weight, 1.0f));
  NF_ASSERT_OK(ops::Fill(c.branch_bias, 0.0f));
  NF_ASSERT_OK(ops::ResidualNormForward(c.Forward({})));
  const std::vector<double> x = ToDoubles(c.x), residual = ToDoubles(c.residual);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0, squares = 0.0;
    for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
      sum += residual[i] - x[i];
      squares += (residual[i] - x[i]) * (residual[i] - x[i]);
    }
    EXPECT_NEAR(sum / cols, 0.0, 1e-5) << "row " << r;
    // The variance of a unit-variance row under eps = 1e-5 is 1 / (1 + 1e-5 / var).
    EXPECT_NEAR(squares / cols, 1.0, 1e-4) << "row " << r;
  }

  Case pre_ln(rows, cols, /*norms_branch=*/false, 5);
  NF_ASSERT_OK(ops::ResidualNormForward(pre_ln.Forward({})));
  NF_ASSERT_OK(ops::ResidualNormBackward(pre_ln.Backward({})));
  EXPECT_EQ(ToDoubles(pre_ln.d_branch), ToDoubles(pre_ln.d_residual));
  EXPECT_NE(ToDoubles(pre_ln.d_residual), ToDoubles(Case(rows, cols, false, 5).d_residual))
      << "the LayerNorm's input gradient was not added";
}

TEST(ResidualNormTest, RejectsBadArguments) {
  Case c(4, 8, /*norms_branch=*/true, 1);
  ops::ResidualNormArgs forward = c.Forward({});
  forward.scratch = MakeZeros(DType::kF32, {4, 7});
  ExpectInvalidArgument(ops::ResidualNormForward(forward), "ResidualNormForward", "scratch");
  forward = c.Forward({});
  forward.branch_mean = MakeZeros(DType::kF32, {3});
  ExpectInvalidArgument(ops::ResidualNormForward(forward),
                        "ResidualNormForward (LayerNorm of the branch)", "mean");
  forward = c.Forward({});
  forward.y = c.residual;
  ExpectInvalidArgument(ops::ResidualNormForward(forward), "ResidualNormForward", "share memory");
  forward = c.Forward({.p = 1.0f});
  ExpectInvalidArgument(ops::ResidualNormForward(forward), "ResidualNormForward", "dropout");

  ops::ResidualNormBackwardArgs backward = c.Backward({});
  backward.d_branch = c.d_residual;
  ExpectInvalidArgument(ops::ResidualNormBackward(backward), "ResidualNormBackward",
                        "share memory");
  // In place over the branch: a fused backend reads the branch after writing d_branch.
  backward = c.Backward({});
  backward.d_branch = backward.branch;
  ExpectInvalidArgument(ops::ResidualNormBackward(backward), "ResidualNormBackward",
                        "d_branch and branch share memory");
  backward = c.Backward({});
  backward.d_branch_weight = MakeZeros(DType::kF32, {7});
  ExpectInvalidArgument(ops::ResidualNormBackward(backward),
                        "ResidualNormBackward (LayerNorm of the branch)", "dweight");
  Case pre_ln(4, 8, /*norms_branch=*/false, 1);
  backward = pre_ln.Backward({});
  backward.d_branch = MakeZeros(DType::kF32, {4, 9});
  ExpectInvalidArgument(ops::ResidualNormBackward(backward), "ResidualNormBackward", "d_branch");
}

}  // namespace
}  // namespace nf
