// Every op of the CUDA backend against its CPU twin (core/cpu, itself tested against float64
// references in tests/core), for fp32, fp16 and bf16 storage.
//
// Tolerances are relative to the largest magnitude of the CPU result (ExpectTwinClose):
// - kElementwise (4 u32): GPU erff/expf/tanhf are within 2 ulp of the true value, the CPU's
//   within 1, and each side rounds once more.
// - kReduction (2e-5): sums of up to a few hundred terms in a different order, each side
//   within n * u32 of the exact sum relative to the sum of magnitudes, which stays within a
//   small multiple of the result's largest magnitude for these inputs.
// - plus 2 u(dtype) for 16-bit results: a sum that differs in its last fp32 bits can round to
//   the neighbouring fp16/bf16 value (one ulp = 2 u, relative).
// Dropout masks, permutations and copies must be identical bit for bit.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/outstanding_communication.h"
#include "core/cuda/pinned_staging.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using testing::ExpectTwinClose;
using testing::ExpectTwinIdentical;
using testing::kElementwise;
using testing::kGpu;
using testing::kReduction;
using testing::MakeIds;
using testing::MakeTwin;
using testing::OnBoth;
using testing::RandomTwin;
using testing::ScopedAttentionPolicy;
using testing::Tol;
using testing::Twin;
using testing::UnitRoundoff;
using testing::ZerosTwin;

class CudaOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { NF_REQUIRE_GPU(); }
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaOpsTest, GemmAllTranspositionsAndBatches) {
  const int64_t m = 37, k = 53, n = 29;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      Twin a = RandomTwin(dtype(), trans_a ? Shape{k, m} : Shape{m, k}, 1);
      Twin b = RandomTwin(dtype(), trans_b ? Shape{n, k} : Shape{k, n}, 2);
      Twin c = RandomTwin(dtype(), {m, n}, 3);
      OnBoth([&](auto on) {
        return ops::Gemm({on(a), on(b), on(c), trans_a, trans_b, 0.5f, 1.0f});
      });
      ExpectTwinClose(c, Tol(dtype(), kReduction), "Gemm");
    }
  }
  // Batched A with a B shared by every batch (the attention-free layers never need it, the
  // op table allows it), into fp32 C accumulating (main grads).
  Twin a = RandomTwin(dtype(), {3, m, k}, 4);
  Twin b = RandomTwin(dtype(), {k, n}, 5);
  Twin c = RandomTwin(DType::kF32, {3, m, n}, 6);
  OnBoth([&](auto on) { return ops::Gemm({on(a), on(b), on(c), false, false, 1.0f, 1.0f}); });
  ExpectTwinClose(c, kReduction, "batched Gemm into fp32");
}

// The bias in cuBLASLt's epilogue (the linear layers' forward), with beta 0 and 1, against the
// CPU's product then AddBias; and an fp32 product into this dtype (the staged path, bias after).
TEST_P(CudaOpsTest, GemmWithBiasEpilogue) {
  const int64_t m = 45, k = 64, n = 96;
  for (const float beta : {0.0f, 1.0f}) {
    Twin a = RandomTwin(dtype(), {m, k}, 21);
    Twin b = RandomTwin(dtype(), {n, k}, 22);
    Twin c = RandomTwin(dtype(), {m, n}, 23);
    Twin bias = RandomTwin(dtype(), {n}, 24);
    OnBoth([&](auto on) {
      return ops::Gemm(
          {.a = on(a), .b = on(b), .c = on(c), .trans_b = true, .beta = beta, .bias = on(bias)});
    });
    ExpectTwinClose(c, Tol(dtype(), kReduction), "Gemm with bias");
  }
  Twin a = RandomTwin(DType::kF32, {m, k}, 25);
  Twin b = RandomTwin(DType::kF32, {k, n}, 26);
  Twin c = RandomTwin(dtype(), {m, n}, 27);
  Twin bias = RandomTwin(dtype(), {n}, 28);
  OnBoth(
      [&](auto on) { return ops::Gemm({.a = on(a), .b = on(b), .c = on(c), .bias = on(bias)}); });
  ExpectTwinClose(c, Tol(dtype(), kReduction), "fp32 Gemm with bias into this dtype");
}

