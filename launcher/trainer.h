// Training on one rank of any (tensor, pipeline, data)-parallel layout, wired from a
// TrainConfig: this rank's model chunks (one per virtual pipeline stage, each sharded over the
// tensor-parallel group), the pipeline executor, one data-parallel optimizer per chunk
// (replicated AdamW or ZeRO-1), the LR schedule, the fp16 loss scaler and the batch source.
// One call of TrainStep is one optimizer step over the global batch; a job of one process is
// the layout (1, 1, 1) over groups of one.
//
// The reductions of a step, and why each group:
//   tied embedding gradient   sum over the embedding group (first and last pipeline stage)
//   gradients                 sum over dp (buckets during the last backward; ZeRO: scattered)
//   non-finite flag           max over the world (every rank skips or steps together)
//   update overflow flag      max over the world (an update that would overflow the model
//                             dtype on any rank's part, its shard with ZeRO-1, skips it)
//   squared gradient norm     sum over mp (tp x pp: each parameter counted once; TP duplicates
//                             and the tied copy excluded), and over dp too when sharded
//   loss and tokens           sum over the world of the last stage's tp rank 0 shares
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/training_state.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/mixed_precision_optimizer.h"
#include "launcher/batch_source.h"
#include "launcher/fault_injection.h"
#include "launcher/nan_origin.h"
#include "launcher/pipeline_executor.h"
#include "launcher/skipped_samples.h"
#include "launcher/spike_detector.h"
#include "launcher/train_config.pb.h"
#include "model/normformer_model.h"
#include "parallel/data_parallel_optimizer.h"
#include "parallel/device_groups.h"
#include "parallel/process_groups.h"

namespace nf::launcher {

struct StepStats {
  int64_t step = 0;   // 1-based
  double loss = 0.0;  // mean token loss of the global batch (nats), the same on every rank
  float lr = 0.0f;
  float loss_scale = 1.0f;  // 1 unless fp16
  double grad_norm = 0.0;   // before clipping; NaN/inf on a skipped step
  bool skipped = false;     // no update: non-finite gradients, or an overflowing update
  optim::SkipReason skip_reason = optim::SkipReason::kNone;  // why, when skipped
  int64_t skipped_total = 0;
  // Tokens the step computed, global batch x seq_len (what tokens/s and MFU count); the loss is
  // the mean over those that carry one (all of them in a causal LM, a masked LM's chosen ones).
  int64_t tokens = 0;
  double seconds = 0.0;                // wall time of the step, of which:
  double data_seconds = 0.0;           // waiting for the data loader
  double pipeline_wait_seconds = 0.0;  // waiting for pipeline peers (sends and receives)
  // The pipeline's most sends pending at once during the step, and their bytes
  // (PipelineExecutor::Result): bounded by the pipeline's depth.
  int peak_pipeline_sends = 0;
  int64_t peak_pipeline_send_bytes = 0;
  // Gradient norm of each block ("embedding", "0" .. "L-1", "head"), unscaled and before
  // clipping, when the step was asked for them and was not skipped.
  std::vector<std::pair<std::string, double>> block_grad_norms;
  // A loss or gradient-norm spike (train.spike), whatever the action; the step is skipped
  // (kSpike) under SKIP and ROLLBACK.
  std::optional<Spike> spike;
  // The skipped window the step's batch overlapped (skip_reason kSkippedData).
  std::optional<SampleWindow> skipped_window;
  // train.nan_origin on a step with non-finite gradients: the step was run again and searched
  // (nan_origin.h), and this is what it found (the same on every rank); else none.
  std::optional<NanOriginAgreement> nan_origin;
};

class Trainer {
 public:
  // `groups` (SingleProcessGroups() for one process) must outlive the trainer and match
  // config.parallel; the data-parallel size is what the world leaves.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         parallel::ProcessGroups& groups);
  // One process: the layout (1, 1, 1) over groups of one, owned by the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config);

  // With block_grad_norms, the step also measures each block's gradient norm (one squared
  // norm per block and a small all-reduce: the training loop asks for it at log steps only).
  absl::StatusOr<StepStats> TrainStep(bool block_grad_norms = false);

  // The mean token loss over train.eval_iters global batches of the validation split, forward
  // only (no dropout; the executor's forward-only schedule), the same on every rank.
  // Collective over the world.
  absl::StatusOr<double> Evaluate();

