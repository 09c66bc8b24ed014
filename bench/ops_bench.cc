// Op benchmarks of the CPU backend. Every row reports its work rate (GFLOP/s for matrix work,
// GB/s for memory-bound ops) and its ratio to a ceiling measured at the start of the same run:
// OpenBLAS sgemm for FLOP rates, memcpy for byte rates. Medians over repetitions.
//
//   build/bench/nf-bench-ops [--benchmark_filter=Gemm] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench/ceilings.h"
#include "core/ops/backend.h"
#include "core/ops/composed_ops.h"
#include "core/ops/ops.h"
#include "core/optim/mixed_precision_optimizer.h"
#include "core/status.h"

namespace nf::bench {
namespace {

Ceilings ceilings;

Tensor Random(DType dtype, Shape shape, float scale = 1.0f) {
  std::vector<float> values(NumElements(shape));
  uint32_t state = 12345;
  for (float& v : values) {  // xorshift: fast, reproducible, no dependence on <random>
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    v = scale * (static_cast<float>(state) / 4294967296.0f - 0.5f);
  }
  return *TensorFromFloats(dtype, std::move(shape), values);
}

Tensor Zeros(DType dtype, Shape shape) { return *Tensor::HostZeros(dtype, std::move(shape)); }

// Times `op` per iteration and reports rates from the wall time of the loop (the kernels are
// multi-threaded, so CPU time of the calling thread would mislead): flops and bytes are per
// iteration.
template <typename Op>
void Run(benchmark::State& state, double flops, double bytes, Op&& op) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const absl::Status status = op();
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_second = static_cast<double>(state.iterations()) / seconds;
  if (flops > 0) {
    state.counters["GFLOP/s"] = flops * per_second / 1e9;
    state.counters["vs_sgemm"] = flops * per_second / 1e9 / ceilings.sgemm_gflops;
  }
  if (bytes > 0) {
    state.counters["GB/s"] = bytes * per_second / 1e9;
    state.counters["vs_memcpy"] = bytes * per_second / 1e9 / ceilings.memcpy_gbytes_per_s;
  }
}

// ---- GEMM: the ceiling itself, then ops::Gemm per dtype -----------------------------------------

void BM_OpenBlasSgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const AllCoresBlas all_cores;
  Run(state, 2.0 * n * n * n, 0, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    return absl::OkStatus();
  });
}

// [m, k] x [k, n] -> [m, n]; range: m, n, k.
template <DType kDType>
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  ops::GemmArgs args{
      .a = Random(kDType, {m, k}), .b = Random(kDType, {k, n}), .c = Zeros(kDType, {m, n})};
  Run(state, 2.0 * m * n * k, 0, [&] { return ops::Gemm(args); });
}

// A linear layer's forward while decoding, [m, k] x [n, k]^T (weights [out, in]) for a few
// rows m: bound by reading the weights, whose bytes are the byte rate's; range: m, n, k.
template <DType kDType>
void BM_DecodeGemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  ops::GemmArgs args{.a = Random(kDType, {m, k}),
                     .b = Random(kDType, {n, k}),
                     .c = Zeros(kDType, {m, n}),
                     .trans_b = true};
  Run(state, 2.0 * m * n * k, static_cast<double>(args.b.nbytes()),
      [&] { return ops::Gemm(args); });
}

// LayerNorm inputs: x [rows, cols] of kDType, fp32 weight and bias, outputs zeroed.
ops::LayerNormArgs LayerNormInputs(DType dtype, int64_t rows, int64_t cols) {
  return {.x = Random(dtype, {rows, cols}),
          .weight = Random(DType::kF32, {cols}),
          .bias = Random(DType::kF32, {cols}),
          .y = Zeros(dtype, {rows, cols}),
          .mean = Zeros(DType::kF32, {rows}),
          .rstd = Zeros(DType::kF32, {rows})};
}

// Attention inputs [b, h, s, d] with scale 1/8 and dropout 0.1 on the probabilities.
ops::AttentionArgs AttentionInputs(DType dtype, int64_t b, int64_t h, int64_t s, int64_t d) {
  const Shape shape{b, h, s, d};
  return {.q = Random(dtype, shape),
          .k = Random(dtype, shape),
          .v = Random(dtype, shape),
          .out = Zeros(dtype, shape),
          .lse = Zeros(DType::kF32, {b, h, s}),
          .scale = 0.125f,
          .dropout = {.p = 0.1f}};
}

