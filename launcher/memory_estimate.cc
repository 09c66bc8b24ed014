#include "launcher/memory_estimate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/ops/backend.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "model/normformer_model.h"
#include "model/normformer_params.h"
#include "model/vocab.h"
#include "parallel/flight_recorder.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/topology.h"

namespace nf::launcher {
namespace {

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

int64_t NcclBufferBytes(int communicators) {
  return communicators * kNcclChannels *
         (kNcclSimpleBufferBytes + kNcclLl128BufferBytes + kNcclLlBufferBytes);
}

int NcclCommunicatorCount(int tp, int pp, int dp, int pp_rank) {
  const bool embedding = pp > 1 && (pp_rank == 0 || pp_rank == pp - 1);
  return (tp > 1 ? 1 : 0) + (dp > 1 ? 1 : 0) + (pp > 1 ? 1 : 0) + (embedding ? 1 : 0);
}

int64_t CudnnAttentionWorkspaceBytes(int64_t batch, int64_t local_heads, int64_t seq_len) {
  return batch * local_heads * seq_len * seq_len * 2;
}

bool CudnnAttentionCounts(const TrainConfig& config) {
  const model::ModelConfig& m = config.model();
  const DType dtype = ModelDType(config.train().precision());
  if (dtype != DType::kF16 && dtype != DType::kBF16) return false;
  if (m.num_heads() <= 0 || m.d_model() % m.num_heads() != 0) return false;
  const int64_t head_dim = m.d_model() / m.num_heads();
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128;
}

absl::StatusOr<std::vector<PipelineRankMemory>> EstimateMemory(const TrainConfig& config,
                                                               int world_size) {
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

  const int64_t s = static_cast<int64_t>(SizeOf(ModelDType(train.precision())));
  const int64_t padded_vocab = model::PaddedVocabSize(m.vocab_size(), tp);
  const model::ModelOptions options{.dtype = ModelDType(train.precision()),
                                    .micro_batch = train.micro_batch_size(),
                                    .seq_len = train.seq_len(),
                                    .recompute = RecomputeOf(train),
                                    .sequence_parallel = parallel.sequence_parallel()};
  const model::LayerShape shape = model::LayerShapeOf(m, options, 0, tp);
  // Every rank reads its batches from the same streams (data-parallel ranks pick their part).
  double sample_index_bytes = 0;
  if (!config.data().path().empty() || config.data().blend_size() > 0) {
    constexpr double kBytesPerSample = 24;  // sample index (2 x i64) and shuffle index (i64)
    double samples = static_cast<double>(train.train_iters()) * train.global_batch_size();
    if (train.eval_interval() > 0) {
      samples += static_cast<double>(train.eval_iters()) * train.global_batch_size();
    }
    sample_index_bytes = kBytesPerSample * samples;
  }
  std::vector<PipelineRankMemory> ranks(pp);
  for (int r = 0; r < pp; ++r) {
    NF_ASSIGN_OR_RETURN(
        const std::vector<parallel::Action> schedule,
        parallel::BuildSchedule(KindOf(parallel.pipeline_schedule()), pp, r, micro_batches, v));
    const std::vector<int> peak = PeakInFlight(schedule, v);
    PipelineRankMemory& rank = ranks[r];
    int64_t activations = 0, buffers = 0;
    for (int c = 0; c < v; ++c) {
      const int stage = c * pp + r;
      const model::PipelineStagePlacement placement{.stage = stage,
                                                    .num_stages = pp * v,
                                                    .layer_begin = stages[stage].first,
                                                    .layer_end = stages[stage].second};
      for (const model::ParamSpec& spec : model::NormFormerParamSpecs(m, padded_vocab, placement)) {
        int64_t n = NumElements(spec.global_shape);
        if (spec.sharding != model::Sharding::kReplicated) n /= tp;
        rank.parameters += n;
      }
      model::ModelOptions chunk_options = options;
      chunk_options.pipeline = placement;
      // Kept per micro-batch in flight (NormFormerModel::AllocateInFlight).
      activations += peak[c] * model::NormFormerModel::InFlightBytes(m, chunk_options, tp);
      buffers += model::NormFormerModel::BufferBytes(m, chunk_options, tp);
      rank.layers += absl::StrFormat("%s[%d, %d)", c > 0 ? " " : "", placement.layer_begin,
                                     placement.layer_end);
      rank.peak_in_flight += absl::StrFormat("%s%d", c > 0 ? "+" : "", peak[c]);
    }
    const auto params = static_cast<double>(rank.parameters);
    rank.parameter_bytes = params * s;
    rank.gradient_bytes = params * 4;
    // fp32 master weights (none for fp32 models: the parameters are the master) and moments;
    // ZeRO-1 keeps them for 1 / dp of the parameters, and with them that shard's copy of the
    // parameters (model dtype) and its reduced gradients (fp32).
    rank.optimizer_bytes = parallel.distributed_optimizer()
                               ? params * (s + 4 + (s == 4 ? 0 : 4) + 8) / dp
                               : params * ((s == 4 ? 0 : 4) + 8);
    rank.activation_bytes = static_cast<double>(activations);
    rank.buffer_bytes = static_cast<double>(buffers);
    if (train.device() == TrainOptions::CUDA) {
      rank.gemm_workspace_bytes = static_cast<double>(ops::kGpuGemmWorkspaceBytes);
      rank.nccl_buffer_bytes =
          static_cast<double>(NcclBufferBytes(NcclCommunicatorCount(tp, pp, dp, r)));
      if (CudnnAttentionCounts(config)) {
        rank.attention_workspace_bytes = static_cast<double>(
            CudnnAttentionWorkspaceBytes(train.micro_batch_size(), shape.heads, train.seq_len()));
      }
    }
    rank.sample_index_bytes = sample_index_bytes;
    rank.flight_recorder_bytes =
        static_cast<double>(parallel.flight_recorder_entries()) * sizeof(parallel::FlightEntry);
    const auto& checkpoint = config.checkpoint();
    if (checkpoint.save_interval() > 0 || checkpoint.save_at_end()) {
      // Its parameters in the model dtype, and the fp32 master weights and two moments of its
      // optimizer slice (a checkpoint records the master even where the parameters are it).
      const int shards = parallel.distributed_optimizer() ? dp : 1;
      rank.snapshot_bytes = rank.parameter_bytes + params * 12 / shards;
    }
  }
  return ranks;
}

}  // namespace nf::launcher