// A bias only 2 elements past an aligned address (4 bytes in fp16/bf16, 8 in fp32): below the
// epilogue's 16 bytes, so the GEMM runs without it and the bias is added after; the result is
// the CPU's, and the device reports no fault (a misaligned epilogue read would).
TEST_P(CudaOpsTest, GemmWithAMisalignedBiasAddsItAfter) {
  const int64_t m = 45, k = 64, n = 96;
  Twin a = RandomTwin(dtype(), {m, k}, 31);
  Twin b = RandomTwin(dtype(), {n, k}, 32);
  Twin c = RandomTwin(dtype(), {m, n}, 33);
  Twin storage = RandomTwin(dtype(), {n + 2}, 34);
  const Twin bias = {*storage.cpu.View(2, {n}), *storage.gpu.View(2, {n})};
  OnBoth([&](auto on) {
    return ops::Gemm({.a = on(a), .b = on(b), .c = on(c), .trans_b = true, .bias = on(bias)});
  });
  ExpectTwinClose(c, Tol(dtype(), kReduction), "Gemm with a misaligned bias");
}

TEST_P(CudaOpsTest, BiasAndActivations) {
  Twin x = RandomTwin(dtype(), {300, 70}, 7, -3.0f, 3.0f);
  Twin bias = RandomTwin(dtype(), {70}, 8);
  OnBoth([&](auto on) { return ops::AddBias(on(x), on(bias)); });
  ExpectTwinClose(x, Tol(dtype(), kElementwise), "AddBias");

  Twin dbias = RandomTwin(DType::kF32, {70}, 9);
  OnBoth([&](auto on) { return ops::BiasBackward(on(x), on(dbias)); });
  ExpectTwinClose(dbias, kReduction, "BiasBackward");

  for (ops::Activation act :
       {ops::Activation::kGelu, ops::Activation::kGeluTanh, ops::Activation::kReluSquared}) {
    Twin y = ZerosTwin(dtype(), {300, 70});
    Twin dy = RandomTwin(dtype(), {300, 70}, 10);
    Twin dx = ZerosTwin(dtype(), {300, 70});
    OnBoth([&](auto on) { return ops::ActivationForward(act, on(x), on(y)); });
    OnBoth([&](auto on) { return ops::ActivationBackward(act, on(x), on(dy), on(dx)); });
    ExpectTwinClose(y, Tol(dtype(), kElementwise), "ActivationForward");
    ExpectTwinClose(dx, Tol(dtype(), kElementwise), "ActivationBackward");
  }
}

TEST_P(CudaOpsTest, DropoutMasksAreTheCpus) {
  // 37 columns starting at global column 6: groups of four columns straddle the shard edges.
  Twin x = RandomTwin(dtype(), {20, 37}, 11);
  Twin y = ZerosTwin(dtype(), {20, 37});
  const ops::DropoutSpec spec{.p = 0.3f,
                              .seed = 17,
                              .site = 5,
                              .first_sample = 9,
                              .seq_len = 5,
                              .col_offset = 6,
                              .head_offset = 0};
  OnBoth([&](auto on) { return ops::Dropout(on(x), on(y), spec); });
  ExpectTwinIdentical(y, "Dropout");
}

TEST_P(CudaOpsTest, ChannelScalesAndHeadLayout) {
  for (int64_t inner : {1, 16}) {
    Twin x = RandomTwin(dtype(), {6, 12, inner}, 12);
    Twin scale = RandomTwin(dtype(), {12}, 13, 0.5f, 1.5f);
    Twin y = ZerosTwin(dtype(), {6, 12, inner});
    Twin dy = RandomTwin(dtype(), {6, 12, inner}, 14);
    Twin dx = ZerosTwin(dtype(), {6, 12, inner});
    Twin dscale = RandomTwin(DType::kF32, {12}, 15);
    OnBoth([&](auto on) { return ops::ScaleChannels(on(x), on(scale), inner, on(y)); });
    OnBoth([&](auto on) {
      return ops::ScaleChannelsBackward(on(x), on(scale), inner, on(dy), on(dx), on(dscale));
    });
    ExpectTwinClose(y, Tol(dtype(), kElementwise), "ScaleChannels");
    ExpectTwinClose(dx, Tol(dtype(), kElementwise), "ScaleChannelsBackward dx");
    ExpectTwinClose(dscale, kReduction, "ScaleChannelsBackward dscale");
  }
  Twin tokens = RandomTwin(dtype(), {2 * 7, 3 * 8}, 16);
  Twin heads = ZerosTwin(dtype(), {2, 3, 7, 8});
  Twin back = ZerosTwin(dtype(), {2 * 7, 3 * 8});
  OnBoth([&](auto on) { return ops::SplitHeads(on(tokens), on(heads)); });
  OnBoth([&](auto on) { return ops::MergeHeads(on(heads), on(back)); });
  ExpectTwinIdentical(heads, "SplitHeads");
  ExpectTwinIdentical(back, "MergeHeads");
}

