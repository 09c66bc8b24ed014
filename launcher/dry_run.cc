#include "launcher/dry_run.h"

#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/memory_check.h"
#include "launcher/memory_estimate.h"
#include "launcher/trainer.h"
#include "model/normformer_params.h"
#include "model/vocab.h"
#include "parallel/topology.h"

namespace nf::launcher {
namespace {

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

}  // namespace

absl::Status DryRun(const TrainConfig& config, int world_size, std::ostream& out) {
  const model::ModelConfig& m = config.model();
  const TrainOptions& train = config.train();
  const ParallelConfig& parallel = config.parallel();
  NF_ASSIGN_OR_RETURN(const parallel::Topology topology,
                      parallel::Topology::Create(world_size, 0, ParallelSizesOf(parallel)));
  const int tp = topology.tp(), pp = topology.pp(), dp = topology.dp();
  // First: it refuses a layout that cannot run, naming what does not fit.
  NF_ASSIGN_OR_RETURN(const std::vector<PipelineRankMemory> ranks,
                      EstimateMemory(config, world_size));
  NF_ASSIGN_OR_RETURN(const int micro_batches, MicroBatchesPerRank(train, dp));
  const int64_t padded_vocab = model::PaddedVocabSize(m.vocab_size(), tp);
  int64_t total_params = 0;
  for (const model::ParamSpec& spec : model::NormFormerParamSpecs(m, padded_vocab)) {
    total_params += NumElements(spec.global_shape);
  }
  const int64_t tokens = int64_t{train.global_batch_size()} * train.seq_len();
  const double flops =
      ModelFlopsPerToken(total_params, m, train.seq_len()) * static_cast<double>(tokens);
  out << ResolvedConfigText(config);
  out << absl::StrFormat(
      "\ndry run: %d ranks = tensor_parallel %d x pipeline_parallel %d x data_parallel %d, %s "
      "(virtual stages %d)%s, %d micro-batches of %d per data-parallel rank\n",
      world_size, tp, pp, dp, ParallelConfig::Schedule_Name(parallel.pipeline_schedule()),
      parallel.virtual_stages(), parallel.distributed_optimizer() ? ", ZeRO-1" : "", micro_batches,
      train.micro_batch_size());
  out << absl::StrFormat(
      "model: %d parameters (vocabulary padded to %d); %.3g TFLOP per step "
      "(%d tokens)\n",
      total_params, padded_vocab, flops / 1e12, tokens);
  const bool gpu = train.device() == TrainOptions::CUDA;
  out << "| pipeline rank | layers | parameters on the rank | params | grads | optimizer | "
         "activations (peak micro-batches) | buffers | checkpoint snapshot (host) | "
         "sample index (host) | flight recorder (host) | "
      << (gpu ? "GPU total | host total" : "total")
      << " |\n|---|---|---|---|---|---|---|---|---|---|" << (gpu ? "---|---|" : "---|") << "\n";
  for (int r = 0; r < pp; ++r) {
    const PipelineRankMemory& rank = ranks[r];
    out << absl::StrFormat(
        "| %d | %s | %d | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s |\n", r, rank.layers,
        rank.parameters, Gib(rank.parameter_bytes), Gib(rank.gradient_bytes),
        Gib(rank.optimizer_bytes), Gib(rank.activation_bytes), rank.peak_in_flight,
        Gib(rank.buffer_bytes), Gib(rank.snapshot_bytes), Gib(rank.sample_index_bytes),
        Gib(rank.flight_recorder_bytes),
        gpu ? absl::StrCat(Gib(rank.device_bytes()), " | ", Gib(rank.gpu_host_bytes()))
            : Gib(rank.cpu_total_bytes()));
  }
  if (gpu) {
    for (int r = 0; r < pp; ++r) {
      out << absl::StrFormat("pipeline rank %d's GPU total includes the runtime's %s: %s\n", r,
                             Gib(ranks[r].runtime_bytes()), RuntimeParts(ranks[r]));
    }
  }
  out << "(tensor-parallel and data-parallel rank 0 shown: they also hold the replicated\n"
         "parameters and write them; the ops' temporaries and the process's own footprint are\n"
         "not counted: docs/memory.md compares with the allocator's counts and measured peaks)\n";
  return absl::OkStatus();
}

}  // namespace nf::launcher
