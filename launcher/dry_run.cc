#include "launcher/dry_run.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/trainer.h"
#include "model/normformer_model.h"
#include "model/normformer_params.h"
#include "model/vocab.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/topology.h"

namespace nf::launcher {
namespace {

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

parallel::ScheduleKind KindOf(ParallelConfig::Schedule schedule) {
  if (schedule == ParallelConfig::GPIPE) return parallel::ScheduleKind::kGPipe;
  if (schedule == ParallelConfig::INTERLEAVED_ONE_F_ONE_B) {
    return parallel::ScheduleKind::kInterleavedOneFOneB;
  }
  return parallel::ScheduleKind::kOneFOneB;
}

// The most micro-batches in flight at once on each chunk of a rank's schedule.
std::vector<int> PeakInFlight(const std::vector<parallel::Action>& schedule, int chunks) {
  std::vector<int> now(chunks, 0), peak(chunks, 0);
  for (const parallel::Action& a : schedule) {
    if (a.kind == parallel::Action::kForward) {
      peak[a.model_chunk] = std::max(peak[a.model_chunk], ++now[a.model_chunk]);
    } else if (a.kind == parallel::Action::kBackward) {
      --now[a.model_chunk];
    }
  }
  return peak;
}

}  // namespace

absl::Status DryRun(const TrainConfig& config, int world_size, std::ostream& out) {
  const model::ModelConfig& m = config.model();
  const TrainOptions& train = config.train();
  const ParallelConfig& parallel = config.parallel();
  NF_ASSIGN_OR_RETURN(const parallel::Topology topology,
                      parallel::Topology::Create(world_size, 0, ParallelSizesOf(parallel)));
  const int tp = topology.tp(), pp = topology.pp(), dp = topology.dp();
  const int v = parallel.virtual_stages();
  NF_ASSIGN_OR_RETURN(const int micro_batches, MicroBatchesPerRank(train, dp));
  const std::vector<int> split(parallel.layers_per_stage().begin(),
                               parallel.layers_per_stage().end());
  std::vector<std::pair<int, int>> stages;
  if (split.empty()) {
    NF_RETURN_IF_ERROR(parallel::CheckLayerSplit(m.num_layers(), pp, v));
    stages = parallel::StageLayers(m.num_layers(), pp, v);
  } else {
    NF_ASSIGN_OR_RETURN(stages, parallel::StageLayers(m.num_layers(), pp, v, split));
  }

  const DType dtype = ModelDType(train.precision());
  const int64_t s = static_cast<int64_t>(SizeOf(dtype));
  const int64_t padded_vocab = model::PaddedVocabSize(m.vocab_size(), tp);
  int64_t total_params = 0;
  for (const model::ParamSpec& spec : model::NormFormerParamSpecs(m, padded_vocab)) {
    total_params += NumElements(spec.global_shape);
  }
  const int64_t tokens = int64_t{train.global_batch_size()} * train.seq_len();
  const double flops =
      ModelFlopsPerToken(total_params, m.num_layers(), m.d_model(), train.seq_len()) *
      static_cast<double>(tokens);
  out << ResolvedConfigText(config);
  out << absl::StrFormat(
      "\ndry run: %d ranks = tensor_parallel %d x pipeline_parallel %d x data_parallel %d, %s "
      "(virtual stages %d)%s, %d micro-batches of %d per data-parallel rank\n",
      world_size, tp, pp, dp, ParallelConfig::Schedule_Name(parallel.pipeline_schedule()), v,
      parallel.distributed_optimizer() ? ", ZeRO-1" : "", micro_batches, train.micro_batch_size());
  out << absl::StrFormat(
      "model: %d parameters (vocabulary padded to %d); %.3g TFLOP per step "
      "(%d tokens)\n",
      total_params, padded_vocab, flops / 1e12, tokens);
  out << "| pipeline rank | layers | parameters on the rank | params | grads | optimizer | "
         "activations (peak micro-batches) | total |\n|---|---|---|---|---|---|---|---|\n";

  const model::ModelOptions options{.dtype = dtype,
                                    .micro_batch = train.micro_batch_size(),
                                    .seq_len = train.seq_len(),
                                    .activation_recompute = train.activation_recompute()};
  const model::LayerShape shape = model::LayerShapeOf(m, options, 0, tp);
  const int64_t layer_bytes = model::LayerActivations::Bytes(shape, model::LayerOptionsOf(m));
  const int64_t t = shape.tokens(), d = m.d_model();
  for (int r = 0; r < pp; ++r) {
    NF_ASSIGN_OR_RETURN(
        const std::vector<parallel::Action> schedule,
        parallel::BuildSchedule(KindOf(parallel.pipeline_schedule()), pp, r, micro_batches, v));
    const std::vector<int> peak = PeakInFlight(schedule, v);
    int64_t params = 0, activations = 0;
    std::string layers;
    for (int c = 0; c < v; ++c) {
      const int stage = c * pp + r;
      const model::PipelineStagePlacement placement{.stage = stage,
                                                    .num_stages = pp * v,
                                                    .layer_begin = stages[stage].first,
                                                    .layer_end = stages[stage].second};
      for (const model::ParamSpec& spec : model::NormFormerParamSpecs(m, padded_vocab, placement)) {
        int64_t n = NumElements(spec.global_shape);
        if (spec.sharding != model::Sharding::kReplicated) n /= tp;
        params += n;
      }
      const int64_t n_layers = placement.layer_end - placement.layer_begin;
      // Kept per micro-batch in flight: each layer's input and activations (only the inputs
      // with recompute, which shares one layer's activations), and the last stage's logits.
      int64_t per_micro_batch = (n_layers + 1) * t * d * s;
      if (!train.activation_recompute()) per_micro_batch += n_layers * layer_bytes;
      if (placement.last()) per_micro_batch += t * (padded_vocab / tp) * s + t * d * s;
      activations += peak[c] * per_micro_batch;
      if (train.activation_recompute()) activations += layer_bytes;
      layers += absl::StrFormat("%s[%d, %d)", c > 0 ? " " : "", placement.layer_begin,
                                placement.layer_end);
    }
    const double param_bytes = static_cast<double>(params) * s;
    const double grad_bytes = static_cast<double>(params) * 4;
    // fp32 master weights (none for fp32 models: the parameters are the master) and moments.
    double optimizer_bytes = static_cast<double>(params) * ((s == 4 ? 0 : 4) + 8);
    if (parallel.distributed_optimizer()) optimizer_bytes /= dp;
    const double total = param_bytes + grad_bytes + optimizer_bytes + activations;
    std::string peaks;
    for (int c = 0; c < v; ++c) peaks += absl::StrFormat("%s%d", c > 0 ? "+" : "", peak[c]);
    out << absl::StrFormat("| %d | %s | %d | %s | %s | %s | %s (%s) | %s |\n", r, layers, params,
                           Gib(param_bytes), Gib(grad_bytes), Gib(optimizer_bytes),
                           Gib(static_cast<double>(activations)), peaks, Gib(total));
  }
  out << "(tensor-parallel rank 0 shown: it also holds the replicated parameters; buffers for\n"
         "communication and the op scratch are not counted)\n";
  return absl::OkStatus();
}

}  // namespace nf::launcher