TEST_P(CudaOpsTest, LayerNormLocalAndTensorParallel) {
  for (int64_t cols : {96, 300}) {
    const int64_t rows = 130;
    Twin x = RandomTwin(dtype(), {rows, cols}, 17, -2.0f, 4.0f);
    Twin w = RandomTwin(dtype(), {cols}, 18, 0.5f, 1.5f);
    Twin b = RandomTwin(dtype(), {cols}, 19);
    Twin y = ZerosTwin(dtype(), {rows, cols});
    Twin mean = ZerosTwin(DType::kF32, {rows});
    Twin rstd = ZerosTwin(DType::kF32, {rows});
    OnBoth([&](auto on) {
      return ops::LayerNormForward({on(x), on(w), on(b), on(y), on(mean), on(rstd), 1e-5f});
    });
    ExpectTwinClose(y, Tol(dtype(), kReduction), "LayerNormForward y");
    ExpectTwinClose(rstd, kReduction, "LayerNormForward rstd");

    Twin dy = RandomTwin(dtype(), {rows, cols}, 20);
    Twin dx = ZerosTwin(dtype(), {rows, cols});
    Twin dw = ZerosTwin(DType::kF32, {cols});
    Twin db = ZerosTwin(DType::kF32, {cols});
    OnBoth([&](auto on) {
      return ops::LayerNormBackward(
          {on(dy), on(x), on(w), on(mean), on(rstd), on(dx), on(dw), on(db)});
    });
    ExpectTwinClose(dx, Tol(dtype(), kReduction), "LayerNormBackward dx");
    ExpectTwinClose(dw, kReduction, "LayerNormBackward dweight");
    ExpectTwinClose(db, kReduction, "LayerNormBackward dbias");

    // The tensor-parallel path as one rank of a group of one: partial statistics are the
    // global ones.
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
    ExpectTwinClose(y, Tol(dtype(), kReduction), "LayerNormForwardFromStats");
    ExpectTwinClose(sums, kReduction, "LayerNormBackwardPartialSums");
    ExpectTwinClose(dx, Tol(dtype(), kReduction), "LayerNormBackwardFromSums dx");
    ExpectTwinClose(dw, kReduction, "LayerNormBackwardFromSums dweight");
  }
}

TEST_P(CudaOpsTest, SoftmaxWithAMaskedRow) {
  Tensor host = testing::MakeTensor(dtype(), {4, 50}, testing::RandomFloats(200, 21, -4, 4));
  std::vector<float> values = ToFloatVector(host).value();
  for (int c = 0; c < 50; ++c) values[50 + c] = -std::numeric_limits<float>::infinity();
  Twin x = MakeTwin(testing::MakeTensor(dtype(), {4, 50}, values));
  Twin y = ZerosTwin(dtype(), {4, 50});
  Twin dy = RandomTwin(dtype(), {4, 50}, 22);
  Twin dx = ZerosTwin(dtype(), {4, 50});
  OnBoth([&](auto on) { return ops::SoftmaxForward(on(x), on(y)); });
  OnBoth([&](auto on) { return ops::SoftmaxBackward(on(y), on(dy), on(dx)); });
  ExpectTwinClose(y, Tol(dtype(), kReduction), "SoftmaxForward");
  ExpectTwinClose(dx, Tol(dtype(), kReduction), "SoftmaxBackward");
}