  int64_t step() const { return step_; }
  // This rank's model chunks, in virtual-stage order (one without interleaving).
  const std::vector<std::unique_ptr<model::NormFormerModel>>& chunks() const { return chunks_; }
  parallel::DataParallelOptimizer& optimizer(int chunk) { return *optimizers_[chunk]; }
  // Seconds the optimizer updates have waited for an async save's snapshot copy, over the run.
  double state_reader_wait_seconds() const {
    double seconds = 0.0;
    for (const auto& optimizer : optimizers_) seconds += optimizer->state_reader_wait_seconds();
    return seconds;
  }
  const optim::DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  const BatchSource& batches() const { return *batches_; }
  const PipelineExecutor& executor() const { return *executor_; }
  const parallel::ProcessGroups& groups() const { return *groups_; }
  parallel::Communicator* world() { return groups_->world.get(); }
  // What a checkpoint saves of this rank (views into the trainer) and the run's progress.
  checkpoint::RankState CheckpointState();
  checkpoint::RunProgress Progress() const;
  // Continues from a loaded checkpoint's progress: the next TrainStep is step progress.step + 1,
  // reading the data stream from progress.consumed_samples on, whatever global batch size the
  // checkpoint was written with (FailedPrecondition when this config's steps cannot continue
  // that stream exactly).
  absl::Status Restore(const checkpoint::RunProgress& progress);
  // Samples of the training stream the steps so far have read.
  int64_t consumed_samples() const { return consumed_samples_; }
  // The windows of the training stream this run skips (merged, sorted) and its spike rollbacks
  // so far: run state, saved with every checkpoint. A rollback loads an older checkpoint and
  // then sets both to what they were plus its own window and one.
  const std::vector<SampleWindow>& skipped_samples() const { return skipped_samples_; }
  int64_t rollbacks() const { return rollbacks_; }
  void SetSkippedSamples(std::vector<SampleWindow> windows, int64_t rollbacks);

  // Parameters of the whole model (every layer and the embedding once).
  int64_t num_global_params() const { return num_global_params_; }
  // Where this rank's model lives (train.device resolved).
  Device device() const { return device_; }
  // This rank's communication so far by group name ("world", "tp", "dp", "pp", "mp",
  // "embedding"), a group's host (MPI) and device (NCCL) communicators added together.
  std::map<std::string, parallel::CommStats> CommTotals() const;

 private:
  Trainer() = default;
  // The communicator for device tensors of `kind` (tp, dp, pp, embedding): the NCCL one of a
  // multi-process GPU job, else the process group (MPI, or a group of one).
  parallel::Communicator* DeviceGroup(parallel::GroupKind kind) const;
  // Resizes the training stream for a resumed run: long enough for the remaining steps, and
  // the stream the checkpoint's run read (its size is recorded), or refused.
  absl::Status ContinueDataStream(const checkpoint::RunProgress& progress);
  absl::Status ReduceEmbeddingGradients();
  // Sums over tp the reduced gradients that sequence parallelism leaves partial
  // (NormFormerModel::SequenceParallelGradRanges), after the data-parallel reduction: the sums
  // commute, and the overlapped data-parallel buckets need not wait for them.
  absl::Status ReduceSequenceParallelGradients();
  // Per-block gradient norms of the reduced, unscaled gradients, the same on every rank:
  // collective over the group GlobalSquaredNorm reduces over.
  absl::StatusOr<std::vector<std::pair<std::string, double>>> BlockGradNorms();
  // Takes the losses the last stage's forwards accumulated since the last call
  // (NormFormerModel::TakeLossSum: one read from the device) and sums (loss sum, tokens) over
  // the world (tp rank 0 of the last stage of every data-parallel rank contributes): every rank
  // gets the global pair.
  absl::StatusOr<model::NormFormerModel::LossSum> GlobalLoss();
  // The global non-finite flag and squared gradient norm (NaN when skipped).
  absl::StatusOr<double> GlobalSquaredNorm(float loss_scale, bool& skipped);
  // Runs `step`'s micro-batches again with every op's outputs searched for NaN and infinity
  // (nan_origin.h) and agrees over the world on the first finding. Collective over the world;
  // the gradients and losses it leaves are discarded.
  absl::StatusOr<NanOriginAgreement> FindNanOrigin(const PipelineStep& step);
  // NF_INJECT_NAN: makes the first element of the injected layer's fc1 weight NaN (`poison`) on
  // the ranks it names, or puts back the value it held.
  absl::Status InjectNan(bool poison);