// ---- LayerNorm: memory-bound, bytes = tensors read and written ---------------------------------

template <DType kDType>
void BM_LayerNormForward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::LayerNormArgs args = LayerNormInputs(kDType, rows, cols);
  Run(state, 0, 2.0 * rows * cols * SizeOf(kDType), [&] { return ops::LayerNormForward(args); });
}

template <DType kDType>
void BM_LayerNormBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::LayerNormArgs fwd = LayerNormInputs(kDType, rows, cols);
  if (!ops::LayerNormForward(fwd).ok()) state.SkipWithError("forward failed");
  ops::LayerNormBackwardArgs args{Random(kDType, {rows, cols}),
                                  fwd.x,
                                  fwd.weight,
                                  fwd.mean,
                                  fwd.rstd,
                                  Zeros(kDType, {rows, cols}),
                                  Zeros(DType::kF32, {cols}),
                                  Zeros(DType::kF32, {cols})};
  // Reads x and dy, writes dx (the parameter-gradient pass reads x and dy again).
  Run(state, 0, 3.0 * rows * cols * SizeOf(kDType), [&] { return ops::LayerNormBackward(args); });
}

// ---- Attention: causal, [batch, heads, seq, head_dim] -------------------------------------------
// FLOPs counted as the dense matrix products (2 in forward, 4 in backward, each 2*S*S*D per
// head), the convention of FlashAttention's benchmarks without the causal halving.

template <DType kDType>
void BM_AttentionForward(benchmark::State& state) {
  const int64_t b = state.range(0), h = state.range(1), s = state.range(2), d = state.range(3);
  const ops::AttentionArgs args = AttentionInputs(kDType, b, h, s, d);
  Run(state, 4.0 * b * h * s * s * d, 0, [&] { return ops::AttentionForward(args); });
}

template <DType kDType>
void BM_AttentionBackward(benchmark::State& state) {
  const int64_t b = state.range(0), h = state.range(1), s = state.range(2), d = state.range(3);
  const Shape shape{b, h, s, d};
  const ops::AttentionArgs fwd = AttentionInputs(kDType, b, h, s, d);
  if (!ops::AttentionForward(fwd).ok()) state.SkipWithError("forward failed");
  ops::AttentionBackwardArgs args{.q = fwd.q,
                                  .k = fwd.k,
                                  .v = fwd.v,
                                  .out = fwd.out,
                                  .lse = fwd.lse,
                                  .dout = Random(kDType, shape),
                                  .dq = Zeros(kDType, shape),
                                  .dk = Zeros(kDType, shape),
                                  .dv = Zeros(kDType, shape),
                                  .scale = fwd.scale,
                                  .dropout = fwd.dropout};
  Run(state, 8.0 * b * h * s * s * d, 0, [&] { return ops::AttentionBackward(args); });
}

// ---- AdamW: reads params, grads, m, v; writes params, m, v (28 bytes per parameter) ------------

// Fresh AdamW buffers for n fp32 parameters.
ops::AdamWArgs AdamWArgsOf(int64_t n) {
  return {.params = Random(DType::kF32, {n}),
          .grads = Random(DType::kF32, {n}),
          .exp_avg = Zeros(DType::kF32, {n}),
          .exp_avg_sq = Zeros(DType::kF32, {n}),
          .weight_decay = 0.01f};
}

void BM_AdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  ops::AdamWArgs args = AdamWArgsOf(n);
  int64_t step = 0;
  Run(state, 0, 28.0 * n, [&] {
    args.step = ++step;
    return ops::AdamWStep(args);
  });
}

// The check before an update (ops::AdamWWouldOverflow): the same arithmetic, reads params,
// grads, m, v and writes nothing (16 bytes per parameter); its time next to adamw_f32's is what
// the overflow check adds to an optimizer step. The model dtype is a template argument.
template <DType kModel>
void BM_AdamWWouldOverflow(benchmark::State& state) {
  const int64_t n = state.range(0);
  const ops::AdamWArgs args = AdamWArgsOf(n);
  const Tensor found = Zeros(DType::kF32, {1});
  Run(state, 0, 16.0 * n, [&] { return ops::AdamWWouldOverflow(args, 1.0f, kModel, found); });
}