// The own attention kernels' forward and backward with dropout, causal or not, against the CPU.
// seq 45 spans two 32-key tiles and ends inside a block of 8 rows (without the causal mask, the
// second key tile of every row holds 13 keys and 19 lanes past the sequence); head_dim 80 leaves
// part of the third 32-wide chunk empty (the 2.7B model's head size). NF_ATTENTION=own: on a GPU
// fp16/bf16 with dropout would otherwise take cuDNN, whose masks are not the CPU's
// (cudnn_attention_test.cc checks that path).
void ExpectAttentionWithDropoutMatchesTheCpu(DType dtype, bool causal) {
  const ScopedAttentionPolicy own("own");
  for (int64_t dim : {64, 80}) {
    const Shape shape{2, 3, 45, dim};
    Twin q = RandomTwin(dtype, shape, 23), k = RandomTwin(dtype, shape, 24);
    Twin v = RandomTwin(dtype, shape, 25), dout = RandomTwin(dtype, shape, 26);
    Twin out = ZerosTwin(dtype, shape), lse = ZerosTwin(DType::kF32, {2, 3, 45});
    Twin dq = ZerosTwin(dtype, shape), dk = ZerosTwin(dtype, shape);
    Twin dv = ZerosTwin(dtype, shape);
    const ops::DropoutSpec dropout{.p = 0.1f,
                                   .seed = 3,
                                   .site = 9,
                                   .first_sample = 7,
                                   .seq_len = 1,
                                   .col_offset = 0,
                                   .head_offset = 2};
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    OnBoth([&](auto on) {
      NF_RETURN_IF_ERROR(
          ops::AttentionForward({on(q), on(k), on(v), on(out), on(lse), scale, dropout, causal}));
      return ops::AttentionBackward({on(q), on(k), on(v), on(out), on(lse), on(dout), on(dq),
                                     on(dk), on(dv), scale, dropout, causal});
    });
    ExpectTwinClose(out, Tol(dtype, kReduction), "AttentionForward out");
    ExpectTwinClose(lse, kReduction, "AttentionForward lse");
    ExpectTwinClose(dq, Tol(dtype, kReduction), "AttentionBackward dq");
    ExpectTwinClose(dk, Tol(dtype, kReduction), "AttentionBackward dk");
    ExpectTwinClose(dv, Tol(dtype, kReduction), "AttentionBackward dv");
  }
}

TEST_P(CudaOpsTest, CausalAttentionWithDropout) {
  ExpectAttentionWithDropoutMatchesTheCpu(dtype(), /*causal=*/true);
}

TEST_P(CudaOpsTest, NonCausalAttentionWithDropout) {
  ExpectAttentionWithDropoutMatchesTheCpu(dtype(), /*causal=*/false);
}

TEST_P(CudaOpsTest, KvCacheAttentionAppendsAndAttendsThePrefix) {
  // 37 cached rows then 3 new tokens, in a cache of 48 rows; head_dim 80 as above. Both the new
  // rows of the caches and the outputs must match the CPU's.
  for (int64_t dim : {64, 80}) {
    const Shape fresh{2, 3, 3, dim}, cache{2, 3, 48, dim};
    Twin q = RandomTwin(dtype(), fresh, 31), k = RandomTwin(dtype(), fresh, 32);
    Twin v = RandomTwin(dtype(), fresh, 33), out = ZerosTwin(dtype(), fresh);
    Twin k_cache = RandomTwin(dtype(), cache, 34), v_cache = RandomTwin(dtype(), cache, 35);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    OnBoth([&](auto on) {
      return ops::KvCacheAttention({.q = on(q),
                                    .k = on(k),
                                    .v = on(v),
                                    .k_cache = on(k_cache),
                                    .v_cache = on(v_cache),
                                    .out = on(out),
                                    .past = 37,
                                    .scale = scale});
    });
    ExpectTwinClose(out, Tol(dtype(), kReduction), "KvCacheAttention out");
    ExpectTwinIdentical(k_cache, "KvCacheAttention k_cache");
    ExpectTwinIdentical(v_cache, "KvCacheAttention v_cache");
  }
}

