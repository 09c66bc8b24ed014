#include "launcher/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/fault_injection.h"
#include "model/normformer_params.h"
#include "model/vocab.h"
#include "parallel/coalesced_all_reduce.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/watchdog.h"

namespace nf::launcher {

using parallel::GroupKind;

namespace {

optim::LrSchedule ScheduleOf(const TrainOptions& train) {
  const LrScheduleConfig& s = train.lr_schedule();
  optim::LrSchedule::Decay decay = optim::LrSchedule::Decay::kLinear;
  if (s.decay() == LrScheduleConfig::COSINE) decay = optim::LrSchedule::Decay::kCosine;
  if (s.decay() == LrScheduleConfig::CONSTANT) decay = optim::LrSchedule::Decay::kConstant;
  return {.peak_lr = train.optimizer().lr(),
          .warmup_iters = s.warmup_iters(),
          .decay_iters = s.decay_iters() == 0 ? train.train_iters() : s.decay_iters(),
          .min_lr = s.min_lr(),
          .decay = decay};
}

optim::LossScalerConfig ScalerConfigOf(const LossScaleConfig& c) {
  return {.initial_scale = c.initial_scale(),
          .growth_factor = c.growth_factor(),
          .backoff_factor = c.backoff_factor(),
          .growth_interval = c.growth_interval(),
          .hysteresis = c.hysteresis(),
          .min_scale = c.min_scale()};
}

}  // namespace

DType ModelDType(TrainOptions::Precision precision) {
  switch (precision) {
    case TrainOptions::FP16:
      return DType::kF16;
    case TrainOptions::BF16:
      return DType::kBF16;
    default:
      return DType::kF32;
  }
}

model::Recompute RecomputeOf(const TrainOptions& train) {
  if (train.activation_recompute()) return model::Recompute::kFull;
  switch (train.recompute()) {
    case TrainOptions::SELECTIVE:
      return model::Recompute::kSelective;
    case TrainOptions::FULL:
      return model::Recompute::kFull;
    default:
      return model::Recompute::kNone;
  }
}

optim::AdamWConfig AdamWConfigOf(const OptimizerConfig& o) {
  return {.beta1 = o.beta1(),
          .beta2 = o.beta2(),
          .eps = o.eps(),
          .weight_decay = o.weight_decay(),
          .clip_grad = o.clip_grad()};
}

parallel::ParallelSizes ParallelSizesOf(const ParallelConfig& config) {
  return {.tp = config.tensor_parallel(),
          .pp = config.pipeline_parallel(),
          .dp = config.data_parallel()};
}

namespace {

parallel::ScheduleKind ScheduleKindOf(ParallelConfig::Schedule schedule) {
  switch (schedule) {
    case ParallelConfig::GPIPE:
      return parallel::ScheduleKind::kGPipe;
    case ParallelConfig::INTERLEAVED_ONE_F_ONE_B:
      return parallel::ScheduleKind::kInterleavedOneFOneB;
    default:
      return parallel::ScheduleKind::kOneFOneB;
  }
}

}  // namespace

absl::StatusOr<int> MicroBatchesPerRank(const TrainOptions& train, int dp) {
  const int64_t per_step = int64_t{dp} * train.micro_batch_size();
  const int64_t down = train.global_batch_size() / per_step * per_step;
  if (train.global_batch_size() % per_step != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.global_batch_size (", train.global_batch_size(),
                     ") must be a multiple of data_parallel (", dp, ") x train.micro_batch_size (",
                     train.micro_batch_size(), ") = ", per_step, ": e.g. ",
                     down > 0 ? absl::StrCat(down, " or ") : "", down + per_step));
  }
  return static_cast<int>(train.global_batch_size() / per_step);
}

int GpuOfLocalRank(int local_rank, int gpus) { return gpus > 0 ? local_rank % gpus : 0; }

absl::Status CheckOneRankPerGpu(const std::vector<std::string>& hosts,
                                const std::vector<std::string>& gpu_uuids) {
  absl::flat_hash_map<std::string, size_t> first_rank;  // GPU UUID -> the first rank on it
  for (size_t rank = 0; rank < gpu_uuids.size(); ++rank) {
    const auto [it, inserted] = first_rank.emplace(gpu_uuids[rank], rank);
    if (inserted) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "train.device: CUDA: ranks ", it->second, " and ", rank, " on ", hosts[rank],
        " would both drive GPU ", gpu_uuids[rank],
        "; run one rank per GPU: at most as many ranks per node as GPUs, each rank seeing all of "
        "them (it takes GPU local rank % GPUs; a CUDA_VISIBLE_DEVICES per rank or "
        "--gpus-per-task=1 also works but hides the peers' GPUs from NCCL)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDistinctLocalRanks(const std::vector<std::string>& hosts,
                                     const std::vector<int>& local_ranks,
                                     absl::string_view source) {
  absl::flat_hash_map<std::pair<std::string, int>, size_t> first_rank;  // (host, local) -> rank
  for (size_t rank = 0; rank < local_ranks.size(); ++rank) {
    const auto [it, inserted] = first_rank.emplace(std::pair(hosts[rank], local_ranks[rank]), rank);
    if (inserted) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "local rank: ranks ", it->second, " and ", rank, " on ", hosts[rank],
        " both have local rank ", local_ranks[rank], " (from ", source,
        "), so they would pick the same GPU; under an mpirun inside sbatch every rank inherits "
        "SLURM_LOCALID=0: use a launcher that sets its own local rank (Open MPI's "
        "OMPI_COMM_WORLD_LOCAL_RANK, MPICH's or Intel MPI's MPI_LOCALRANKID, PMI_LOCAL_RANK) "
        "or srun"));
  }
  return absl::OkStatus();
}

