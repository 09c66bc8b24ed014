// nf-bench: training throughput on one GPU (the CUDA backend, no MPI needed). For the 125M and
// 1.3B NormFormer shapes in bf16 and fp16: step time (median), tokens/s, model TFLOP/s and MFU,
// and the step-time overhead of the NormFormer operations against the Pre-LN baseline (every
// switch off, timed in alternation with NormFormer so the machine's noise falls on both). The
// ceiling is measured in the same run: cuBLASLt bf16 GEMM TFLOP/s (8192^3, median of 20),
// printed next to the datasheet's dense bf16 peak where the GPU is known; MFU is against the
// datasheet peak (as Megatron-LM and llm.c report it) and against the measured GEMM.
//
// --op-times then runs N more steps of each NormFormer workload with per-op timing on (CUDA
// events, core/ops/op_timing.h) and prints where the step goes, op by op.
//
//   build/bench/nf-bench [--steps N] [--only 125m|1.3b] [--precision bf16|fp16] [--op-times]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/statistics.h"
#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"
#include "core/ops/op_timing.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/trainer.h"

namespace nf::bench {
namespace {

struct Workload {
  const char* name;
  int num_layers, d_model, num_heads, ffn_dim, vocab_size;
  int seq_len, micro_batch, global_batch;
};

// GPT-3 / NormFormer paper shapes (fairseq's GPT-2 BPE vocabulary), sequence length 2048.
constexpr Workload kWorkloads[] = {
    {"125m", 12, 768, 12, 3072, 50257, 2048, 8, 16},
    {"1.3b", 24, 2048, 32, 8192, 50257, 2048, 4, 8},
};

constexpr int kWarmupSteps = 2;

launcher::TrainConfig MakeConfig(const Workload& w, launcher::TrainOptions::Precision precision,
                                 bool normformer) {
  launcher::TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(w.num_layers);
  m.set_d_model(w.d_model);
  m.set_num_heads(w.num_heads);
  m.set_ffn_dim(w.ffn_dim);
  m.set_vocab_size(w.vocab_size);
  m.set_max_seq_len(w.seq_len);
  m.set_dropout(0.1f);
  m.set_attention_dropout(0.1f);
  model::NormFormerConfig& switches = *m.mutable_normformer();
  switches.set_scale_attn(normformer);
  switches.set_scale_heads(normformer);
  switches.set_scale_fc(normformer);
  launcher::TrainOptions& t = *config.mutable_train();
  t.set_seq_len(w.seq_len);
  t.set_micro_batch_size(w.micro_batch);
  t.set_global_batch_size(w.global_batch);
  t.set_precision(precision);
  t.set_device(launcher::TrainOptions::CUDA);
  t.set_train_iters(1000);
  t.mutable_lr_schedule()->set_warmup_iters(100);
  return config;
}

// cuBLASLt bf16 GEMM with fp32 accumulation, n x n x n, median TFLOP/s of `reps` calls.
absl::StatusOr<double> MeasureGemmTflops(int64_t n, int reps) {
  const Device gpu = Device::Cuda(0);
  NF_ASSIGN_OR_RETURN(const Tensor a, ops::Zeros(DType::kBF16, {n, n}, gpu));
  NF_ASSIGN_OR_RETURN(const Tensor b, ops::Zeros(DType::kBF16, {n, n}, gpu));
  NF_ASSIGN_OR_RETURN(const Tensor c, ops::Zeros(DType::kBF16, {n, n}, gpu));
  NF_RETURN_IF_ERROR(ops::Fill(a, 0.5f));
  NF_RETURN_IF_ERROR(ops::Fill(b, 0.25f));
  std::vector<double> tflops;
  for (int i = 0; i < reps + 2; ++i) {
    NF_RETURN_IF_ERROR(ops::Synchronize(gpu));
    const auto start = std::chrono::steady_clock::now();
    NF_RETURN_IF_ERROR(ops::Gemm({.a = a, .b = b, .c = c}));
    NF_RETURN_IF_ERROR(ops::Synchronize(gpu));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= 2) tflops.push_back(2.0 * n * n * n / s / 1e12);
  }
  return Median(tflops);
}

// Dense bf16 tensor-core peak from the datasheets, 0 when the GPU is not one we know.
double DatasheetBf16Tflops(const std::string& name) {
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    return 989.4;  // SXM; the PCIe H100 is lower (756), reported as SXM here
  }
  if (name.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

struct Timing {
  std::unique_ptr<launcher::Trainer> trainer;
  std::vector<double> step_s;
};

absl::StatusOr<Timing> MakeTiming(const launcher::TrainConfig& config) {
  NF_RETURN_IF_ERROR(launcher::ValidateTrainConfig(config));
  Timing t;
  NF_ASSIGN_OR_RETURN(t.trainer, launcher::Trainer::Create(config));
  return t;
}

absl::Status TimeStep(Timing& t, bool record) {
  NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, t.trainer->TrainStep());
  if (!std::isfinite(stats.loss)) {
    return absl::InternalError(absl::StrCat("step ", stats.step, ": loss ", stats.loss));
  }
  // TrainStep ends with a device synchronisation, so its wall time is the GPU's.
  if (record) t.step_s.push_back(stats.seconds);
  return absl::OkStatus();
}

absl::Status Run(int steps, const std::string& only, const std::string& precision_filter,
                 bool op_times) {
  NF_ASSIGN_OR_RETURN(cuda::CudaContext * context, cuda::CudaContext::ForDevice(0));
  const std::string gpu_name = context->properties().name;
  NF_ASSIGN_OR_RETURN(const double gemm_tflops, MeasureGemmTflops(8192, 20));
  const double datasheet = DatasheetBf16Tflops(gpu_name);
  std::printf(
      "GPU: %s. Ceilings: cuBLASLt bf16 GEMM 8192^3 %.1f TFLOP/s measured now; "
      "datasheet dense bf16 %s.\n",
      gpu_name.c_str(), gemm_tflops,
      datasheet > 0 ? absl::StrFormat("%.1f TFLOP/s", datasheet).c_str() : "unknown");
  std::printf(
      "Model FLOPs per token = 6 x params + 6 x layers x d_model x seq_len (llm.c). "
      "Overhead = NormFormer step time / Pre-LN baseline step time - 1.\n\n");
  std::printf("%-6s %-5s %8s %9s %10s %9s %8s %9s %9s\n", "model", "dtype", "params", "step ms",
              "tokens/s", "TFLOP/s", "MFU", "vs GEMM", "overhead");
  std::string op_tables;  // --op-times: printed after the main table
  for (const Workload& w : kWorkloads) {
    if (!only.empty() && only != w.name) continue;
    for (const auto precision : {launcher::TrainOptions::BF16, launcher::TrainOptions::FP16}) {
      const std::string dtype = precision == launcher::TrainOptions::BF16 ? "bf16" : "fp16";
      if (!precision_filter.empty() && precision_filter != dtype) continue;
      NF_ASSIGN_OR_RETURN(Timing normformer, MakeTiming(MakeConfig(w, precision, true)));
      NF_ASSIGN_OR_RETURN(Timing baseline, MakeTiming(MakeConfig(w, precision, false)));
      for (int i = 0; i < kWarmupSteps + steps; ++i) {
        NF_RETURN_IF_ERROR(TimeStep(normformer, i >= kWarmupSteps));
        NF_RETURN_IF_ERROR(TimeStep(baseline, i >= kWarmupSteps));
      }
      const double step_s = Median(normformer.step_s);
      const double base_s = Median(baseline.step_s);
      const double tokens = static_cast<double>(w.global_batch) * w.seq_len;
      const double params = static_cast<double>(normformer.trainer->num_global_params());
      const double flops_per_token =
          6.0 * params + 6.0 * w.num_layers * w.d_model * static_cast<double>(w.seq_len);
      const double tflops = flops_per_token * tokens / step_s / 1e12;
      std::printf("%-6s %-5s %7.0fM %9.1f %10.0f %9.1f %7.1f%% %8.1f%% %8.2f%%\n", w.name,
                  dtype.c_str(), params / 1e6, 1e3 * step_s, tokens / step_s, tflops,
                  datasheet > 0 ? 100.0 * tflops / datasheet : 0.0, 100.0 * tflops / gemm_tflops,
                  100.0 * (step_s / base_s - 1.0));
      std::fflush(stdout);
      if (op_times) {
        ops::TakeOpTimes();
        ops::SetOpTimingEnabled(true);
        for (int i = 0; i < steps; ++i) NF_RETURN_IF_ERROR(TimeStep(normformer, false));
        ops::SetOpTimingEnabled(false);
        absl::StrAppendFormat(&op_tables,
                              "\nTime per op, NormFormer %s %s, summed over %d steps (CUDA "
                              "events; --op-times):\n%s",
                              w.name, dtype, steps, ops::FormatOpTimes(ops::TakeOpTimes()));
      }
    }
  }
  std::printf("%s", op_tables.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  int steps = 5;
  std::string only, precision;
  bool op_times = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--precision" && i + 1 < argc) {
      precision = argv[++i];
    } else if (arg == "--op-times") {
      op_times = true;
    } else {
      std::fprintf(stderr,
                   "usage: nf-bench [--steps N] [--only 125m|1.3b] [--precision bf16|fp16] "
                   "[--op-times]\n");
      return 2;
    }
  }
  if (nf::ops::GpuCount() == 0) {
    std::fprintf(stderr,
                 "nf-bench: no CUDA device visible; run it on a GPU machine "
                 "(scripts/gpu-check.sh)\n");
    return 1;
  }
  const absl::Status status = nf::bench::Run(std::max(1, steps), only, precision, op_times);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