TEST_P(CudaOpsTest, VocabParallelEmbeddingAndCrossEntropy) {
  // This rank holds global ids [40, 72) of a 100-word vocabulary padded to 104.
  const std::vector<int32_t> ids = {41, 3, 41, 71, 99, 40, 41, 55, 3, 70};
  Twin id_twin = MakeTwin(MakeIds({10}, ids));
  Twin table = RandomTwin(dtype(), {32, 24}, 27);
  Twin out = ZerosTwin(dtype(), {10, 24});
  Twin dout = RandomTwin(dtype(), {10, 24}, 28);
  Twin dtable = RandomTwin(DType::kF32, {32, 24}, 29);
  OnBoth([&](auto on) {
    NF_RETURN_IF_ERROR(ops::EmbeddingForward({on(id_twin), on(table), on(out), 40, 100}));
    return ops::EmbeddingBackward(on(id_twin), on(dout), on(dtable), 40);
  });
  ExpectTwinIdentical(out, "EmbeddingForward");
  ExpectTwinClose(dtable, kReduction, "EmbeddingBackward");

  // Logits for global columns [64, 104) of a 100-word vocabulary: the last 4 are padding.
  const std::vector<int32_t> targets = {64, 99, 5, -1, 70, 100 - 1, 0, 66};
  Twin target_twin = MakeTwin(MakeIds({8}, targets));
  Twin logits = RandomTwin(dtype(), {8, 40}, 30, -5.0f, 5.0f);
  Twin row_max = ZerosTwin(DType::kF32, {8}), sum_exp = ZerosTwin(DType::kF32, {8});
  Twin target_logit = ZerosTwin(DType::kF32, {8}), loss = ZerosTwin(DType::kF32, {8});
  Twin dloss = RandomTwin(DType::kF32, {8}, 31);
  Twin dlogits = ZerosTwin(dtype(), {8, 40});
  OnBoth([&](auto on) {
    const ops::CrossEntropyArgs args{on(logits), on(target_twin), 64, 100};
    NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(args, on(row_max)));
    NF_RETURN_IF_ERROR(ops::CrossEntropySumExp(args, on(row_max), on(sum_exp), on(target_logit)));
    NF_RETURN_IF_ERROR(ops::CrossEntropyLoss(on(target_twin), on(row_max), on(sum_exp),
                                             on(target_logit), on(loss)));
    return ops::CrossEntropyBackward(args, on(row_max), on(sum_exp), on(dloss), on(dlogits));
  });
  ExpectTwinIdentical(row_max, "CrossEntropyRowMax");
  ExpectTwinClose(sum_exp, kReduction, "CrossEntropySumExp");
  ExpectTwinIdentical(target_logit, "CrossEntropySumExp target logit");
  ExpectTwinClose(loss, kReduction, "CrossEntropyLoss");
  ExpectTwinClose(dlogits, Tol(dtype(), kReduction), "CrossEntropyBackward");

  // The step's loss, summed on the device over the rows with a target (row 3's -1 ignored).
  Twin totals = ZerosTwin(DType::kF64, {2});
  OnBoth([&](auto on) { return ops::AccumulateLoss(on(loss), on(target_twin), on(totals)); });
  ExpectTwinClose(totals, kReduction, "AccumulateLoss");
}