// ---- Elementwise fp32: memory-bound, bytes = tensors read and written -------------------------

// act(x) over [rows, cols]: reads x, writes y.
template <ops::Activation kAct>
void BM_ActivationForward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = Random(DType::kF32, {rows, cols}, 8.0f), y = Zeros(DType::kF32, {rows, cols});
  Run(state, 0, 8.0 * rows * cols, [&] { return ops::ActivationForward(kAct, x, y); });
}

// dx = dy act'(x): reads x and dy, writes dx.
template <ops::Activation kAct>
void BM_ActivationBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = Random(DType::kF32, {rows, cols}, 8.0f), dy = Random(DType::kF32, {rows, cols});
  const Tensor dx = Zeros(DType::kF32, {rows, cols});
  Run(state, 0, 12.0 * rows * cols, [&] { return ops::ActivationBackward(kAct, x, dy, dx); });
}

// Dropout p = 0.1 over [rows, cols] at an unaligned shard offset: reads x, writes y.
void BM_Dropout(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = Random(DType::kF32, {rows, cols}), y = Zeros(DType::kF32, {rows, cols});
  const ops::DropoutSpec spec{.p = 0.1f, .seed = 7, .site = 3, .seq_len = 256, .col_offset = 5};
  Run(state, 0, 8.0 * rows * cols, [&] { return ops::Dropout(x, y, spec); });
}

// ---- The FFN middle, one micro-batch: Pre-LN's activation + dropout against NormFormer's
// fused activation + dropout + LayerNorm. Bytes: fp32 tensors read and written (forward: x in,
// the result out; backward: x and dy in, dx out).

ops::DropoutSpec FfnDropout(int64_t rows) {
  return {.p = 0.1f, .seed = 7, .site = 3, .seq_len = rows, .col_offset = 0};
}

void BM_ActivationDropoutForward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = Random(DType::kF32, {rows, cols}, 8.0f), y = Zeros(DType::kF32, {rows, cols});
  Run(state, 0, 8.0 * rows * cols, [&] {
    NF_RETURN_IF_ERROR(ops::ActivationForward(ops::Activation::kGelu, x, y));
    return ops::Dropout(y, y, FfnDropout(rows));
  });
}

void BM_ActivationDropoutBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor x = Random(DType::kF32, {rows, cols}, 8.0f), dy = Random(DType::kF32, {rows, cols});
  const Tensor dx = Zeros(DType::kF32, {rows, cols});
  Run(state, 0, 12.0 * rows * cols, [&] {
    NF_RETURN_IF_ERROR(ops::Dropout(dy, dx, FfnDropout(rows)));
    return ops::ActivationBackward(ops::Activation::kGelu, x, dx, dx);
  });
}

ops::ActivationNormArgs ActivationNormInputs(int64_t rows, int64_t cols) {
  return {.dropout = FfnDropout(rows),
          .x = Random(DType::kF32, {rows, cols}, 8.0f),
          .weight = Random(DType::kF32, {cols}),
          .bias = Random(DType::kF32, {cols}),
          .y = Zeros(DType::kF32, {rows, cols}),
          .mean = Zeros(DType::kF32, {rows}),
          .rstd = Zeros(DType::kF32, {rows}),
          .scratch = Zeros(DType::kF32, {rows, cols})};
}

void BM_ActivationNormForward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::ActivationNormArgs args = ActivationNormInputs(rows, cols);
  Run(state, 0, 8.0 * rows * cols, [&] { return ops::ActivationNormForward(args); });
}

void BM_ActivationNormBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::ActivationNormArgs fwd = ActivationNormInputs(rows, cols);
  if (!ops::ActivationNormForward(fwd).ok()) state.SkipWithError("forward failed");
  const ops::ActivationNormBackwardArgs args{.dropout = fwd.dropout,
                                             .dy = Random(DType::kF32, {rows, cols}),
                                             .x = fwd.x,
                                             .weight = fwd.weight,
                                             .mean = fwd.mean,
                                             .rstd = fwd.rstd,
                                             .dx = Zeros(DType::kF32, {rows, cols}),
                                             .dweight = Zeros(DType::kF32, {cols}),
                                             .dbias = Zeros(DType::kF32, {cols}),
                                             .scratch = fwd.scratch};
  Run(state, 0, 12.0 * rows * cols, [&] { return ops::ActivationNormBackward(args); });
}