  TrainConfig config_;
  std::unique_ptr<parallel::ProcessGroups> own_groups_;  // single process only; outlives the rest
  parallel::ProcessGroups* groups_ = nullptr;
  // NCCL over groups_ for device tensors; empty on the CPU and in a job of one process. Declared
  // before the members that use them, so destroyed after them.
  parallel::DeviceGroups device_groups_;
  std::vector<std::unique_ptr<model::NormFormerModel>> chunks_;
  std::vector<std::unique_ptr<parallel::DataParallelOptimizer>> optimizers_;  // per chunk
  std::optional<PipelineExecutor> executor_;
  optim::LrSchedule schedule_;
  std::optional<optim::DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<BatchSource> validation_;  // made by the first Evaluate
  int micro_batches_ = 1;                    // per data-parallel rank and step
  int64_t num_global_params_ = 0;
  int64_t step_ = 0;
  int64_t consumed_samples_ = 0;   // of the training stream
  int64_t stream_samples_ = 0;     // the training stream's size (batch_source.h)
  Device device_ = Device::Cpu();  // train.device resolved: where the model lives
  int64_t skipped_total_ = 0;
  // train.skip_samples, the resumed checkpoint's windows and rollbacks' (merged, sorted).
  std::vector<SampleWindow> skipped_samples_;
  int64_t rollbacks_ = 0;
  SpikeDetector spikes_{SpikeConfig()};
  std::vector<int64_t> injected_grad_spikes_;  // NF_INJECT_GRAD_SPIKE (fault_injection.h)
  InjectedDesync injected_desync_;             // NF_INJECT_DESYNC
  InjectedSlowRank injected_slow_rank_;        // NF_INJECT_SLOW_RANK
  int injected_absent_rank_ = -1;              // NF_INJECT_ABSENT_RANK
  InjectedNan injected_nan_;                   // NF_INJECT_NAN
  Tensor injected_nan_saved_;                  // the poisoned element's value, on the host
};

// The model dtype of a precision setting.
DType ModelDType(TrainOptions::Precision precision);

// The recompute mode of a config: train.recompute, or FULL for the older
// train.activation_recompute: true (validation refuses the two disagreeing).
model::Recompute RecomputeOf(const TrainOptions& train);

// The optimizer settings of a config as core/optim takes them.
optim::AdamWConfig AdamWConfigOf(const OptimizerConfig& config);

// Micro-batches per data-parallel rank and step: the global batch split over dp ranks in
// micro-batches; InvalidArgument with the nearest working global batches otherwise.
absl::StatusOr<int> MicroBatchesPerRank(const TrainOptions& train, int dp);

// train.device's GPU is visible to this process (always OK for CPU); nf-launch checks it
// before touching the run directory.
absl::Status CheckDeviceAvailable(const TrainOptions& train);

// "<setting>, but this process sees no GPU" and why: CUDA's own error when cudaGetDeviceCount
// failed (ops::GpuCountError(), e.g. an insufficient driver), else the usual suspects (a build
// without nvcc, CUDA_VISIBLE_DEVICES). Shared by nf-launch, nf-eval and nf-generate.
std::string NoGpuMessage(absl::string_view setting, absl::string_view cuda_error);

// train.device resolved for this rank: the CPU, or GPU local rank % visible GPUs.
absl::StatusOr<Device> TrainingDevice(const TrainOptions& train);

// The GPU of a process: local_rank % gpus (gpus > 0). Every GPU of the node visible to every
// rank gives rank i GPU i, and is the recommended setup: NCCL then sees the peers' GPUs and
// uses P2P/NVLink between them. One visible GPU per rank (Slurm's --gpus-per-task=1, a per-rank
// CUDA_VISIBLE_DEVICES) gives each rank its own GPU 0, but hides the peers' GPUs under Slurm's
// device constraints (SingleGpuRanksWarning). CheckOneRankPerGpu refuses a job where two ranks
// end up on one physical GPU.
int GpuOfLocalRank(int local_rank, int gpus);

// NCCL refuses two ranks of one communicator on one GPU, and a shared GPU only slows both:
// given every world rank's host and the UUID of the GPU it drives, refuses a job in which two
// ranks drive the same GPU, naming both ranks, the host and the GPU.
absl::Status CheckOneRankPerGpu(const std::vector<std::string>& hosts,
                                const std::vector<std::string>& gpu_uuids);

// Given every world rank's host and local rank (parallel::DiscoverLocalRank, read from
// `source`), refuses a job in which two ranks of one host have the same local rank (an mpirun
// inside sbatch whose ranks all inherit SLURM_LOCALID=0): one line naming both ranks, the host
// and the variable.
absl::Status CheckDistinctLocalRanks(const std::vector<std::string>& hosts,
                                     const std::vector<int>& local_ranks, absl::string_view source);

// Given every world rank's host and the number of GPUs it sees, one warning line naming the
// lowest rank of the first node where several ranks each see exactly one GPU (Slurm's
// --gpus-per-task=1, a CUDA_VISIBLE_DEVICES per rank), which hides the peers' GPUs from NCCL
// and so loses P2P/NVLink; "" when no node is so. A node of one rank is never warned about.
std::string SingleGpuRanksWarning(const std::vector<std::string>& hosts,
                                  const std::vector<int>& visible_gpus);

// The same over the world (collective): gathers every rank's GPU UUID, local rank and count of
// visible GPUs, refuses shared local ranks and shared GPUs, and has world rank 0 print
// SingleGpuRanksWarning's line on stderr. OK on the CPU and for a job of one process.
absl::Status CheckOneRankPerGpu(const parallel::ProcessGroups& groups, Device device);

// The parallel sizes of a config (dp resolved from the world by the topology).
parallel::ParallelSizes ParallelSizesOf(const ParallelConfig& config);

}  // namespace nf::launcher