TEST_P(CudaOpsTest, CastsFillsAndBlasOne) {
  Twin x = RandomTwin(dtype(), {1000}, 32, -100.0f, 100.0f);
  for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
    Twin y = ZerosTwin(to, {1000});
    OnBoth([&](auto on) { return ops::Cast(on(x), on(y)); });
    ExpectTwinIdentical(y, "Cast");  // one round-to-nearest-even on both sides
  }
  Twin y = RandomTwin(dtype(), {1000}, 33);
  OnBoth([&](auto on) {
    NF_RETURN_IF_ERROR(ops::Scale(on(y), 0.37f));
    return ops::Axpy(-1.5f, on(x), on(y));
  });
  ExpectTwinClose(y, Tol(dtype(), kElementwise), "Scale, Axpy");
  OnBoth([&](auto on) { return ops::Fill(on(y), 2.5f); });
  ExpectTwinIdentical(y, "Fill");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(CudaOptimizerTest, AdamWUnscaleAndNormMatchTheCpu) {
  NF_REQUIRE_GPU();
  const int64_t n = 100000;  // several blocks of the norm's first pass
  Twin params = RandomTwin(DType::kF32, {n}, 34), grads = RandomTwin(DType::kF32, {n}, 35);
  Twin m = RandomTwin(DType::kF32, {n}, 36, 0.0f, 0.1f);
  Twin v = RandomTwin(DType::kF32, {n}, 37, 0.0f, 0.1f);
  OnBoth([&](auto on) {
    return ops::AdamWStep(
        {on(params), on(grads), on(m), on(v), 1e-3f, 0.9f, 0.98f, 1e-8f, 0.1f, 7});
  });
  ExpectTwinClose(params, kElementwise, "AdamW params");
  ExpectTwinClose(v, kElementwise, "AdamW exp_avg_sq");

  Twin norm = ZerosTwin(DType::kF32, {1});
  OnBoth([&](auto on) { return ops::SquaredNorm(on(grads), on(norm)); });
  ExpectTwinClose(norm, 1e-6, "SquaredNorm");  // both sum in double

  Twin found = ZerosTwin(DType::kF32, {1});
  OnBoth([&](auto on) { return ops::UnscaleAndCheck(on(grads), 0.5f, on(found)); });
  ExpectTwinIdentical(grads, "UnscaleAndCheck grads");
  ExpectTwinIdentical(found, "UnscaleAndCheck with finite grads");
  Tensor overflow = testing::MakeTensor(DType::kF32, {3}, {1.0f, 3e38f, 2.0f});
  Twin big = MakeTwin(overflow);
  OnBoth([&](auto on) { return ops::UnscaleAndCheck(on(big), 4.0f, on(found)); });
  ExpectTwinIdentical(found, "UnscaleAndCheck with an overflow");
}

// The check before an AdamW step says, on each backend, exactly what that backend's update then
// does to an fp16 copy of the master: one element per case (the flag covers a whole tensor),
// moved by ~1 (lr 1, gradient -1, step 1) to 65504 (largest finite), 65519.996 (rounds to
// 65504), 65520 (rounds to inf) and past it, or nowhere near. The CPU and GPU agree too: the
// step's error (~2e-7, FMA or not) is far below half an fp32 ulp at these values, so both
// round to the same master.
TEST(CudaOptimizerTest, AdamWOverflowCheckAgreesWithTheUpdate) {
  NF_REQUIRE_GPU();
  for (const float start : {65503.0f, 65519.0f - 0x1p-8f, 65519.0f, 65599.0f, 1000.5f, -65519.0f}) {
    SCOPED_TRACE(start);
    const float grad = start < 0 ? 1.0f : -1.0f;  // outwards
    Twin p = MakeTwin(testing::MakeTensor(DType::kF32, {1}, {start}));
    Twin g = MakeTwin(testing::MakeTensor(DType::kF32, {1}, {grad}));
    Twin m = ZerosTwin(DType::kF32, {1}), v = ZerosTwin(DType::kF32, {1});
    Twin found = ZerosTwin(DType::kF32, {1});
    auto args = [&](auto on) {
      return ops::AdamWArgs{on(p), on(g), on(m), on(v), 1.0f, 0.9f, 0.98f, 1e-8f, 0.0f, 1};
    };
    OnBoth(
        [&](auto on) { return ops::AdamWWouldOverflow(args(on), 1.0f, DType::kF16, on(found)); });
    ExpectTwinIdentical(found, "the verdict");
    ExpectTwinIdentical(p, "nothing written");
    OnBoth([&](auto on) { return ops::AdamWStep(args(on)); });
    Twin half = ZerosTwin(DType::kF16, {1});
    OnBoth([&](auto on) { return ops::Cast(on(p), on(half)); });
    ExpectTwinIdentical(p, "the updated master");
    const double verdict = testing::ToDoubles(testing::ToCpu(found.gpu))[0];
    const double model = testing::ToDoubles(testing::ToCpu(half.gpu))[0];
    EXPECT_EQ(verdict != 0.0, std::isinf(model)) << "model " << model;
  }
}

