// nf-bench-step-peer: one configuration of nf-bench-step's shapes (bench/step_workloads.h),
// kept alive and stepped on request, so that bench/pytorch_compare.py can interleave its
// training steps one by one with PyTorch's (the shared machine's noise then falls on both).
//
//   NF_NUM_THREADS=2 nf-bench-step-peer --workload tiny|125m --variant prenorm|normformer
//       [--seq N] [--no-dropout] [--dump FILE]
//
// After two warmup steps it prints "ready params=P gflop_per_step=G sgemm_gflops=S" (S: the
// OpenBLAS all-core sgemm ceiling measured at start), then answers each line of stdin with one
// line: "step" -> "step SECONDS", one Trainer::TrainStep (forward + backward over every
// micro-batch, AdamW); "fb" -> "fb SECONDS", forward + backward of as many micro-batches, no
// update; "sgemm" -> "sgemm GFLOPS", the ceiling measured again. --seq changes the sequence length
// (and max_seq_len); --no-dropout sets every dropout to 0. --dump FILE (needs --no-dropout) first
// writes, as safetensors, the initial parameters under the model's names, one micro-batch as F32
// "inputs" and "targets", and as metadata "loss" (that micro-batch's mean token loss) and
// "grad_norm" (the norm of its gradient), for the PyTorch model to recompute on the same weights
// and tokens.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bench/ceilings.h"
#include "bench/step_workloads.h"
#include "checkpoint/safetensors_file.h"
#include "core/status.h"
#include "launcher/trainer.h"

namespace nf::bench {
namespace {

constexpr int kWarmupSteps = 2;

struct Flags {
  const Workload* workload = nullptr;
  bool normformer = false;
  int seq = 0;  // 0: the workload's
  bool no_dropout = false;
  std::string dump;
};

bool ParseFlags(int argc, char** argv, Flags& flags) {
  bool variant_given = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--workload" && has_value) {
      const absl::string_view name = argv[++i];
      for (const Workload& w : kWorkloads) {
        if (name == w.name) flags.workload = &w;
      }
    } else if (arg == "--variant" && has_value) {
      const absl::string_view name = argv[++i];
      if (name != "prenorm" && name != "normformer") return false;
      flags.normformer = name == "normformer";
      variant_given = true;
    } else if (arg == "--seq" && has_value) {
      flags.seq = std::atoi(argv[++i]);
      if (flags.seq < 1) return false;
    } else if (arg == "--no-dropout") {
      flags.no_dropout = true;
    } else if (arg == "--dump" && has_value) {
      flags.dump = argv[++i];
    } else {
      return false;
    }
  }
  return flags.workload != nullptr && variant_given && (flags.dump.empty() || flags.no_dropout);
}

absl::StatusOr<Tensor> IdsAsFloats(const Tensor& ids) {
  NF_ASSIGN_OR_RETURN(Tensor floats, Tensor::HostZeros(DType::kF32, {ids.numel()}));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    floats.data<float>()[i] = static_cast<float>(ids.data<int32_t>()[i]);
  }
  return floats;
}

// Writes --dump's file; leaves the gradients zeroed as it found them.
absl::Status Dump(launcher::Trainer& trainer, const FixedBatch& batch,
                  const std::filesystem::path& file) {
  model::NormFormerModel& model = *trainer.chunks().front();
  NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum loss,
                      model.Forward(batch.inputs, batch.targets, 0, /*train=*/true));
  NF_RETURN_IF_ERROR(model.Backward(1.0f / static_cast<float>(loss.tokens)));
  NF_ASSIGN_OR_RETURN(const double squared_norm, model.params().OwnedSquaredGradNorm());
  NF_RETURN_IF_ERROR(model.params().ZeroGrads());
  std::vector<checkpoint::NamedTensor> tensors;
  for (const model::ParamTable::Entry& e : model.params().entries()) {
    NF_ASSIGN_OR_RETURN(Tensor flat, e.value.Reshape({e.value.numel()}));
    tensors.push_back({e.spec.name, e.local_shape, flat});
  }
  for (const auto& [name, ids] :
       {std::pair{"inputs", &batch.inputs}, {"targets", &batch.targets}}) {
    NF_ASSIGN_OR_RETURN(Tensor floats, IdsAsFloats(*ids));
    tensors.push_back({name, ids->shape(), floats});
  }
  return checkpoint::WriteSafetensors(
      file,
      {{"loss", absl::StrFormat("%.9g", loss.sum / static_cast<double>(loss.tokens))},
       {"grad_norm", absl::StrFormat("%.9g", std::sqrt(squared_norm))}},
      tensors);
}

