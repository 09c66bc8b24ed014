// The CUDA backend's fused kernels (the residual add with the LayerNorms on either side of it,
// NormFormer's FFN LayerNorm with the activation before it, the scaled head merge) against the
// compositions they replace, run on the same GPU: equal bit for bit, as the kernels promise (same
// row reductions, same roundings); and close to the CPU within cuda_ops_test.cc's tolerances. Also
// the CUDA-event op timing.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/composed_ops.h"
#include "core/ops/op_timing.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using testing::kGpu;
using testing::OnGpu;
using testing::ToCpu;

using testing::kReduction;
double Tol(DType dtype) { return testing::Tol(dtype, kReduction); }

ops::Backend& GpuBackend() {
  auto backend = ops::BackendFor(kGpu);
  NF_EXPECT_OK(backend);
  return **backend;
}

// The fused result on the GPU against the composition's on the same GPU, bit for bit.
void ExpectIdentical(const Tensor& fused, const Tensor& composed, const std::string& what) {
  testing::ExpectTwinIdentical({ToCpu(composed), fused}, what);
}

// The fused result on the GPU against the CPU's, within tol of the CPU's largest magnitude.
void ExpectCloseToCpu(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  testing::ExpectTwinClose({cpu, gpu}, tol, what);
}

// The same host values on `device`: a copy on the host for the CPU, on GPU 0 otherwise.
Tensor On(bool gpu, const Tensor& host) {
  if (gpu) return OnGpu(host);
  auto copy = Tensor::HostEmpty(host.dtype(), host.shape());
  NF_EXPECT_OK(copy);
  NF_EXPECT_OK(ops::Copy(host, *copy));
  return *copy;
}

struct ResidualNormCase {
  bool norms_branch;
  float p;
  DType x_dtype;  // the residual stream's dtype may differ from the branch's
  int64_t cols;
};

std::string Name(const ResidualNormCase& c) {
  return std::string(c.norms_branch ? "NormFormer" : "Pre-LN") + " p=" + std::to_string(c.p) +
         " x " + std::string(DTypeName(c.x_dtype)) + " cols=" + std::to_string(c.cols);
}

// One device's copy of every tensor of a ResidualNorm forward and backward.
struct ResidualNormTensors {
  ops::ResidualNormArgs forward;
  ops::ResidualNormBackwardArgs backward;
};

ResidualNormTensors MakeResidualNormTensors(bool gpu, const ResidualNormCase& c, DType dtype) {
  const int64_t rows = 70, cols = c.cols;
  auto random = [&](DType t, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    return On(gpu, testing::MakeTensor(t, shape,
                                       testing::RandomFloats(NumElements(shape), seed, lo, hi)));
  };
  auto zeros = [&](DType t, Shape shape) { return On(gpu, testing::MakeZeros(t, shape)); };
  // Rows 70..139 of a micro-batch of 16-token samples, columns from 6 on (a tensor-parallel
  // shard): dropout's groups of 4 straddle the shard's edges and samples start mid-block.
  const ops::DropoutSpec dropout{.p = c.p,
                                 .seed = 23,
                                 .site = 4,
                                 .first_sample = 3,
                                 .seq_len = 16,
                                 .token_offset = 70,
                                 .col_offset = 6};
  ResidualNormTensors t;
  t.forward = {.dropout = dropout,
               .x = random(c.x_dtype, {rows, cols}, 1, -2.0f, 2.0f),
               .branch = random(dtype, {rows, cols}, 2, -1.0f, 3.0f),
               .residual = zeros(dtype, {rows, cols}),
               .weight = random(DType::kF32, {cols}, 3, 0.5f, 1.5f),
               .bias = random(DType::kF32, {cols}, 4),
               .y = zeros(dtype, {rows, cols}),
               .mean = zeros(DType::kF32, {rows}),
               .rstd = zeros(DType::kF32, {rows}),
               .scratch = zeros(dtype, {rows, cols})};
  t.backward = {.dropout = dropout,
                .dy = random(dtype, {rows, cols}, 5),
                .residual = t.forward.residual,
                .weight = t.forward.weight,
                .mean = t.forward.mean,
                .rstd = t.forward.rstd,
                .branch = t.forward.branch,
                .d_residual = random(dtype, {rows, cols}, 6),
                .d_branch = zeros(dtype, {rows, cols}),
                .dweight = random(DType::kF32, {cols}, 7),
                .dbias = random(DType::kF32, {cols}, 8),
                .scratch = zeros(dtype, {rows, cols})};
  if (c.norms_branch) {
    t.forward.branch_weight = random(DType::kF32, {cols}, 9, 0.5f, 1.5f);
    t.forward.branch_bias = random(DType::kF32, {cols}, 10);
    t.forward.branch_mean = zeros(DType::kF32, {rows});
    t.forward.branch_rstd = zeros(DType::kF32, {rows});
    t.backward.branch_weight = t.forward.branch_weight;
    t.backward.branch_mean = t.forward.branch_mean;
    t.backward.branch_rstd = t.forward.branch_rstd;
    t.backward.d_branch_weight = random(DType::kF32, {cols}, 11);
    t.backward.d_branch_bias = random(DType::kF32, {cols}, 12);
  }
  return t;
}

class FusedKernelsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { NF_REQUIRE_GPU(); }
  DType dtype() const { return GetParam(); }
};

TEST_P(FusedKernelsTest, ResidualNormIsTheCompositionBitForBit) {
  std::vector<ResidualNormCase> cases;
  for (bool norms_branch : {false, true}) {
    for (float p : {0.0f, 0.2f}) {
      // 300 columns: 256 threads, some with two columns; 96: three warps.
      for (int64_t cols : {300, 96}) cases.push_back({norms_branch, p, dtype(), cols});
    }
  }
  cases.push_back({true, 0.2f, DType::kF32, 300});  // an fp32 residual stream into dtype()
  for (const ResidualNormCase& c : cases) {
    SCOPED_TRACE(Name(c));
    ResidualNormTensors fused = MakeResidualNormTensors(true, c, dtype());
    ResidualNormTensors composed = MakeResidualNormTensors(true, c, dtype());
    ResidualNormTensors cpu = MakeResidualNormTensors(false, c, dtype());
    NF_ASSERT_OK(ops::ResidualNormForward(fused.forward));
    NF_ASSERT_OK(ops::ComposedResidualNormForward(GpuBackend(), composed.forward));
    NF_ASSERT_OK(ops::ResidualNormForward(cpu.forward));
    NF_ASSERT_OK(ops::ResidualNormBackward(fused.backward));
    NF_ASSERT_OK(ops::ComposedResidualNormBackward(GpuBackend(), composed.backward));
    NF_ASSERT_OK(ops::ResidualNormBackward(cpu.backward));

    const auto outputs = [](ResidualNormTensors& t) {
      std::vector<std::pair<std::string, Tensor>> named = {{"residual", t.forward.residual},
                                                           {"y", t.forward.y},
                                                           {"mean", t.forward.mean},
                                                           {"rstd", t.forward.rstd},
                                                           {"d_residual", t.backward.d_residual},
                                                           {"d_branch", t.backward.d_branch},
                                                           {"dweight", t.backward.dweight},
                                                           {"dbias", t.backward.dbias}};
      if (t.forward.norms_branch()) {
        named.insert(named.end(), {{"branch_mean", t.forward.branch_mean},
                                   {"branch_rstd", t.forward.branch_rstd},
                                   {"d_branch_weight", t.backward.d_branch_weight},
                                   {"d_branch_bias", t.backward.d_branch_bias}});
      }
      return named;
    };
    const auto fused_outputs = outputs(fused), composed_outputs = outputs(composed),
               cpu_outputs = outputs(cpu);
    for (size_t i = 0; i < fused_outputs.size(); ++i) {
      const std::string& what = fused_outputs[i].first;
      ExpectIdentical(fused_outputs[i].second, composed_outputs[i].second, what);
      // The branch LayerNorm's fp32 parameter gradients sum dz, the residual gradient after
      // it was stored in dtype(): where the two backends' fp32 input gradients differ in the
      // last bit, dz can round to neighbouring 16-bit values, so those sums carry the dtype's
      // rounding too (the emulated GPU measured 3.3e-5 of the largest for f16, 300 columns).
      const bool stored = fused_outputs[i].second.dtype() == dtype();
      const bool sums_stored = what.rfind("d_branch_", 0) == 0;
      ExpectCloseToCpu(fused_outputs[i].second, cpu_outputs[i].second,
                       stored || sums_stored ? Tol(dtype()) : kReduction, what + " vs the CPU");
    }
  }
}