// The residual add between the attention and feed-forward blocks with the LayerNorms around it
// (NormFormer's on the branch when state.range(2) is 1, the FFN input's always), dropout 0.1:
// fused (kComposed false) or as the unfused ops the layer ran before (true), on one backend.
ops::ResidualNormArgs ResidualNormInputs(int64_t rows, int64_t cols, bool norms_branch) {
  ops::ResidualNormArgs args{.dropout = {.p = 0.1f, .seed = 1, .site = 2, .seq_len = 64},
                             .x = Random(DType::kF32, {rows, cols}),
                             .branch = Random(DType::kF32, {rows, cols}),
                             .residual = Zeros(DType::kF32, {rows, cols}),
                             .weight = Random(DType::kF32, {cols}),
                             .bias = Random(DType::kF32, {cols}),
                             .y = Zeros(DType::kF32, {rows, cols}),
                             .mean = Zeros(DType::kF32, {rows}),
                             .rstd = Zeros(DType::kF32, {rows}),
                             .scratch = Zeros(DType::kF32, {rows, cols})};
  if (norms_branch) {
    args.branch_weight = Random(DType::kF32, {cols});
    args.branch_bias = Random(DType::kF32, {cols});
    args.branch_mean = Zeros(DType::kF32, {rows});
    args.branch_rstd = Zeros(DType::kF32, {rows});
  }
  return args;
}

ops::Backend& CpuBackend() { return **ops::BackendFor(Device::Cpu()); }

template <bool kComposed>
void BM_ResidualNormForward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::ResidualNormArgs args = ResidualNormInputs(rows, cols, state.range(2) != 0);
  Run(state, 0, 16.0 * rows * cols, [&] {
    return kComposed ? ops::ComposedResidualNormForward(CpuBackend(), args)
                     : ops::ResidualNormForward(args);
  });
}

template <bool kComposed>
void BM_ResidualNormBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const ops::ResidualNormArgs fwd = ResidualNormInputs(rows, cols, state.range(2) != 0);
  if (!ops::ResidualNormForward(fwd).ok()) state.SkipWithError("forward failed");
  ops::ResidualNormBackwardArgs args{.dropout = fwd.dropout,
                                     .dy = Random(DType::kF32, {rows, cols}),
                                     .residual = fwd.residual,
                                     .weight = fwd.weight,
                                     .mean = fwd.mean,
                                     .rstd = fwd.rstd,
                                     .branch = fwd.branch,
                                     .d_residual = Zeros(DType::kF32, {rows, cols}),
                                     .d_branch = Zeros(DType::kF32, {rows, cols}),
                                     .dweight = Zeros(DType::kF32, {cols}),
                                     .dbias = Zeros(DType::kF32, {cols}),
                                     .scratch = fwd.scratch};
  if (fwd.norms_branch()) {
    args.branch_weight = fwd.branch_weight;
    args.branch_mean = fwd.branch_mean;
    args.branch_rstd = fwd.branch_rstd;
    args.d_branch_weight = Zeros(DType::kF32, {cols});
    args.d_branch_bias = Zeros(DType::kF32, {cols});
  }
  // d_residual accumulates over the repetitions: its values grow, its cost does not.
  Run(state, 0, 20.0 * rows * cols, [&] {
    return kComposed ? ops::ComposedResidualNormBackward(CpuBackend(), args)
                     : ops::ResidualNormBackward(args);
  });
}

// x [outer, channels, inner] times a per-channel scale: reads x, writes y.
void BM_ScaleChannels(benchmark::State& state) {
  const int64_t outer = state.range(0), channels = state.range(1), inner = state.range(2);
  const Tensor x = Random(DType::kF32, {outer, channels, inner});
  const Tensor scale = Random(DType::kF32, {channels}),
               y = Zeros(DType::kF32, {outer, channels, inner});
  Run(state, 0, 8.0 * x.numel(), [&] { return ops::ScaleChannels(x, scale, inner, y); });
}