std::string SingleGpuRanksWarning(const std::vector<std::string>& hosts,
                                  const std::vector<int>& visible_gpus) {
  // Per node, in order of its lowest rank: its ranks, and whether each sees exactly one GPU.
  std::vector<std::string> nodes;
  absl::flat_hash_map<std::string, std::pair<int, bool>> per_node;  // ranks, all see one
  absl::flat_hash_map<std::string, size_t> lowest;
  for (size_t rank = 0; rank < hosts.size(); ++rank) {
    const auto [it, inserted] = per_node.emplace(hosts[rank], std::pair(0, true));
    if (inserted) {
      nodes.push_back(hosts[rank]);
      lowest[hosts[rank]] = rank;
    }
    ++it->second.first;
    it->second.second = it->second.second && visible_gpus[rank] == 1;
  }
  for (const std::string& node : nodes) {
    const auto [ranks, all_one] = per_node[node];
    if (ranks < 2 || !all_one) continue;
    return absl::StrCat(
        "warning: rank ", lowest[node], " sees exactly one GPU, as does each of the ", ranks,
        " ranks on ", node,
        " (--gpus-per-task=1 or a CUDA_VISIBLE_DEVICES per rank): NCCL cannot use P2P/NVLink "
        "to GPUs a process does not see and falls back to slower paths; make every GPU of the "
        "node visible to every rank (--gpus-per-node, no per-rank CUDA_VISIBLE_DEVICES), and "
        "each rank takes GPU local rank % GPUs");
  }
  return std::string();
}

absl::Status CheckOneRankPerGpu(const parallel::ProcessGroups& groups, Device device) {
  const int world = groups.topology.world_size();
  if (device.type != DeviceType::kCuda || world == 1) return absl::OkStatus();
  // Each rank's record: its GPU's UUID, its local rank and how many GPUs it sees.
  constexpr int64_t kUuidBytes = 40;  // "GPU-" + 32 hex digits + 4 dashes
  constexpr int64_t kRecordBytes = kUuidBytes + 2 * sizeof(int32_t);
  NF_ASSIGN_OR_RETURN(const std::string uuid, ops::GpuUuid(device.index));
  NF_ASSIGN_OR_RETURN(const int local_rank, parallel::DiscoverLocalRank());
  const auto numbers = std::array<int32_t, 2>{local_rank, ops::GpuCount()};
  NF_ASSIGN_OR_RETURN(Tensor mine, Tensor::HostZeros(DType::kU8, {kRecordBytes}));
  auto* record = static_cast<char*>(mine.raw_data());
  std::memcpy(record, uuid.data(), std::min<size_t>(uuid.size(), kUuidBytes));
  std::memcpy(record + kUuidBytes, numbers.data(), sizeof(numbers));
  NF_ASSIGN_OR_RETURN(Tensor all, Tensor::HostZeros(DType::kU8, {world * kRecordBytes}));
  NF_RETURN_IF_ERROR(groups.world->AllGather(mine, all));
  std::vector<std::string> uuids;
  std::vector<int> local_ranks, visible_gpus;
  for (int rank = 0; rank < world; ++rank) {
    const char* bytes = static_cast<const char*>(all.raw_data()) + rank * kRecordBytes;
    uuids.emplace_back(bytes, strnlen(bytes, kUuidBytes));
    std::array<int32_t, 2> theirs;
    std::memcpy(theirs.data(), bytes + kUuidBytes, sizeof(theirs));
    local_ranks.push_back(theirs[0]);
    visible_gpus.push_back(theirs[1]);
  }
  // The same verdict on every rank (the same gathered records): the local ranks first, as
  // two ranks sharing one would also share a GPU.
  NF_RETURN_IF_ERROR(
      CheckDistinctLocalRanks(groups.hosts, local_ranks, parallel::LocalRankSource()));
  NF_RETURN_IF_ERROR(CheckOneRankPerGpu(groups.hosts, uuids));
  if (groups.topology.world_rank() == 0) {
    const std::string warning = SingleGpuRanksWarning(groups.hosts, visible_gpus);
    if (!warning.empty()) std::cerr << warning << "\n";
  }
  return absl::OkStatus();
}