TEST_P(FusedKernelsTest, ActivationNormIsTheCompositionBitForBit) {
  const int64_t rows = 70;
  for (const ops::Activation act :
       {ops::Activation::kGelu, ops::Activation::kGeluTanh, ops::Activation::kReluSquared}) {
    for (const float p : {0.0f, 0.2f}) {
      for (const int64_t cols : {300, 96}) {
        SCOPED_TRACE(absl::StrCat("activation ", static_cast<int>(act), " p=", p, " cols=", cols));
        const ops::DropoutSpec dropout{
            .p = p, .seed = 5, .site = 3, .first_sample = 2, .seq_len = 16, .col_offset = 6};
        auto host = [&](DType t, Shape shape, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
          return testing::MakeTensor(t, shape,
                                     testing::RandomFloats(NumElements(shape), seed, lo, hi));
        };
        const Tensor x = host(dtype(), {rows, cols}, 1), dy = host(dtype(), {rows, cols}, 2);
        const Tensor weight = host(DType::kF32, {cols}, 3, 0.5f, 1.5f);
        const Tensor bias = host(DType::kF32, {cols}, 4), grads = host(DType::kF32, {cols}, 5);
        struct Side {
          ops::ActivationNormArgs forward;
          ops::ActivationNormBackwardArgs backward;
        };
        const auto side = [&](bool gpu) {
          auto zeros = [&](DType t, Shape shape) { return On(gpu, testing::MakeZeros(t, shape)); };
          Side s;
          s.forward = {.act = act,
                       .dropout = dropout,
                       .x = On(gpu, x),
                       .weight = On(gpu, weight),
                       .bias = On(gpu, bias),
                       .y = zeros(dtype(), {rows, cols}),
                       .mean = zeros(DType::kF32, {rows}),
                       .rstd = zeros(DType::kF32, {rows}),
                       .scratch = zeros(dtype(), {rows, cols})};
          s.backward = {.act = act,
                        .dropout = dropout,
                        .dy = On(gpu, dy),
                        .x = s.forward.x,
                        .weight = s.forward.weight,
                        .mean = s.forward.mean,
                        .rstd = s.forward.rstd,
                        .dx = zeros(dtype(), {rows, cols}),
                        .dweight = On(gpu, grads),
                        .dbias = On(gpu, grads),
                        .scratch = zeros(dtype(), {rows, cols})};
          return s;
        };
        Side fused = side(true), composed = side(true), cpu = side(false);
        for (Side* s : {&fused, &cpu}) {
          NF_ASSERT_OK(ops::ActivationNormForward(s->forward));
          NF_ASSERT_OK(ops::ActivationNormBackward(s->backward));
        }
        NF_ASSERT_OK(ops::ComposedActivationNormForward(GpuBackend(), composed.forward));
        NF_ASSERT_OK(ops::ComposedActivationNormBackward(GpuBackend(), composed.backward));
        const auto outputs = [](const Side& s) {
          return std::vector<std::pair<std::string, Tensor>>{
              {"y", s.forward.y},    {"mean", s.forward.mean},        {"rstd", s.forward.rstd},
              {"dx", s.backward.dx}, {"dweight", s.backward.dweight}, {"dbias", s.backward.dbias}};
        };
        const auto f = outputs(fused), c = outputs(composed), h = outputs(cpu);
        for (size_t i = 0; i < f.size(); ++i) {
          ExpectIdentical(f[i].second, c[i].second, f[i].first);
          const bool stored = f[i].second.dtype() == dtype();
          ExpectCloseToCpu(f[i].second, h[i].second, stored ? Tol(dtype()) : kReduction,
                           f[i].first + " vs the CPU");
        }
      }
    }
  }
}