// Its backward: reads x and dy (dscale), dy again and writes dx.
void BM_ScaleChannelsBackward(benchmark::State& state) {
  const int64_t outer = state.range(0), channels = state.range(1), inner = state.range(2);
  const Shape shape{outer, channels, inner};
  const Tensor x = Random(DType::kF32, shape), dy = Random(DType::kF32, shape);
  const Tensor scale = Random(DType::kF32, {channels}), dscale = Zeros(DType::kF32, {channels});
  const Tensor dx = Zeros(DType::kF32, shape);
  Run(state, 0, 16.0 * x.numel(),
      [&] { return ops::ScaleChannelsBackward(x, scale, inner, dy, dx, dscale); });
}

// Attention's output [batch, heads, seq, head_dim] to token order, plain or with NormFormer's
// head scale on the way (the fused op): reads and writes the activations once.
template <bool kScaled>
void BM_MergeHeads(benchmark::State& state) {
  const int64_t batch = state.range(0), heads = state.range(1), seq = state.range(2);
  const Tensor x = Random(DType::kF32, {batch, heads, seq, state.range(3)});
  const Tensor scale = Random(DType::kF32, {heads});
  const Tensor tokens = Zeros(DType::kF32, {batch * seq, x.numel() / (batch * seq)});
  Run(state, 0, 8.0 * x.numel(), [&] {
    return kScaled ? ops::MergeScaledHeads(x, scale, tokens) : ops::MergeHeads(x, tokens);
  });
}

// The gradient's way back: SplitHeads, or the fused backward (the scale gradient reads the
// activations too).
template <bool kScaled>
void BM_SplitHeadsBackward(benchmark::State& state) {
  const int64_t batch = state.range(0), heads = state.range(1), seq = state.range(2);
  const Tensor x = Random(DType::kF32, {batch, heads, seq, state.range(3)});
  const Tensor scale = Random(DType::kF32, {heads}), dscale = Zeros(DType::kF32, {heads});
  const Tensor d_tokens = Random(DType::kF32, {batch * seq, x.numel() / (batch * seq)});
  const Tensor d_heads = Zeros(DType::kF32, x.shape());
  Run(state, 0, (kScaled ? 12.0 : 8.0) * x.numel(), [&] {
    return kScaled ? ops::MergeScaledHeadsBackward(d_tokens, x, scale, d_heads, dscale)
                   : ops::SplitHeads(d_tokens, d_heads);
  });
}

// y += alpha x over n floats: reads x and y, writes y.
void BM_Axpy(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor x = Random(DType::kF32, {n}), y = Zeros(DType::kF32, {n});
  Run(state, 0, 12.0 * n, [&] { return ops::Axpy(0.5f, x, y); });
}

// x *= alpha over n floats (alpha 1, so repeated runs stay finite): reads and writes x.
void BM_Scale(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor x = Random(DType::kF32, {n});
  Run(state, 0, 8.0 * n, [&] { return ops::Scale(x, 1.0f); });
}

// A whole MixedPrecisionAdamW::Step without loss scaling, as a training step runs it: the grads'
// non-finite check and squared norm, the overflow check, AdamW, and for a bf16 model the cast of
// the master weights to it. Two ranges (decay, then none) and clipping at 1 that gradients of
// ~1e-4 stay below. Bytes are AdamW's own 28 per parameter: vs_memcpy is how close the step
// comes to one fused AdamW pass.
template <DType kModel>
void BM_MixedPrecisionAdamWStep(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int64_t decayed = n / 4 * 3;
  auto opt = optim::MixedPrecisionAdamW::Create(
      Random(kModel, {n}), Random(DType::kF32, {n}, 2e-4f),
      {{.offset = 0, .length = decayed, .weight_decay = true},
       {.offset = decayed, .length = n - decayed, .weight_decay = false}},
      {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip_grad = 1.0f});
  if (!opt.ok() || !opt->InitializeMasterFromModel().ok()) {
    state.SkipWithError("MixedPrecisionAdamW::Create failed");
    return;
  }
  Run(state, 0, 28.0 * n, [&] { return opt->Step(/*lr=*/1e-4f, /*loss_scale=*/1.0f).status(); });
}