namespace {

// The flat offset below which a chunk's gradients wait for the embedding group's sum: the end
// of its embedding-group parameters (0: none).
int64_t EmbeddingGroupEnd(const model::NormFormerModel& chunk) {
  int64_t end = 0;
  for (const std::string& name : chunk.embedding_group_params()) {
    const model::ParamTable::Entry& e = chunk.params().Get(name);
    end = std::max(end, e.offset + e.grad.numel());
  }
  return end;
}

}  // namespace

absl::StatusOr<Device> TrainingDevice(const TrainOptions& train) {
  if (train.device() == TrainOptions::CPU) return Device::Cpu();
  NF_RETURN_IF_ERROR(CheckDeviceAvailable(train));
  const int gpus = ops::GpuCount();
  NF_ASSIGN_OR_RETURN(const int local_rank, parallel::DiscoverLocalRank());
  return Device::Cuda(GpuOfLocalRank(local_rank, gpus));
}

std::string NoGpuMessage(absl::string_view setting, absl::string_view cuda_error) {
  if (!cuda_error.empty()) {
    return absl::StrCat(setting, ", but this process sees no GPU: ", cuda_error,
                        " (check the driver with nvidia-smi)");
  }
  return absl::StrCat(setting,
                      ", but this process sees no GPU (a build without nvcc has no CUDA backend; "
                      "else check nvidia-smi and CUDA_VISIBLE_DEVICES)");
}

absl::Status CheckDeviceAvailable(const TrainOptions& train) {
  if (train.device() == TrainOptions::CPU || ops::GpuCount() > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      NoGpuMessage("train.device: CUDA", ops::GpuCountError()), ", or set train.device: CPU"));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         parallel::ProcessGroups& groups) {
  const TrainOptions& train = config.train();
  const ParallelConfig& parallel = config.parallel();
  const parallel::Topology& topology = groups.topology;
  if (topology.tp() != parallel.tensor_parallel() ||
      topology.pp() != parallel.pipeline_parallel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the process groups (", topology.ToString(),
                     ") do not match parallel.tensor_parallel ", parallel.tensor_parallel(),
                     " x parallel.pipeline_parallel ", parallel.pipeline_parallel()));
  }
  NF_ASSIGN_OR_RETURN(const Device device, TrainingDevice(train));
  NF_RETURN_IF_ERROR(CheckOneRankPerGpu(groups, device));
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->device_ = device;
  t->groups_ = &groups;
#if NF_WITH_CUDA
  // A GPU job moves device tensors over NCCL, and a group of one rank keeps them where they are
  // (without the CUDA backend TrainingDevice never picks a GPU). Also under `mpirun -np 1`,
  // whose groups are MPI communicators of one rank that move host tensors only.
  if (device.type == DeviceType::kCuda) {
    NF_ASSIGN_OR_RETURN(t->device_groups_, parallel::CreateDeviceGroups(groups, device));
  }