TEST_P(FusedKernelsTest, MergeScaledHeadsIsTheCompositionBitForBit) {
  const Shape head_shape = {2, 3, 7, 8}, token_shape = {2 * 7, 3 * 8};
  auto host = [&](DType t, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    return testing::MakeTensor(t, shape, testing::RandomFloats(NumElements(shape), seed, lo, hi));
  };
  const Tensor heads = host(dtype(), head_shape, 1), scale = host(dtype(), {3}, 2, 0.5f, 1.5f);
  const Tensor d_tokens = host(dtype(), token_shape, 3), dscale = host(DType::kF32, {3}, 4);
  struct Side {
    Tensor heads, scale, tokens, d_tokens, d_heads, dscale;
  };
  const auto side = [&](bool gpu) {
    return Side{On(gpu, heads),
                On(gpu, scale),
                On(gpu, testing::MakeZeros(dtype(), token_shape)),
                On(gpu, d_tokens),
                On(gpu, testing::MakeZeros(dtype(), head_shape)),
                On(gpu, dscale)};
  };
  Side fused = side(true), composed = side(true), cpu = side(false);
  for (Side* s : {&fused, &cpu}) {
    NF_ASSERT_OK(ops::MergeScaledHeads(s->heads, s->scale, s->tokens));
    NF_ASSERT_OK(
        ops::MergeScaledHeadsBackward(s->d_tokens, s->heads, s->scale, s->d_heads, s->dscale));
  }
  NF_ASSERT_OK(
      ops::ComposedMergeScaledHeads(GpuBackend(), composed.heads, composed.scale, composed.tokens));
  NF_ASSERT_OK(ops::ComposedMergeScaledHeadsBackward(GpuBackend(), composed.d_tokens,
                                                     composed.heads, composed.scale,
                                                     composed.d_heads, composed.dscale));
  ExpectIdentical(fused.tokens, composed.tokens, "tokens");
  ExpectIdentical(fused.d_heads, composed.d_heads, "d_heads");
  ExpectIdentical(fused.dscale, composed.dscale, "dscale");
  // One product each, rounded once on both backends: 4 u32 as cuda_ops_test.cc's elementwise.
  ExpectCloseToCpu(fused.tokens, cpu.tokens, 4 * testing::kU32 + 2 * testing::UnitRoundoff(dtype()),
                   "tokens vs the CPU");
  ExpectCloseToCpu(fused.dscale, cpu.dscale, kReduction, "dscale vs the CPU");
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, FusedKernelsTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// CUDA events around each op: the counts are the calls made, the times positive and finite.
TEST(CudaOpTimingTest, EventsTimeEveryOp) {
  NF_REQUIRE_GPU();
  const Tensor x = OnGpu(testing::MakeTensor(DType::kF32, {512, 768},
                                             testing::RandomFloats(512 * 768, 1, -1.0f, 1.0f)));
  const Tensor y = OnGpu(testing::MakeZeros(DType::kF32, {512, 768}));
  ops::SetOpTimingEnabled(true);
  ops::TakeOpTimes();
  for (int i = 0; i < 3; ++i) NF_ASSERT_OK(ops::Axpy(0.5f, x, y));
  NF_ASSERT_OK(ops::Scale(y, 2.0f));
  const std::vector<ops::OpTime> times = ops::TakeOpTimes();
  ops::SetOpTimingEnabled(false);
  ASSERT_EQ(times.size(), 2u) << ops::FormatOpTimes(times);
  for (const ops::OpTime& time : times) {
    EXPECT_EQ(time.calls, time.op == "Axpy" ? 3 : 1) << time.op;
    EXPECT_TRUE(std::isfinite(time.seconds) && time.seconds > 0.0) << time.op;
  }
}

}  // namespace
}  // namespace nf
