// Full training steps on the CPU backend, fp32: Trainer::TrainStep (forward and backward over
// every micro-batch of the global batch, then the AdamW step), for the tiny model and a
// 125M-shaped one, each as NormFormer (scale_attn, scale_heads before the output projection,
// scale_fc) and as the Pre-LN baseline (every switch off). Rates are model FLOPs as llm.c
// counts them, next to the OpenBLAS sgemm ceiling measured at the start of the same run; a
// second table splits the step into forward, backward and optimizer, each timed on its own.
// The two variants of a model are timed in alternation, so the shared machine's noise falls
// on both alike and the overhead column compares like with like.
//
// --no-dropout sets every dropout probability to 0 (the dropout masks' share of the overhead).
// --op-times runs as many more steps of each variant with per-op timing on (core/ops/op_timing.h)
// and prints where each variant's step goes, op by op.
//
//   NF_NUM_THREADS=2 build/bench/nf-bench-step [--steps N] [--only tiny|125m] [--no-dropout]
//                                              [--op-times]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bench/ceilings.h"
#include "bench/statistics.h"
#include "bench/step_workloads.h"
#include "core/ops/op_timing.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "launcher/config.h"
#include "launcher/trainer.h"

namespace nf::bench {
namespace {

constexpr int kWarmupSteps = 2;

// One configuration under test: its trainer, one fixed micro-batch for timing forward and
// backward on their own, a second AdamW over the model's buffers for timing the optimizer on
// its own (it moves the weights, so it runs after the steps), and the timings in seconds.
struct Variant {
  launcher::TrainConfig config;
  std::unique_ptr<launcher::Trainer> trainer;
  Tensor inputs, targets;
  std::optional<optim::MixedPrecisionAdamW> optimizer;
  std::vector<double> step_s, forward_s, backward_s, optimizer_s;
};

absl::StatusOr<std::unique_ptr<Variant>> MakeVariant(launcher::TrainConfig config) {
  NF_RETURN_IF_ERROR(launcher::ValidateTrainConfig(config));
  auto v = std::make_unique<Variant>();
  NF_ASSIGN_OR_RETURN(v->trainer, launcher::Trainer::Create(config));
  NF_ASSIGN_OR_RETURN(FixedBatch batch, MakeFixedBatch(config));
  v->inputs = std::move(batch.inputs);
  v->targets = std::move(batch.targets);
  v->config = std::move(config);
  return v;
}

absl::Status TrainStep(Variant& v, bool timed) {
  NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, v.trainer->TrainStep());
  if (!std::isfinite(stats.loss) || stats.skipped) {
    return absl::InternalError(absl::StrCat("step ", stats.step, ": loss ", stats.loss));
  }
  if (timed) v.step_s.push_back(stats.seconds);
  return absl::OkStatus();
}

absl::Status ForwardBackward(Variant& v) {
  model::NormFormerModel& model = (*v.trainer->chunks().front());
  const launcher::TrainOptions& train = v.config.train();
  const float loss_weight =
      1.0f / static_cast<float>(int64_t{train.global_batch_size()} * train.seq_len());
  auto start = std::chrono::steady_clock::now();
  NF_RETURN_IF_ERROR(model.Forward(v.inputs, v.targets, /*first_sample=*/0, true).status());
  v.forward_s.push_back(Seconds(start));
  start = std::chrono::steady_clock::now();
  NF_RETURN_IF_ERROR(model.Backward(loss_weight));
  v.backward_s.push_back(Seconds(start));
  return absl::OkStatus();
}

absl::Status OptimizerStep(Variant& v) {
  if (!v.optimizer) {
    model::ParamTable& table = (*v.trainer->chunks().front()).params();
    NF_ASSIGN_OR_RETURN(v.optimizer, optim::MixedPrecisionAdamW::Create(
                                         table.params(), table.grads(), table.DecayRanges(),
                                         launcher::AdamWConfigOf(v.config.train().optimizer())));
    NF_RETURN_IF_ERROR(v.optimizer->InitializeMasterFromModel());
    NF_RETURN_IF_ERROR(v.optimizer->Step(/*lr=*/1e-4f, /*loss_scale=*/1.0f).status());  // warmup
  }
  const auto start = std::chrono::steady_clock::now();
  NF_RETURN_IF_ERROR(v.optimizer->Step(/*lr=*/1e-4f, /*loss_scale=*/1.0f).status());
  v.optimizer_s.push_back(Seconds(start));
  return absl::OkStatus();
}

struct Result {
  int64_t params = 0;  // global parameter count, padded vocabulary rows included
  int steps = 0;
  double step_s = 0, min_step_s = 0, max_step_s = 0;  // median, min and max of TrainStep
  std::vector<double> step_times;                     // every timed TrainStep, in round order
  // The step's parts, each the median of its own timings: forward and backward summed over
  // the step's micro-batches, and the optimizer step.
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  std::vector<ops::OpTime> op_times;  // --op-times: summed over `steps` further TrainSteps
};

Result Summarize(const Variant& v) {
  const launcher::TrainOptions& train = v.config.train();
  const int64_t micro_batches = train.global_batch_size() / train.micro_batch_size();
  return {.params = v.trainer->num_global_params(),
          .steps = static_cast<int>(v.step_s.size()),
          .step_s = Median(v.step_s),
          .min_step_s = *std::min_element(v.step_s.begin(), v.step_s.end()),
          .max_step_s = *std::max_element(v.step_s.begin(), v.step_s.end()),
          .step_times = v.step_s,
          .forward_s = micro_batches * Median(v.forward_s),
          .backward_s = micro_batches * Median(v.backward_s),
          .optimizer_s = Median(v.optimizer_s),
          .op_times = {}};
}

// The Pre-LN baseline and NormFormer of `w`, each warmed up, then timed in alternation (the
// order swapping every round) so that the machine's noise falls on both alike: `steps`
// TrainSteps, then as many micro-batch forward + backward passes and optimizer steps.
absl::StatusOr<std::vector<Result>> MeasurePair(const Workload& w, int steps, bool op_times) {
  std::vector<std::unique_ptr<Variant>> variants;
  for (const bool normformer : {false, true}) {
    NF_ASSIGN_OR_RETURN(std::unique_ptr<Variant> v, MakeVariant(MakeConfig(w, normformer)));
    variants.push_back(std::move(v));
  }
  for (auto& v : variants) {
    for (int i = 0; i < kWarmupSteps; ++i) NF_RETURN_IF_ERROR(TrainStep(*v, /*timed=*/false));
  }
  const auto each_round = [&](int i, auto&& fn) -> absl::Status {
    NF_RETURN_IF_ERROR(fn(*variants[i % 2]));
    return fn(*variants[1 - i % 2]);
  };
  for (int i = 0; i < steps; ++i) {
    NF_RETURN_IF_ERROR(each_round(i, [](Variant& v) { return TrainStep(v, /*timed=*/true); }));
  }
  for (int i = 0; i < steps; ++i) NF_RETURN_IF_ERROR(each_round(i, ForwardBackward));
  for (int i = 0; i < steps; ++i) NF_RETURN_IF_ERROR(each_round(i, OptimizerStep));
  std::vector<Result> results = {Summarize(*variants[0]), Summarize(*variants[1])};
  if (!op_times) return results;
  // Separate steps: timing every op costs a little, so the steps above are untouched by it.
  for (size_t i = 0; i < variants.size(); ++i) {
    ops::TakeOpTimes();
    ops::SetOpTimingEnabled(true);
    for (int s = 0; s < steps; ++s) NF_RETURN_IF_ERROR(TrainStep(*variants[i], /*timed=*/false));
    ops::SetOpTimingEnabled(false);
    results[i].op_times = ops::TakeOpTimes();
  }
  return results;
}

struct Flags {
  int steps = 0;     // 0: each workload's default
  std::string only;  // empty: every workload
  bool no_dropout = false;
  bool op_times = false;
};

bool ParseFlags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      flags.steps = std::atoi(argv[++i]);
      if (flags.steps < 1) return false;
    } else if (arg == "--only" && i + 1 < argc) {
      flags.only = argv[++i];
    } else if (arg == "--no-dropout") {
      flags.no_dropout = true;
    } else if (arg == "--op-times") {
      flags.op_times = true;
    } else {
      return false;
    }
  }
  if (flags.only.empty()) return true;
  return std::any_of(std::begin(kWorkloads), std::end(kWorkloads),
                     [&](const Workload& w) { return flags.only == w.name; });
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: %s [--steps N (>= 1)] [--only tiny|125m] [--no-dropout] [--op-times]\n",
                 argv[0]);
    return 2;
  }
  const Ceilings ceilings = MeasureCeilings();
  std::printf(
      "Ceilings measured in this run: OpenBLAS sgemm (n=1024, all cores) %.1f GFLOP/s, "
      "memcpy (256 MiB) %.1f GB/s\n",
      ceilings.sgemm_gflops, ceilings.memcpy_gbytes_per_s);
  std::printf(
      "Kernel threads: %d (NF_NUM_THREADS). fp32, Trainer::TrainStep; median of the "
      "timed steps after %d warmup steps,\nPre-LN and NormFormer steps alternating%s.\n",
      ThreadPool::Global().num_threads(), kWarmupSteps,
      flags.no_dropout ? "; every dropout probability 0 (--no-dropout)" : "");
  std::printf(
      "Model FLOPs per token = 6 x params + 6 x layers x d_model x seq_len (llm.c); "
      "params = the model's global\nparameter count, embedding rows padded to a multiple "
      "of 128 included (tied LM head counted once).\n\n");

  struct Row {
    const Workload* workload;
    bool normformer;
    Result result;
  };
  std::vector<Workload> workloads(std::begin(kWorkloads), std::end(kWorkloads));
  if (flags.no_dropout) {
    for (Workload& w : workloads) w.dropout = w.attention_dropout = 0.0f;
  }
  std::vector<Row> rows;
  for (const Workload& w : workloads) {
    if (!flags.only.empty() && flags.only != w.name) continue;
    const absl::StatusOr<std::vector<Result>> pair =
        MeasurePair(w, flags.steps > 0 ? flags.steps : w.default_steps, flags.op_times);
    if (!pair.ok()) {
      std::fprintf(stderr, "%s: %s\n", w.name, std::string(pair.status().message()).c_str());
      return 1;
    }
    rows.push_back({&w, false, (*pair)[0]});
    rows.push_back({&w, true, (*pair)[1]});
  }

  std::printf("%-5s %-10s %11s %6s %6s %10s %15s %9s %7s %8s %8s  %s\n", "model", "variant",
              "params", "tok/st", "steps", "step ms", "min-max ms", "tokens/s", "GFLOP", "GFLOP/s",
              "vs sgemm", "overhead");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Workload& w = *rows[i].workload;
    const Result& r = rows[i].result;
    const int64_t tokens = int64_t{w.global_batch} * w.seq_len;
    const double gflops = StepGflops(w, r.params);
    // Rows come in pairs, the baseline first. The overhead is the median of the per-round
    // ratios (the two steps of a round ran back to back, so the machine's slow spells fall on
    // both), with its 95% interval.
    std::string overhead = "-";
    if (rows[i].normformer) {
      const std::vector<double>& base = rows[i - 1].result.step_times;
      std::vector<double> ratios;
      for (size_t k = 0; k < r.step_times.size(); ++k) {
        ratios.push_back(r.step_times[k] / base[k] - 1);
      }
      const MedianInterval m = MedianWithInterval(ratios);
      overhead =
          absl::StrFormat("%+.1f%% [%+.1f, %+.1f]", 100 * m.median, 100 * m.low, 100 * m.high);
    }
    std::printf("%-5s %-10s %11lld %6lld %6d %10.1f %7.1f-%-7.1f %9.0f %7.2f %8.1f %8.3f  %s\n",
                w.name, rows[i].normformer ? "NormFormer" : "Pre-LN",
                static_cast<long long>(r.params), static_cast<long long>(tokens), r.steps,
                1e3 * r.step_s, 1e3 * r.min_step_s, 1e3 * r.max_step_s, tokens / r.step_s, gflops,
                gflops / r.step_s, gflops / r.step_s / ceilings.sgemm_gflops, overhead.c_str());
  }

  std::printf(
      "\nWhere the step goes (medians, each part timed on its own; forward and backward "
      "summed over the step's micro-batches;\nrest = step - parts: batch loading, "
      "zeroing gradients, noise):\n");
  std::printf("%-5s %-10s %10s %10s %10s %12s %10s %12s\n", "model", "variant", "step ms", "fwd ms",
              "bwd ms", "optim ms", "rest ms", "bwd / fwd");
  for (const Row& row : rows) {
    const Result& r = row.result;
    const double rest = r.step_s - r.forward_s - r.backward_s - r.optimizer_s;
    std::printf("%-5s %-10s %10.1f %10.1f %10.1f %12.1f %10.1f %12.2f\n", row.workload->name,
                row.normformer ? "NormFormer" : "Pre-LN", 1e3 * r.step_s, 1e3 * r.forward_s,
                1e3 * r.backward_s, 1e3 * r.optimizer_s, 1e3 * rest, r.backward_s / r.forward_s);
  }
  for (const Row& row : rows) {
    if (row.result.op_times.empty()) continue;
    std::printf("\nTime per op, %s %s, summed over %d steps (wall clock; --op-times):\n%s",
                row.workload->name, row.normformer ? "NormFormer" : "Pre-LN", row.result.steps,
                ops::FormatOpTimes(row.result.op_times).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) { return nf::bench::Main(argc, argv); }