#endif
  NF_ASSIGN_OR_RETURN(t->micro_batches_, MicroBatchesPerRank(train, topology.dp()));

  const int p = topology.pp(), v = parallel.virtual_stages();
  const std::vector<int> split(parallel.layers_per_stage().begin(),
                               parallel.layers_per_stage().end());
  std::vector<std::pair<int, int>> stages;
  if (split.empty()) {
    NF_RETURN_IF_ERROR(parallel::CheckLayerSplit(config.model().num_layers(), p, v));
    stages = parallel::StageLayers(config.model().num_layers(), p, v);
  } else {
    NF_ASSIGN_OR_RETURN(stages, parallel::StageLayers(config.model().num_layers(), p, v, split));
  }
  const parallel::DataParallelOptions dp_options = {
      .bucket_elements =
          model::AlignedBucketElements(parallel.grad_bucket_elements(), topology.dp()),
      .shard_optimizer = parallel.distributed_optimizer()};
  std::vector<model::NormFormerModel*> chunk_views;
  for (int c = 0; c < v; ++c) {
    const int stage = c * p + topology.pp_rank();
    NF_ASSIGN_OR_RETURN(std::unique_ptr<model::NormFormerModel> chunk,
                        model::NormFormerModel::Create(
                            config.model(), {.dtype = ModelDType(train.precision()),
                                             .micro_batch = train.micro_batch_size(),
                                             .seq_len = train.seq_len(),
                                             .recompute = RecomputeOf(train),
                                             .seed = train.seed(),
                                             .device = device,
                                             .param_buffer_multiple = topology.dp(),
                                             .tensor_parallel = t->DeviceGroup(GroupKind::kTensor),
                                             .sequence_parallel = parallel.sequence_parallel(),
                                             .overlap_tensor_parallel_comm =
                                                 parallel.overlap_tensor_parallel_comm(),
                                             .pipeline = {.stage = stage,
                                                          .num_stages = p * v,
                                                          .layer_begin = stages[stage].first,
                                                          .layer_end = stages[stage].second}}));
    model::ParamTable& table = chunk->params();
    parallel::DataParallelOptions options = dp_options;
    options.hold_below = EmbeddingGroupEnd(*chunk);
    NF_ASSIGN_OR_RETURN(
        std::unique_ptr<parallel::DataParallelOptimizer> optimizer,
        parallel::DataParallelOptimizer::Create(table.params(), table.grads(), table.DecayRanges(),
                                                AdamWConfigOf(train.optimizer()),
                                                *t->DeviceGroup(GroupKind::kData), options));
    NF_RETURN_IF_ERROR(optimizer->InitializeMasterFromModel());
    chunk_views.push_back(chunk.get());
    t->chunks_.push_back(std::move(chunk));
    t->optimizers_.push_back(std::move(optimizer));
  }
  NF_ASSIGN_OR_RETURN(
      PipelineExecutor executor,
      PipelineExecutor::Create(chunk_views, *t->DeviceGroup(GroupKind::kPipeline),
                               ScheduleKindOf(parallel.pipeline_schedule()), t->micro_batches_));
  t->executor_.emplace(std::move(executor));
  t->schedule_ = ScheduleOf(train);
  NF_RETURN_IF_ERROR(optim::Validate(t->schedule_));
  if (train.precision() == TrainOptions::FP16) {
    NF_ASSIGN_OR_RETURN(t->scaler_,
                        optim::DynamicLossScaler::Create(ScalerConfigOf(train.loss_scale())));
  }
  NF_ASSIGN_OR_RETURN(t->batches_, MakeBatchSource(config));
  t->stream_samples_ = DefaultStreamSize(config, DataSplit::kTrain);
  t->skipped_samples_ =
      MergeWindows({}, {train.skip_samples().begin(), train.skip_samples().end()});
  t->spikes_ = SpikeDetector(train.spike());
  NF_ASSIGN_OR_RETURN(t->injected_grad_spikes_, InjectedGradSpikeSteps());
  NF_ASSIGN_OR_RETURN(t->injected_desync_, InjectedDesyncOf());
  NF_ASSIGN_OR_RETURN(t->injected_slow_rank_, InjectedSlowRankOf());
  NF_ASSIGN_OR_RETURN(t->injected_absent_rank_, InjectedAbsentRankOf());
  NF_ASSIGN_OR_RETURN(t->injected_nan_, InjectedNanOf());
  for (const model::ParamSpec& spec : model::NormFormerParamSpecs(
           config.model(), model::PaddedVocabSize(config.model().vocab_size(), topology.tp()))) {
    t->num_global_params_ += NumElements(spec.global_shape);
  }
  return t;
}

parallel::Communicator* Trainer::DeviceGroup(parallel::GroupKind kind) const {
  const std::unique_ptr<parallel::Communicator>* device = nullptr;
  switch (kind) {
    case GroupKind::kTensor:
      device = &device_groups_.tp;
      break;
    case GroupKind::kData:
      device = &device_groups_.dp;
      break;
    case GroupKind::kPipeline:
      device = &device_groups_.pp;
      break;
    case GroupKind::kEmbedding:
      device = &device_groups_.embedding;
      break;
    default:
      break;
  }
  return device != nullptr && *device != nullptr ? device->get() : groups_->group(kind);
}

std::map<std::string, parallel::CommStats> Trainer::CommTotals() const {
  std::map<std::string, parallel::CommStats> totals;
  const parallel::DeviceGroups& d = device_groups_;
  for (const parallel::Communicator* group :
       {groups_->world.get(), groups_->tp.get(), groups_->dp.get(), groups_->pp.get(),
        groups_->mp.get(), groups_->embedding.get(), d.tp.get(), d.dp.get(), d.pp.get(),
        d.embedding.get()}) {
    if (group != nullptr) totals[group->name()].Add(group->stats());
  }
  return totals;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config) {
  auto groups = std::make_unique<parallel::ProcessGroups>(parallel::SingleProcessGroups());
  NF_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Create(config, *groups));
  trainer->own_groups_ = std::move(groups);
  return trainer;
}

checkpoint::RankState Trainer::CheckpointState() {
  checkpoint::RankState state;
  state.topology = groups_->topology;
  const ParallelConfig& parallel = config_.parallel();
  state.layout.set_tensor_parallel(state.topology.tp());
  state.layout.set_pipeline_parallel(state.topology.pp());
  state.layout.set_data_parallel(state.topology.dp());
  state.layout.set_virtual_stages(parallel.virtual_stages());
  state.layout.set_distributed_optimizer(parallel.distributed_optimizer());
  state.model = config_.model();
  state.train_config = ResolvedConfigText(config_);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    state.chunks.push_back({.params = &chunks_[c]->params(),
                            .optimizer = optimizers_[c].get(),
                            .copies_of_other_stages = chunks_[c]->CopiesOfOtherStages()});
  }
  return state;
}