absl::StatusOr<double> TrainStepSeconds(launcher::Trainer& trainer) {
  NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, trainer.TrainStep());
  if (!std::isfinite(stats.loss) || stats.skipped) {
    return absl::InternalError(absl::StrCat("step ", stats.step, ": loss ", stats.loss));
  }
  return stats.seconds;
}

// Forward + backward of the fixed micro-batch, as many times as the step has micro-batches;
// the gradients it accumulates are zeroed by the next TrainStep.
absl::StatusOr<double> ForwardBackwardSeconds(launcher::Trainer& trainer,
                                              const launcher::TrainOptions& train,
                                              const FixedBatch& batch) {
  model::NormFormerModel& model = *trainer.chunks().front();
  const float loss_weight =
      1.0f / static_cast<float>(int64_t{train.global_batch_size()} * train.seq_len());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < train.global_batch_size() / train.micro_batch_size(); ++i) {
    NF_RETURN_IF_ERROR(model.Forward(batch.inputs, batch.targets, 0, /*train=*/true).status());
    NF_RETURN_IF_ERROR(model.Backward(loss_weight));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status Serve(const Flags& flags) {
  const Ceilings ceilings = MeasureCeilings();
  Workload w = *flags.workload;
  if (flags.seq > 0) w.seq_len = flags.seq;
  if (flags.no_dropout) w.dropout = w.attention_dropout = 0.0f;
  const launcher::TrainConfig config = MakeConfig(w, flags.normformer);
  NF_RETURN_IF_ERROR(launcher::ValidateTrainConfig(config));
  NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                      launcher::Trainer::Create(config));
  NF_ASSIGN_OR_RETURN(const FixedBatch batch, MakeFixedBatch(config));
  if (!flags.dump.empty()) NF_RETURN_IF_ERROR(Dump(*trainer, batch, flags.dump));
  for (int i = 0; i < kWarmupSteps; ++i) NF_RETURN_IF_ERROR(TrainStepSeconds(*trainer).status());
  std::printf("ready params=%lld gflop_per_step=%.4f sgemm_gflops=%.2f\n",
              static_cast<long long>(trainer->num_global_params()),
              StepGflops(w, trainer->num_global_params()), ceilings.sgemm_gflops);
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "step") {
      NF_ASSIGN_OR_RETURN(const double seconds, TrainStepSeconds(*trainer));
      std::printf("step %.6f\n", seconds);
    } else if (line == "fb") {
      NF_ASSIGN_OR_RETURN(const double seconds,
                          ForwardBackwardSeconds(*trainer, config.train(), batch));
      std::printf("fb %.6f\n", seconds);
    } else if (line == "sgemm") {
      std::printf("sgemm %.6f\n", MeasureCeilings().sgemm_gflops);
    } else if (line == "quit") {
      break;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown command '", line, "'"));
    }
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: %s --workload tiny|125m --variant prenorm|normformer [--seq N] "
                 "[--no-dropout] [--dump FILE (with --no-dropout)]\n",
                 argv[0]);
    return 2;
  }
  const absl::Status status = Serve(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-step-peer: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) { return nf::bench::Main(argc, argv); }