TEST(CudaFaultTest, BadTokenIdIsReportedAtSynchronize) {
  NF_REQUIRE_GPU();
  Twin ids = MakeTwin(MakeIds({3}, {1, 7, 2}));
  Twin table = RandomTwin(DType::kF32, {5, 4}, 38);
  Twin out = ZerosTwin(DType::kF32, {3, 4});
  const absl::Status cpu = ops::EmbeddingForward({ids.cpu, table.cpu, out.cpu, 0, 5});
  NF_ASSERT_OK(ops::EmbeddingForward({ids.gpu, table.gpu, out.gpu, 0, 5}));
  const absl::Status gpu = ops::Synchronize(kGpu);
  EXPECT_EQ(gpu, cpu);  // the same message: "token id 7 at position 1 is outside [0, 5)"
  NF_EXPECT_OK(ops::Synchronize(kGpu)) << "a reported fault is cleared";
}

// A gate on a stream: work queued after it runs only once Open() is called (a host function
// that the stream must finish first). No test depends on its timing: the watchdog opens it
// after `deadline` (a minute) only so that a host call that waits for the stream fails the test
// instead of hanging it; forced() says it did.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream, std::chrono::seconds deadline = std::chrono::seconds(60))
      : stream_(stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamGate::Hold, this), cudaSuccess);
    watchdog_ = std::thread([this, deadline] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, deadline, [this] { return open_; })) {
        forced_ = open_ = true;
        cv_.notify_all();
      }
    });
  }
  // Waits for Hold to have run: until then the stream still holds `this` (a gate destroyed before
  // its stream reached Hold had Hold lock a destroyed mutex: EINVAL, std::terminate).
  ~StreamGate() {
    Open();
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    watchdog_.join();
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  bool forced() {
    std::lock_guard<std::mutex> lock(mutex_);
    return forced_;
  }

 private:
  static void Hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(gate->mutex_);
    gate->cv_.wait(lock, [gate] { return gate->open_; });
  }
  cudaStream_t stream_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false, forced_ = false;
  std::thread watchdog_;
};

// Token ids and targets go to the GPU through pinned buffers (core/cuda/pinned_staging.h): the
// copy returns while the stream is still held behind earlier work, the host may overwrite its
// source at once, and every copy lands with the values it had when issued, also when more
// copies are issued than there are buffers.
TEST(CudaCopyTest, HostToDeviceCopiesDoNotWaitForTheGpu) {
  NF_REQUIRE_GPU();
  auto context = cuda::CudaContext::ForDevice(0);
  NF_ASSERT_OK(context);
  auto allocator = ops::AllocatorFor(kGpu);
  NF_ASSERT_OK(allocator);
  // [16, 2048] int32: one micro-batch's ids at the 2.7B config's micro-batch 16.
  constexpr int64_t kTokens = 16 * 2048;
  auto host = Tensor::HostEmpty(DType::kI32, {kTokens});
  NF_ASSERT_OK(host);
  auto fill = [&](int copy) {
    for (int64_t i = 0; i < kTokens; ++i) host->data<int32_t>()[i] = copy * 100003 + i;
  };
  // Device memory is allocated before the stream is held: cudaMalloc may wait for the device.
  auto allocate = [&](int copies) {
    std::vector<Tensor> landed;
    for (int copy = 0; copy < copies; ++copy) {
      auto gpu = Tensor::Empty(DType::kI32, {kTokens}, **allocator);
      EXPECT_TRUE(gpu.ok()) << gpu.status();
      landed.push_back(*gpu);
    }
    return landed;
  };
  auto copy_all = [&](const std::vector<Tensor>& landed) {
    for (int copy = 0; copy < static_cast<int>(landed.size()); ++copy) {
      fill(copy);
      NF_ASSERT_OK(ops::Copy(*host, landed[copy]));
    }
  };
  auto expect_landed = [&](const std::vector<Tensor>& landed) {
    for (int copy = 0; copy < static_cast<int>(landed.size()); ++copy) {
      auto back = ops::OnHost(landed[copy]);
      NF_ASSERT_OK(back);
      for (int64_t i = 0; i < kTokens; i += 997) {
        ASSERT_EQ(back->data<int32_t>()[i], copy * 100003 + i) << "copy " << copy << " at " << i;
      }
    }
  };

  // Phase 1: the stream is held; fewer copies than buffers, so none may wait.
  constexpr int kHeldCopies = cuda::PinnedStaging::kMaxBuffers / 2;
  const std::vector<Tensor> held = allocate(kHeldCopies);
  {
    StreamGate gate((*context)->stream());
    copy_all(held);
    EXPECT_EQ(cudaStreamQuery((*context)->stream()), cudaErrorNotReady)
        << "the stream ran past the gate";
    EXPECT_FALSE(gate.forced()) << "a host-to-device copy waited for the GPU to reach it";
  }
  expect_landed(held);
  EXPECT_GE((*context)->staging().buffers(), kHeldCopies);

  // Phase 2: free-running, three times as many copies as buffers.
  const std::vector<Tensor> many = allocate(3 * cuda::PinnedStaging::kMaxBuffers);
  copy_all(many);
  expect_landed(many);
  EXPECT_LE((*context)->staging().buffers(), cuda::PinnedStaging::kMaxBuffers);
}