checkpoint::RunProgress Trainer::Progress() const {
  checkpoint::RunProgress progress{.step = step_,
                                   .consumed_samples = consumed_samples_,
                                   .data_stream_samples = stream_samples_,
                                   .optimizer_updates = optimizers_.front()->adamw().updates(),
                                   .skipped_total = skipped_total_,
                                   .loss_scaler = std::nullopt,
                                   .skipped_samples = skipped_samples_,
                                   .rollbacks = rollbacks_,
                                   .spike_losses = spikes_.losses(),
                                   .spike_grad_norms = spikes_.grad_norms()};
  if (scaler_) progress.loss_scaler = scaler_->state();
  return progress;
}

absl::Status Trainer::ContinueDataStream(const checkpoint::RunProgress& progress) {
  const TrainOptions& train = config_.train();
  const int64_t remaining_steps = std::max<int64_t>(0, train.train_iters() - progress.step);
  const int64_t needed = progress.consumed_samples + remaining_steps * train.global_batch_size();
  const int64_t recorded = progress.data_stream_samples;
  const int64_t size = std::max(recorded, needed);
  if (size != stream_samples_) {
    NF_ASSIGN_OR_RETURN(batches_, MakeBatchSource(config_, DataSplit::kTrain, size));
    stream_samples_ = size;
  }
  // Nothing read yet (an imported checkpoint): the new stream has nothing to continue.
  if (size == recorded || progress.consumed_samples == 0) return absl::OkStatus();
  // A longer stream than the run began with: it continues the samples read so far only if
  // every dataset's samples span as many epochs as before (batch_source.h).
  NF_ASSIGN_OR_RETURN(const std::unique_ptr<BatchSource> begun,
                      MakeBatchSource(config_, DataSplit::kTrain, recorded));
  if (begun->StreamEpochs() == batches_->StreamEpochs()) return absl::OkStatus();
  const int64_t most_steps =
      progress.step + (recorded - progress.consumed_samples) / train.global_batch_size();
  return absl::FailedPreconditionError(absl::StrCat(
      "resuming after step ", progress.step, " (", progress.consumed_samples,
      " samples consumed): ", remaining_steps, " more steps of train.global_batch_size ",
      train.global_batch_size(), " need a data stream of ", needed,
      " samples, but this run's stream holds ", recorded,
      " and a longer one is shuffled differently (it spans more epochs of the data), so the "
      "samples read so far would not be continued exactly; set train.train_iters to at most ",
      most_steps, ", or lower train.global_batch_size"));
}

absl::Status Trainer::Restore(const checkpoint::RunProgress& progress) {
  if (progress.step < 0 || progress.optimizer_updates < 0 || progress.skipped_total < 0 ||
      progress.consumed_samples < 0 || progress.data_stream_samples < 0) {
    return absl::InvalidArgumentError("a checkpoint's progress counters must be >= 0");
  }
  NF_RETURN_IF_ERROR(ContinueDataStream(progress));
  for (const auto& optimizer : optimizers_) {
    NF_RETURN_IF_ERROR(optimizer->adamw().SetUpdates(progress.optimizer_updates));
  }
  if (scaler_ && progress.loss_scaler) NF_RETURN_IF_ERROR(scaler_->SetState(*progress.loss_scaler));
  step_ = progress.step;
  consumed_samples_ = progress.consumed_samples;
  skipped_total_ = progress.skipped_total;
  // The config may name windows the checkpoint's run did not skip yet (a restart past bad data).
  const auto& named = config_.train().skip_samples();
  skipped_samples_ = MergeWindows(progress.skipped_samples, {named.begin(), named.end()});
  rollbacks_ = progress.rollbacks;
  spikes_.Restore(progress.spike_losses, progress.spike_grad_norms);
  return absl::OkStatus();
}

void Trainer::SetSkippedSamples(std::vector<SampleWindow> windows, int64_t rollbacks) {
  skipped_samples_ = MergeWindows(std::move(windows), {});
  rollbacks_ = rollbacks;
}

absl::StatusOr<model::NormFormerModel::LossSum> Trainer::GlobalLoss() {
  // Only the chunk holding the last model stage has losses (the others read zeros).
  model::NormFormerModel::LossSum local;
  for (const auto& chunk : chunks_) {
    NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum taken, chunk->TakeLossSum());
    local.sum += taken.sum;
    local.tokens += taken.tokens;
  }
  const bool reports = chunks_.back()->placement().last() && groups_->topology.tp_rank() == 0;
  NF_ASSIGN_OR_RETURN(const Tensor loss, Tensor::HostZeros(DType::kF64, {2}));
  if (reports) {
    loss.data<double>()[0] = local.sum;
    loss.data<double>()[1] = static_cast<double>(local.tokens);
  }
  NF_RETURN_IF_ERROR(groups_->world->AllReduce(loss, parallel::ReduceOp::kSum));
  return model::NormFormerModel::LossSum{.sum = loss.data<double>()[0],
                                         .tokens = static_cast<int64_t>(loss.data<double>()[1])};
}

