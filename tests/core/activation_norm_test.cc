// NormFormer's fused FFN middle (ops::ActivationNormForward / Backward) against the unfused ops
// it stands for (core/ops/composed_ops.h) on the CPU: the fp32 kernel runs every row through
// the same row kernels as the unfused ops, so every output must be the composition's bit for bit
// (the composition itself is what layer_norm_test, isa_elementwise_test and the model reference
// tests check against float64 and fairseq). Rows span several of the backward's 64-row blocks
// and a partial one; columns a vector multiple, a ragged width and one; dropout off and on at a
// column offset (a tensor-parallel shard's); every activation.
#include <cstdint>
#include <string>
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

// Everything one forward + backward of the op reads and writes.
struct Case {
  Tensor x, weight, bias, dy;
  Tensor y, mean, rstd, dx, dweight, dbias, scratch;

  Case(int64_t rows, int64_t cols, uint32_t seed) {
    // fc1 outputs of a few units, where GELU's curvature matters; dy like a gradient.
    x = MakeTensor(DType::kF32, {rows, cols}, RandomFloats(rows * cols, seed, -4.0f, 4.0f));
    weight = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, seed + 1, 0.5f, 1.5f));
    bias = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, seed + 2, -0.2f, 0.2f));
    dy = MakeTensor(DType::kF32, {rows, cols}, RandomFloats(rows * cols, seed + 3));
    y = MakeZeros(DType::kF32, {rows, cols});
    mean = MakeZeros(DType::kF32, {rows});
    rstd = MakeZeros(DType::kF32, {rows});
    dx = MakeZeros(DType::kF32, {rows, cols});
    // Gradients accumulate: start both runs from the same non-zero values.
    dweight = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, seed + 4));
    dbias = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, seed + 5));
    scratch = MakeZeros(DType::kF32, {rows, cols});
  }

  ops::ActivationNormArgs Forward(ops::Activation act, const ops::DropoutSpec& dropout) const {
    return {.act = act,
            .dropout = dropout,
            .x = x,
            .weight = weight,
            .bias = bias,
            .y = y,
            .mean = mean,
            .rstd = rstd,
            .scratch = scratch};
  }
  ops::ActivationNormBackwardArgs Backward(ops::Activation act,
                                           const ops::DropoutSpec& dropout) const {
    return {.act = act,
            .dropout = dropout,
            .dy = dy,
            .x = x,
            .weight = weight,
            .mean = mean,
            .rstd = rstd,
            .dx = dx,
            .dweight = dweight,
            .dbias = dbias,
            .scratch = scratch};
  }
};

TEST(ActivationNormTest, FusedEqualsTheUnfusedOpsBitForBit) {
  auto backend = ops::BackendFor(Device::Cpu());
  NF_ASSERT_OK(backend);
  const ops::Activation activations[] = {ops::Activation::kGelu, ops::Activation::kGeluTanh,
                                         ops::Activation::kReluSquared};
  const ops::DropoutSpec dropouts[] = {
      {},
      {.p = 0.1f, .seed = 7, .site = 11, .first_sample = 3, .seq_len = 5, .col_offset = 2},
  };
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{130, 512}, {70, 37}, {3, 1}}) {
    for (ops::Activation act : activations) {
      for (const ops::DropoutSpec& dropout : dropouts) {
        const std::string what =
            absl::StrCat(rows, "x", cols, " activation ", static_cast<int>(act), " p=", dropout.p);
        const uint32_t seed = static_cast<uint32_t>(rows * cols);
        Case fused(rows, cols, seed), composed(rows, cols, seed);
        NF_ASSERT_OK(ops::ActivationNormForward(fused.Forward(act, dropout)));
        NF_ASSERT_OK(ops::ComposedActivationNormForward(**backend, composed.Forward(act, dropout)));
        ExpectSameBits(fused.y, composed.y, what + " y");
        ExpectSameBits(fused.mean, composed.mean, what + " mean");
        ExpectSameBits(fused.rstd, composed.rstd, what + " rstd");

        NF_ASSERT_OK(ops::ActivationNormBackward(fused.Backward(act, dropout)));
        NF_ASSERT_OK(
            ops::ComposedActivationNormBackward(**backend, composed.Backward(act, dropout)));
        ExpectSameBits(fused.dx, composed.dx, what + " dx");
        ExpectSameBits(fused.dweight, composed.dweight, what + " dweight");
        ExpectSameBits(fused.dbias, composed.dbias, what + " dbias");
      }
    }
  }
}

// The dropout really is applied: a dropped element's column gets no dbias contribution from
// that row, and p changes y.
TEST(ActivationNormTest, DropoutChangesTheResult) {
  Case off(8, 64, 1), on(8, 64, 1);
  NF_ASSERT_OK(ops::ActivationNormForward(off.Forward(ops::Activation::kGelu, {})));
  NF_ASSERT_OK(ops::ActivationNormForward(
      on.Forward(ops::Activation::kGelu, {.p = 0.5f, .seed = 1, .site = 2, .seq_len = 8})));
  int differing = 0;
  for (int64_t i = 0; i < off.y.numel(); ++i) {
    differing += off.y.data<float>()[i] != on.y.data<float>()[i];
  }
  EXPECT_EQ(differing, off.y.numel());  // every row renormalised after the drops
}

TEST(ActivationNormTest, RejectsBadArguments) {
  Case c(4, 8, 1);
  ops::ActivationNormArgs forward = c.Forward(ops::Activation::kGelu, {});
  forward.scratch = MakeZeros(DType::kF32, {4, 7});
  ExpectInvalidArgument(ops::ActivationNormForward(forward), "ActivationNormForward", "scratch");
  forward = c.Forward(ops::Activation::kGelu, {.p = 1.0f});
  ExpectInvalidArgument(ops::ActivationNormForward(forward), "ActivationNormForward", "dropout");

  ops::ActivationNormBackwardArgs backward = c.Backward(ops::Activation::kGelu, {});
  backward.dx = c.dy;
  ExpectInvalidArgument(ops::ActivationNormBackward(backward), "ActivationNormBackward",
                        "dx must not be dy");
  backward = c.Backward(ops::Activation::kGelu, {});
  backward.dweight = MakeZeros(DType::kF32, {7});
  ExpectInvalidArgument(ops::ActivationNormBackward(backward), "ActivationNormBackward", "dweight");
}

}  // namespace
}  // namespace nf