// Growing a pinned buffer frees the outgrown one with cudaFreeHost, which waits for every
// stream of the device, NCCL's kernels waiting for a peer included (outstanding_communication.h).
// While communication is outstanding (the NCCL communicator's count) the outgrown buffer is set
// aside instead: the copy returns although another stream is held, as such a kernel would hold it.
// The control, with nothing outstanding, shows that the growth does wait for the held stream.
TEST(CudaPinnedStagingTest, GrowingWhileCommunicationIsOutstandingWaitsForNoStream) {
  NF_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t copies = nullptr, held = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
  constexpr size_t kSmall = 4 << 10, kLarger = 128 << 10, kLargest = 256 << 10;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kLargest), cudaSuccess);
  std::vector<uint8_t> source(kLargest), landed(kLargest);
  for (size_t i = 0; i < kLargest; ++i) source[i] = static_cast<uint8_t>(i * 7 + 3);
  {
    cuda::PinnedStaging staging(0);
    // Every buffer made and small: kMaxBuffers copies in flight at once, then all idle, so a
    // larger copy has to grow one of them.
    {
      StreamGate gate(copies);
      for (int i = 0; i < cuda::PinnedStaging::kMaxBuffers; ++i) {
        NF_ASSERT_OK(staging.CopyToDevice(source.data(), device, kSmall, copies));
      }
      EXPECT_FALSE(gate.forced());
    }
    ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
    ASSERT_EQ(staging.buffers(), cuda::PinnedStaging::kMaxBuffers);
    // Copies `bytes` (a growth) while `held` is gated; true when the copy waited for it.
    const auto grow_waits_for_held_stream = [&](size_t bytes, std::chrono::seconds deadline) {
      StreamGate gate(held, deadline);
      EXPECT_TRUE(staging.CopyToDevice(source.data(), device, bytes, copies).ok());
      return gate.forced();
    };

    cuda::AddOutstandingCommunication(0, 1);
    EXPECT_FALSE(grow_waits_for_held_stream(kLarger, std::chrono::seconds(60)))
        << "a pinned buffer grown during communication waited for another stream (cudaFreeHost)";
    cuda::AddOutstandingCommunication(0, -1);
    ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(landed.data(), device, kLarger, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(std::equal(landed.begin(), landed.begin() + kLarger, source.begin()));

    // The control: a growth with nothing outstanding frees the outgrown buffers, which waits
    // for the held stream until its gate is forced open (2 s).
    EXPECT_TRUE(grow_waits_for_held_stream(kLargest, std::chrono::seconds(2)))
        << "cudaFreeHost no longer waits for the device: the set-aside above proves nothing";
    ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(landed.data(), device, kLargest, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(landed, source);
  }
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(copies), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(held), cudaSuccess);
}

TEST(CudaAllocatorTest, FreedBlocksAreReusedWithoutCudaMalloc) {
  NF_REQUIRE_GPU();
  auto* allocator = static_cast<cuda::CachingAllocator*>(*ops::AllocatorFor(kGpu));
  { auto warm = Tensor::Empty(DType::kF32, {12345}, *allocator); }
  const int64_t mallocs = allocator->stats().cuda_mallocs;
  for (int i = 0; i < 10; ++i) {
    auto t = Tensor::Empty(DType::kF32, {12345}, *allocator);
    NF_ASSERT_OK(t);
  }
  EXPECT_EQ(allocator->stats().cuda_mallocs, mallocs);
}

}  // namespace
}  // namespace nf