// Forward-only through the same executor as training (its forward-only schedule), one
// validation global batch per call, the losses summed in the last stage's chunk.
absl::StatusOr<double> Trainer::Evaluate() {
  const TrainOptions& train = config_.train();
  if (validation_ == nullptr) {
    NF_ASSIGN_OR_RETURN(validation_, MakeBatchSource(config_, DataSplit::kValidation));
  }
  for (int64_t iter = 0; iter < train.eval_iters(); ++iter) {
    const PipelineStep step = {
        .step = iter,
        .batch_start = iter * train.global_batch_size(),
        .first_micro_batch = int64_t{groups_->topology.dp_rank()} * micro_batches_,
        .micro_batch_size = train.micro_batch_size(),
        .loss_weight = 0.0f};
    NF_RETURN_IF_ERROR(executor_->RunForwardOnly(step, *validation_).status());
  }
  NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum global, GlobalLoss());
  return global.tokens > 0 ? global.sum / static_cast<double>(global.tokens) : 0.0;
}

absl::Status Trainer::ReduceEmbeddingGradients() {
  for (const std::unique_ptr<model::NormFormerModel>& chunk : chunks_) {
    for (const std::string& name : chunk->embedding_group_params()) {
      NF_RETURN_IF_ERROR(DeviceGroup(GroupKind::kEmbedding)
                             ->AllReduce(chunk->params().Get(name).grad, parallel::ReduceOp::kSum));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::ReduceSequenceParallelGradients() {
  std::vector<Tensor> partial;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (const optim::FlatRange& r : chunks_[c]->SequenceParallelGradRanges()) {
      NF_ASSIGN_OR_RETURN(std::vector<Tensor> pieces,
                          optimizers_[c]->ReducedGrads(r.offset, r.length));
      for (Tensor& piece : pieces) partial.push_back(std::move(piece));
    }
  }
  return parallel::AllReduceCoalesced(partial, *DeviceGroup(GroupKind::kTensor));
}

absl::StatusOr<double> Trainer::GlobalSquaredNorm(float loss_scale, bool& skipped) {
  NF_ASSIGN_OR_RETURN(const Tensor found, Tensor::HostZeros(DType::kF32, {1}));
  for (const auto& optimizer : optimizers_) {
    NF_ASSIGN_OR_RETURN(const bool nonfinite, optimizer->UnscaleAndCheck(loss_scale));
    if (nonfinite) found.data<float>()[0] = 1.0f;
  }
  NF_RETURN_IF_ERROR(groups_->world->AllReduce(found, parallel::ReduceOp::kMax));
  skipped = found.data<float>()[0] != 0.0f;
  if (skipped) return std::numeric_limits<double>::quiet_NaN();
  NF_ASSIGN_OR_RETURN(const Tensor squared, Tensor::HostZeros(DType::kF64, {1}));
  for (size_t c = 0; c < chunks_.size(); ++c) {
    NF_ASSIGN_OR_RETURN(const double share,
                        optimizers_[c]->SquaredGradNorm(chunks_[c]->OwnedNormRanges()));
    squared.data<double>()[0] += share;
  }
  // Replicated optimizers hold the same reduced gradients on every dp rank: count one copy.
  parallel::Communicator& group =
      config_.parallel().distributed_optimizer() ? *groups_->world : *groups_->mp;
  NF_RETURN_IF_ERROR(group.AllReduce(squared, parallel::ReduceOp::kSum));
  return squared.data<double>()[0];
}

absl::StatusOr<NanOriginAgreement> Trainer::FindNanOrigin(const PipelineStep& step) {
  // The gradients accumulate from zero as in the step (a stale NaN would be found at the first
  // accumulation); no data-parallel reduction: each rank searches its own micro-batches.
  for (const auto& chunk : chunks_) NF_RETURN_IF_ERROR(chunk->params().ZeroGrads());
  const parallel::Topology& topology = groups_->topology;
  const int stages = topology.pp() * static_cast<int>(chunks_.size());
  std::optional<NanOrigin> mine;
  {
    NanOriginSearch search(topology.world_rank(), parallel::RankLabel(), step.first_micro_batch,
                           stages);
    NF_RETURN_IF_ERROR(executor_->Run(step, *batches_, /*grads_done=*/nullptr, &search).status());
    NF_RETURN_IF_ERROR(search.status());
    mine = search.first();
  }
  for (const auto& chunk : chunks_) NF_RETURN_IF_ERROR(chunk->TakeLossSum().status());
  return AgreeOnNanOrigin(mine, stages, *groups_->world);
}

absl::Status Trainer::InjectNan(bool poison) {
  const std::string name = absl::StrCat(model::LayerPrefix(injected_nan_.layer), ".fc1.weight");
  if (groups_->topology.tp_rank() != injected_nan_.tp_rank) return absl::OkStatus();
  for (const auto& chunk : chunks_) {
    if (!chunk->params().Contains(name)) continue;
    NF_ASSIGN_OR_RETURN(const Tensor element, chunk->params().Get(name).value.View(0, {1}));
    if (!poison) return ops::Copy(injected_nan_saved_, element);
    NF_ASSIGN_OR_RETURN(injected_nan_saved_, Tensor::HostZeros(element.dtype(), {1}));
    NF_RETURN_IF_ERROR(ops::Copy(element, injected_nan_saved_));
    return ops::Fill(element, std::numeric_limits<float>::quiet_NaN());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> Trainer::BlockGradNorms() {
  const int layers = config_.model().num_layers();
  // [num_layers + 2]: embedding, layers 0 .. L-1, head (block + 1).
  NF_ASSIGN_OR_RETURN(const Tensor squares, Tensor::HostZeros(DType::kF64, {layers + 2}));
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (const auto& [block, ranges] : chunks_[c]->OwnedNormRangesByBlock()) {
      NF_ASSIGN_OR_RETURN(const double share, optimizers_[c]->SquaredGradNorm(ranges));
      squares.data<double>()[block + 1] += share;
    }
  }
  parallel::Communicator& group =
      config_.parallel().distributed_optimizer() ? *groups_->world : *groups_->mp;
  NF_RETURN_IF_ERROR(group.AllReduce(squares, parallel::ReduceOp::kSum));
  std::vector<std::pair<std::string, double>> norms;
  for (int block = model::kEmbeddingBlock; block <= model::HeadBlock(layers); ++block) {
    norms.emplace_back(model::BlockName(block, layers),
                       std::sqrt(squares.data<double>()[block + 1]));
  }
  return norms;
}

absl::StatusOr<StepStats> Trainer::TrainStep(bool block_grad_norms) {
  const auto start = std::chrono::steady_clock::now();
  const TrainOptions& train = config_.train();
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  const int64_t global_batch = train.global_batch_size();
  if (const SampleWindow* window = OverlappingWindow(skipped_samples_, consumed_samples_,
                                                     consumed_samples_ + global_batch)) {
    // Nothing is read, computed or updated: the step only moves the run past the data.
    ++step_;
    consumed_samples_ += global_batch;
    ++skipped_total_;
    constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
    return StepStats{
        .step = step_,
        .loss = kNone,
        .lr = optim::LearningRate(schedule_, optimizers_.front()->adamw().updates() + 1),
        .loss_scale = loss_scale,
        .grad_norm = kNone,
        .skipped = true,
        .skip_reason = optim::SkipReason::kSkippedData,
        .skipped_total = skipped_total_,
        .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        .block_grad_norms = {},
        .spike = std::nullopt,
        .skipped_window = *window,
        .nan_origin = std::nullopt};
  }
  if (injected_absent_rank_ == groups_->topology.world_rank()) {
    // Never arrives at its first step's collectives: the job's watchdogs end it (and this
    // process).
    const std::string line = absl::StrCat("rank ", injected_absent_rank_,
                                          ": NF_INJECT_ABSENT_RANK: this rank never issues the "
                                          "collectives of its first step\n");
    std::fwrite(line.data(), 1, line.size(), stderr);
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (injected_slow_rank_.world_rank == groups_->topology.world_rank()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(injected_slow_rank_.milliseconds));
  }
  if (injected_desync_.step == step_ + 1 &&
      injected_desync_.world_rank == groups_->topology.world_rank()) {
    NF_RETURN_IF_ERROR(groups_->world->Barrier());  // no other rank calls it: a hang
  }
  // Each token's loss enters the gradient with weight loss_scale / tokens: the gradient of the
  // global batch's mean loss (over the tokens that carry one: a masked LM's chosen tokens),
  // times the loss scale. Every rank counts them from the stream alone.
  const int64_t batch_tokens = batches_->LossTokens(consumed_samples_, global_batch);
  const bool inject_spike = absl::c_linear_search(injected_grad_spikes_, step_ + 1);
  const PipelineStep step = {
      .step = step_,
      .batch_start = consumed_samples_,
      .first_micro_batch = int64_t{groups_->topology.dp_rank()} * micro_batches_,
      .micro_batch_size = train.micro_batch_size(),
      .loss_weight =
          (inject_spike ? kGradSpikeFactor : 1.0f) * loss_scale /
          // A batch without a chosen token (a masked LM's tiny mask_prob x seq_len) adds nothing.
          static_cast<float>(std::max<int64_t>(batch_tokens, 1))};

  const bool inject_nan = injected_nan_.step == step_ + 1;
  if (inject_nan) NF_RETURN_IF_ERROR(InjectNan(/*poison=*/true));
  for (const auto& chunk : chunks_) NF_RETURN_IF_ERROR(chunk->params().ZeroGrads());
  // Each data-parallel bucket's reduction starts once the last micro-batch's backward has
  // finished its gradients, or (without overlap) all of them at FinishGradReduction: the same
  // reductions of the same values either way.
  PipelineExecutor::GradsDoneFn grads_done;
  if (config_.parallel().overlap_grad_reduce()) {
    grads_done = [&](int chunk, int64_t offset) {
      return optimizers_[chunk]->GradsDoneFrom(offset);
    };
  }
  NF_ASSIGN_OR_RETURN(const PipelineExecutor::Result run,
                      executor_->Run(step, *batches_, grads_done));
  NF_RETURN_IF_ERROR(ReduceEmbeddingGradients());
  for (const auto& optimizer : optimizers_) NF_RETURN_IF_ERROR(optimizer->FinishGradReduction());
  NF_RETURN_IF_ERROR(ReduceSequenceParallelGradients());

  bool skipped = false;
  NF_ASSIGN_OR_RETURN(const double squared, GlobalSquaredNorm(loss_scale, skipped));
  const double norm = std::sqrt(squared);
  // Finite gradients whose squares overflow the fp32 accumulator: as good as an overflow.
  skipped = skipped || !std::isfinite(norm);
  optim::SkipReason skip_reason =
      skipped ? optim::SkipReason::kNonFiniteGradients : optim::SkipReason::kNone;
  const float lr = optim::LearningRate(schedule_, optimizers_.front()->adamw().updates() + 1);

  // Once per step: waits for the device and reports a bad token id or target a kernel met,
  // before any update. Then the step's loss, before its update: the spike detector needs it.
  NF_RETURN_IF_ERROR(ops::Synchronize(device_));
  NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum global, GlobalLoss());
  const double loss = global.tokens > 0 ? global.sum / static_cast<double>(global.tokens) : 0.0;
  std::optional<NanOriginAgreement> nan_origin;
  if (skip_reason == optim::SkipReason::kNonFiniteGradients && train.nan_origin()) {
    NF_ASSIGN_OR_RETURN(nan_origin, FindNanOrigin(step));
  }
  if (inject_nan) NF_RETURN_IF_ERROR(InjectNan(/*poison=*/false));

  std::optional<Spike> spike;
  if (!skipped) {
    spike = spikes_.Check(step_ + 1, loss, norm);
    // [update would overflow, spike], maximised over the world, so that every rank skips or
    // updates alike (the loss and norm each rank holds may differ in their last bit). An update
    // that would take a weight past the model dtype (fp16: inf) cannot be undone, so every rank
    // checks its part first (its shard with ZeRO-1).
    NF_ASSIGN_OR_RETURN(const Tensor flags, ops::Zeros(DType::kF32, {2}, Device::Cpu()));
    for (const auto& optimizer : optimizers_) {
      NF_ASSIGN_OR_RETURN(const bool would, optimizer->UpdateWouldOverflow(lr, norm));
      if (would) flags.data<float>()[0] = 1.0f;
    }
    if (spike) flags.data<float>()[1] = 1.0f;
    NF_RETURN_IF_ERROR(groups_->world->AllReduce(flags, parallel::ReduceOp::kMax));
    if (flags.data<float>()[1] != 0.0f && !spike) {
      // Another rank's last bit tipped a value over its limit: this rank has no figures.
      constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
      spike =
          Spike{.metric = "other_rank", .value = kUnknown, .median = kUnknown, .limit = kUnknown};
    }
    if (flags.data<float>()[0] != 0.0f) {
      skipped = true;
      skip_reason = optim::SkipReason::kUpdateOverflow;
    } else if (spike && train.spike().action() != SpikeConfig::RECORD) {
      skipped = true;
      skip_reason = optim::SkipReason::kSpike;
    }
  }
  std::vector<std::pair<std::string, double>> block_norms;
  // Before Update, which clips the gradients in place. `skipped` is the same on every rank.
  if (block_grad_norms && !skipped) {
    NF_ASSIGN_OR_RETURN(block_norms, BlockGradNorms());
  }
  if (!skipped) {
    for (const auto& optimizer : optimizers_) NF_RETURN_IF_ERROR(optimizer->Update(lr, norm));
    spikes_.Record(loss, norm);
  }
  // A spike says nothing about the loss scale: the scaler sees only the steps it governs.
  if (scaler_ && skip_reason != optim::SkipReason::kSpike) scaler_->Update(skipped);
  if (skipped) ++skipped_total_;
  ++step_;
  consumed_samples_ += global_batch;
  return StepStats{
      .step = step_,
      .loss = loss,
      .lr = lr,
      .loss_scale = loss_scale,
      .grad_norm = norm,
      .skipped = skipped,
      .skip_reason = skip_reason,
      .skipped_total = skipped_total_,
      .tokens = global_batch * train.seq_len(),
      .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      .data_seconds = run.data_seconds,
      .pipeline_wait_seconds = run.pipeline_wait_seconds,
      .peak_pipeline_sends = run.peak_live_sends,
      .peak_pipeline_send_bytes = run.peak_send_bytes,
      .block_grad_norms = std::move(block_norms),
      .spike = std::move(spike),
      .skipped_window = std::nullopt,
      .nan_origin = std::move(nan_origin)};
}

}  // namespace nf::launcher