// Registered after the ceilings are measured; names read "<op>_<dtype>/<shape>".
void RegisterAll() {
  auto add = [](const std::string& name, auto fn, std::vector<int64_t> args) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Args(args)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.2)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  };
  add("openblas_sgemm/n", BM_OpenBlasSgemm, {1024});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {1024, 1024, 1024});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {2048, 3072, 768});
  // One micro-batch's GEMMs, too few token rows for row blocks alone: the tiny model's q/k/v
  // and fc1 (256 tokens), the 125M shape's q/k/v, LM head and its input gradient (128 tokens).
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {256, 128, 128});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {256, 512, 128});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {128, 768, 768});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {128, 50304, 768});
  add("gemm_f32/m/n/k", BM_Gemm<DType::kF32>, {128, 768, 50304});
  add("gemm_bf16/m/n/k", BM_Gemm<DType::kBF16>, {1024, 1024, 1024});
  // Decoding one token (nf-generate): the 2.7B's fc1 forward, [1, 2560] x [10240, 2560]^T.
  // Up to 16 sequences take the skinny path in fp16/bf16 (core/cpu/gemm.cc), 32 and 64 the sgemm
  // path.
  for (const int64_t rows : {1, 4, 16, 32, 64}) {
    add("gemm_decode_f32/m/n/k", BM_DecodeGemm<DType::kF32>, {rows, 10240, 2560});
    add("gemm_decode_bf16/m/n/k", BM_DecodeGemm<DType::kBF16>, {rows, 10240, 2560});
    add("gemm_decode_f16/m/n/k", BM_DecodeGemm<DType::kF16>, {rows, 10240, 2560});
  }
  add("gemm_f16/m/n/k", BM_Gemm<DType::kF16>, {1024, 1024, 1024});
  add("layer_norm_fwd_f32/rows/cols", BM_LayerNormForward<DType::kF32>, {8192, 768});
  add("layer_norm_fwd_bf16/rows/cols", BM_LayerNormForward<DType::kBF16>, {8192, 768});
  add("layer_norm_bwd_f32/rows/cols", BM_LayerNormBackward<DType::kF32>, {8192, 768});
  // The tiny model's NormFormer LayerNorms, one micro-batch (256 tokens): after attention
  // (d_model 128) and on the FFN activation (ffn 512).
  for (const int64_t cols : {128, 512}) {
    add("layer_norm_fwd_f32/rows/cols", BM_LayerNormForward<DType::kF32>, {256, cols});
    add("layer_norm_bwd_f32/rows/cols", BM_LayerNormBackward<DType::kF32>, {256, cols});
  }
  add("attention_fwd_f32/b/h/s/d", BM_AttentionForward<DType::kF32>, {4, 12, 256, 64});
  add("attention_bwd_f32/b/h/s/d", BM_AttentionBackward<DType::kF32>, {4, 12, 256, 64});
  add("attention_fwd_bf16/b/h/s/d", BM_AttentionForward<DType::kBF16>, {4, 12, 256, 64});
  add("adamw_f32/params", BM_AdamW, {16 << 20});
  add("adamw_overflow_check_f16/params", BM_AdamWWouldOverflow<DType::kF16>, {16 << 20});
  add("adamw_overflow_check_bf16/params", BM_AdamWWouldOverflow<DType::kBF16>, {16 << 20});
  add("adamw_overflow_check_f32/params", BM_AdamWWouldOverflow<DType::kF32>, {16 << 20});
  add("adamw_optimizer_step_f32/params", BM_MixedPrecisionAdamWStep<DType::kF32>, {16 << 20});
  add("adamw_optimizer_step_bf16/params", BM_MixedPrecisionAdamWStep<DType::kBF16>, {16 << 20});
  // The 125M shape's fc1 output (8 sequences of 256 tokens), its hidden activations (dropout
  // at a shard offset of 5 columns) and NormFormer's three scalings: the residual scale
  // (inner 1), the head scale after the projection (inner = head_dim) and before it on
  // [batch, heads, seq * head_dim].
  add("gelu_fwd_f32/rows/cols", BM_ActivationForward<ops::Activation::kGelu>, {2048, 3072});
  add("gelu_bwd_f32/rows/cols", BM_ActivationBackward<ops::Activation::kGelu>, {2048, 3072});
  add("gelu_tanh_fwd_f32/rows/cols", BM_ActivationForward<ops::Activation::kGeluTanh>,
      {2048, 3072});
  add("gelu_tanh_bwd_f32/rows/cols", BM_ActivationBackward<ops::Activation::kGeluTanh>,
      {2048, 3072});
  add("relu_squared_bwd_f32/rows/cols", BM_ActivationBackward<ops::Activation::kReluSquared>,
      {2048, 3072});
  add("dropout_f32/rows/cols", BM_Dropout, {2048, 768});
  add("scale_channels_f32/outer/channels/inner", BM_ScaleChannels, {2048, 768, 1});
  add("scale_channels_f32/outer/channels/inner", BM_ScaleChannels, {2048, 12, 64});
  add("scale_channels_f32/outer/channels/inner", BM_ScaleChannels, {8, 12, 256 * 64});
  add("scale_channels_bwd_f32/outer/channels/inner", BM_ScaleChannelsBackward, {2048, 768, 1});
  add("scale_channels_bwd_f32/outer/channels/inner", BM_ScaleChannelsBackward, {2048, 12, 64});
  add("scale_channels_bwd_f32/outer/channels/inner", BM_ScaleChannelsBackward, {8, 12, 256 * 64});
  // The tiny model's FFN middle (256 tokens, ffn 512, dropout 0.1): Pre-LN's, NormFormer's.
  add("gelu_dropout_fwd_f32/rows/cols", BM_ActivationDropoutForward, {256, 512});
  add("gelu_dropout_bwd_f32/rows/cols", BM_ActivationDropoutBackward, {256, 512});
  add("gelu_dropout_layer_norm_fwd_f32/rows/cols", BM_ActivationNormForward, {256, 512});
  add("gelu_dropout_layer_norm_bwd_f32/rows/cols", BM_ActivationNormBackward, {256, 512});
  // The tiny model's head scale (256 tokens, 4 heads of 32).
  add("scale_channels_f32/outer/channels/inner", BM_ScaleChannels, {256, 4, 32});
  add("scale_channels_bwd_f32/outer/channels/inner", BM_ScaleChannelsBackward, {256, 4, 32});
  // The head scale before the projection fused with the head merge and its backward, beside
  // the plain merge and split they replace with the scale ops above: the tiny model's micro-batch
  // (4 sequences of 64, 4 heads of 32) and the 125M shape's (8 of 256, 12 heads of 64).
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{4, 4, 64, 32}, std::vector<int64_t>{8, 12, 256, 64}}) {
    add("merge_heads_f32/b/h/s/d", BM_MergeHeads<false>, shape);
    add("merge_scaled_heads_f32/b/h/s/d", BM_MergeHeads<true>, shape);
    add("split_heads_f32/b/h/s/d", BM_SplitHeadsBackward<false>, shape);
    add("merge_scaled_heads_bwd_f32/b/h/s/d", BM_SplitHeadsBackward<true>, shape);
  }
  // The residual add with its LayerNorms, fused against the unfused ops in the same run: the
  // tiny model's micro-batch (256 tokens of 128) and the 125M shape's (2048 of 768), Pre-LN's
  // (branch_norm 0) and NormFormer's (1).
  for (const int64_t branch_norm : {0, 1}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{256, 128}, {2048, 768}}) {
      add("residual_norm_fwd_f32/rows/cols/branch_norm", BM_ResidualNormForward<false>,
          {rows, cols, branch_norm});
      add("residual_norm_unfused_fwd_f32/rows/cols/branch_norm", BM_ResidualNormForward<true>,
          {rows, cols, branch_norm});
      add("residual_norm_bwd_f32/rows/cols/branch_norm", BM_ResidualNormBackward<false>,
          {rows, cols, branch_norm});
      add("residual_norm_unfused_bwd_f32/rows/cols/branch_norm", BM_ResidualNormBackward<true>,
          {rows, cols, branch_norm});
    }
  }
  add("axpy_f32/n", BM_Axpy, {16 << 20});
  add("scale_f32/n", BM_Scale, {16 << 20});
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  nf::bench::ceilings = nf::bench::MeasureCeilings();
  std::printf(
      "Ceilings measured in this run: OpenBLAS sgemm (n=1024) %.1f GFLOP/s, "
      "memcpy (256 MiB) %.1f GB/s\n",
      nf::bench::ceilings.sgemm_gflops, nf::bench::ceilings.memcpy_gbytes_per_s);
  nf::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
