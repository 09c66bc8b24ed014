// The rules a TrainConfig must satisfy before anything is allocated: each catches a mistake
// that would otherwise surface as a crash, a hang or a silently wrong run much later.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/range_checks.h"
#include "core/status.h"
#include "data/splits.h"
#include "launcher/config.h"
#include "launcher/skipped_samples.h"
#include "model/model_config_check.h"
#include "parallel/flight_recorder.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/topology.h"

namespace nf::launcher {
namespace {

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// 2^20 entries, 104 MiB a rank: 256 times the default, far more than a hang's last steps need.
constexpr int32_t kMaxFlightRecorderEntries = 1 << 20;
// A healthy collective can wait seconds for a slow peer (a checkpoint save, a straggler); a week
// bounds a deadline that absl::Duration and the watchdog's arithmetic must hold.
constexpr float kMinCollectiveTimeoutSeconds = 1;
constexpr float kMaxCollectiveTimeoutSeconds = 7 * 24 * 3600;
// Micro-batches of one step over all data-parallel ranks: the pipeline schedule lists each (and
// the memory estimate builds it), so the count bounds what a step allocates before the memory
// check can speak. 2^20 is hundreds of times the largest published runs' count.
constexpr int64_t kMaxMicroBatchesPerStep = int64_t{1} << 20;

absl::Status ValidateBatch(const TrainOptions& train, const nf::model::ModelConfig& model) {
  NF_RETURN_IF_ERROR(RequirePositive("train.seq_len", train.seq_len()));
  if (train.seq_len() > model.max_seq_len()) {
    return Invalid(absl::StrCat(
        "train.seq_len (", train.seq_len(), ") exceeds model.max_seq_len (", model.max_seq_len(),
        "): lower train.seq_len or set model.max_seq_len >= ", train.seq_len()));
  }
  NF_RETURN_IF_ERROR(RequirePositive("train.micro_batch_size", train.micro_batch_size()));
  const int64_t micro = train.micro_batch_size();
  const int64_t global = train.global_batch_size();
  if (global <= 0 || global % micro != 0) {
    const int64_t down = global / micro * micro;
    const int64_t up = down + micro;
    return Invalid(absl::StrCat("train.global_batch_size (", global,
                                ") must be a positive multiple of train.micro_batch_size (", micro,
                                "): e.g. ", down > 0 ? absl::StrCat(down, " or ") : "",
                                std::max(up, micro)));
  }
  if (global / micro > kMaxMicroBatchesPerStep) {
    return Invalid(absl::StrCat(
        "train.global_batch_size (", global, ") / train.micro_batch_size (", micro, ") is ",
        global / micro, " micro-batches a step, more than ", kMaxMicroBatchesPerStep,
        " (the pipeline schedule lists each): raise train.micro_batch_size"));
  }
  NF_RETURN_IF_ERROR(RequirePositive("train.train_iters", train.train_iters()));
  NF_RETURN_IF_ERROR(RequirePositive("train.log_interval", train.log_interval()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.eval_interval", train.eval_interval()));
  NF_RETURN_IF_ERROR(RequirePositive("train.eval_iters", train.eval_iters()));
  // The run's progress counters (samples consumed, the data stream's length, tokens) are products
  // of these: bounded so that none can overflow, nor lose integers as a double, in any run.
  // 2^53 tokens is ~9e15, some 300 times the largest runs published.
  constexpr int64_t kMaxTokens = int64_t{1} << 53;
  const int64_t tokens_per_step = global * train.seq_len();
  for (const auto& [name, iters] :
       {std::pair<const char*, int64_t>{"train.train_iters", train.train_iters()},
        {"train.eval_iters", train.eval_iters()}}) {
    if (iters > kMaxTokens / tokens_per_step) {
      return Invalid(
          absl::StrCat(name, " (", iters, ") x train.global_batch_size (", global,
                       ") x train.seq_len (", train.seq_len(),
                       ") exceeds 2^53 tokens: the run's progress counters would overflow; "
                       "at most ",
                       kMaxTokens / tokens_per_step, " steps of this batch"));
    }
  }
  NF_RETURN_IF_ERROR(RequireNonNegative("train.exit_interval", train.exit_interval()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.exit_duration_mins", train.exit_duration_mins()));
  if (train.activation_recompute() && train.has_recompute() &&
      train.recompute() != TrainOptions::FULL) {
    return Invalid(absl::StrCat(
        "train.activation_recompute: true (the older spelling of train.recompute: FULL) "
        "contradicts train.recompute: ",
        TrainOptions::Recompute_Name(train.recompute()), "; keep only train.recompute"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const OptimizerConfig& optimizer) {
  NF_RETURN_IF_ERROR(RequirePositive("train.optimizer.lr", optimizer.lr()));
  NF_RETURN_IF_ERROR(RequireUnitInterval("train.optimizer.beta1", optimizer.beta1()));
  NF_RETURN_IF_ERROR(RequireUnitInterval("train.optimizer.beta2", optimizer.beta2()));
  NF_RETURN_IF_ERROR(RequirePositive("train.optimizer.eps", optimizer.eps()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.optimizer.weight_decay", optimizer.weight_decay()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.optimizer.clip_grad", optimizer.clip_grad()));
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const TrainOptions& train) {
  const LrScheduleConfig& schedule = train.lr_schedule();
  NF_RETURN_IF_ERROR(RequireNonNegative("train.lr_schedule.warmup_iters", schedule.warmup_iters()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.lr_schedule.decay_iters", schedule.decay_iters()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.lr_schedule.min_lr", schedule.min_lr()));
  if (schedule.min_lr() > train.optimizer().lr()) {
    return Invalid(absl::StrCat("train.lr_schedule.min_lr (", schedule.min_lr(),
                                ") exceeds the peak train.optimizer.lr (", train.optimizer().lr(),
                                "): set min_lr <= lr"));
  }
  // A constant schedule has no decay point; a warmup longer than the run never reaches the peak.
  const bool explicit_decay =
      schedule.decay_iters() > 0 && schedule.decay() != LrScheduleConfig::CONSTANT;
  const int64_t decay_point = explicit_decay ? schedule.decay_iters() : train.train_iters();
  if (schedule.warmup_iters() > decay_point) {
    return Invalid(absl::StrCat(
        "train.lr_schedule.warmup_iters (", schedule.warmup_iters(), ") exceeds ",
        explicit_decay ? "train.lr_schedule.decay_iters (" : "train.train_iters (", decay_point,
        "), where the warmup would have to end: shorten the warmup or lengthen ",
        explicit_decay ? "the decay" : "the run"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLossScale(const LossScaleConfig& loss_scale) {
  NF_RETURN_IF_ERROR(RequirePositive("train.loss_scale.initial_scale", loss_scale.initial_scale()));
  NF_RETURN_IF_ERROR(RequirePositive("train.loss_scale.min_scale", loss_scale.min_scale()));
  if (loss_scale.min_scale() > loss_scale.initial_scale()) {
    return Invalid(absl::StrCat("train.loss_scale.min_scale (", loss_scale.min_scale(),
                                ") exceeds train.loss_scale.initial_scale (",
                                loss_scale.initial_scale(), "): set min_scale <= initial_scale"));
  }
  if (!(loss_scale.growth_factor() > 1) || !std::isfinite(loss_scale.growth_factor())) {
    return Invalid(absl::StrCat("train.loss_scale.growth_factor must be finite and > 1 (got ",
                                loss_scale.growth_factor(), "); 2 is usual"));
  }
  if (!(loss_scale.backoff_factor() > 0 && loss_scale.backoff_factor() < 1)) {
    return Invalid(absl::StrCat("train.loss_scale.backoff_factor must be in (0, 1) (got ",
                                loss_scale.backoff_factor(), "); 0.5 is usual"));
  }
  NF_RETURN_IF_ERROR(
      RequirePositive("train.loss_scale.growth_interval", loss_scale.growth_interval()));
  NF_RETURN_IF_ERROR(RequirePositive("train.loss_scale.hysteresis", loss_scale.hysteresis()));
  return absl::OkStatus();
}

absl::Status ValidateData(const DataConfig& data, const nf::model::ModelConfig& model) {
  const int32_t branching = data.synthetic().branching();
  if (branching < 1 || branching >= model.vocab_size()) {
    return Invalid(absl::StrCat("data.synthetic.branching (", branching,
                                ") must be in [1, model.vocab_size) = [1, ", model.vocab_size(),
                                "): each token needs that many distinct successors"));
  }
  if (!data.path().empty() && data.blend_size() > 0) {
    return Invalid("set data.path or data.blend, not both (a single dataset is a blend of one)");
  }
  if (!data.split().empty()) {
    const absl::StatusOr<std::vector<double>> weights = data::ParseSplitWeights(data.split());
    if (!weights.ok()) {
      // The message quotes the split ("data: split \"abc\": part 1 ... is not a number").
      return Invalid(absl::StrCat("data.split: ", weights.status().message()));
    }
  }
  // The masking rates, checked whatever model.objective (as the loss scale whatever the
  // precision): switching a config to a masked LM must not expose settings nobody looked at.
  // (The synthetic corpus emits every id, <mask> included: that blurs what an input <mask>
  // means, which costs that corpus some learnability and breaks nothing.)
  const MaskedLmConfig& masked_lm = data.masked_lm();
  if (!(masked_lm.mask_prob() > 0 && masked_lm.mask_prob() <= 1)) {
    return Invalid(absl::StrCat("data.masked_lm.mask_prob must be in (0, 1] (got ",
                                masked_lm.mask_prob(), "); RoBERTa's is 0.15"));
  }
  NF_RETURN_IF_ERROR(
      RequireNonNegative("data.masked_lm.random_token_prob", masked_lm.random_token_prob()));
  NF_RETURN_IF_ERROR(
      RequireNonNegative("data.masked_lm.leave_unmasked_prob", masked_lm.leave_unmasked_prob()));
  // As data::MaskSample adds them: in double.
  const double kept_or_random = static_cast<double>(masked_lm.random_token_prob()) +
                                static_cast<double>(masked_lm.leave_unmasked_prob());
  if (kept_or_random > 1) {
    return Invalid(absl::StrCat(
        "data.masked_lm.random_token_prob (", masked_lm.random_token_prob(),
        ") + data.masked_lm.leave_unmasked_prob (", masked_lm.leave_unmasked_prob(),
        ") must be at most 1: they are shares of the chosen tokens, <mask> takes the rest"));
  }
  for (int k = 0; k < data.blend_size(); ++k) {
    const WeightedDataset& d = data.blend(k);
    if (d.path().empty()) {
      return Invalid(absl::StrCat("data.blend[", k,
                                  "].path is empty; give the PREFIX of "
                                  "PREFIX.bin/.idx"));
    }
    if (!(d.weight() >= 0 && std::isfinite(d.weight()))) {
      return Invalid(absl::StrCat("data.blend[", k, "].weight must be finite and >= 0 (got ",
                                  d.weight(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateParallel(const ParallelConfig& parallel, const nf::model::ModelConfig& model) {
  NF_RETURN_IF_ERROR(RequirePositive("parallel.tensor_parallel", parallel.tensor_parallel()));
  NF_RETURN_IF_ERROR(RequirePositive("parallel.pipeline_parallel", parallel.pipeline_parallel()));
  NF_RETURN_IF_ERROR(RequirePositive("parallel.virtual_stages", parallel.virtual_stages()));
  NF_RETURN_IF_ERROR(RequireNonNegative("parallel.data_parallel", parallel.data_parallel()));
  NF_RETURN_IF_ERROR(
      RequirePositive("parallel.grad_bucket_elements", parallel.grad_bucket_elements()));
  NF_RETURN_IF_ERROR(
      RequireNonNegative("parallel.flight_recorder_entries", parallel.flight_recorder_entries()));
  if (parallel.flight_recorder_entries() > kMaxFlightRecorderEntries) {
    return Invalid(absl::StrCat(
        "parallel.flight_recorder_entries must be at most ", kMaxFlightRecorderEntries, " (got ",
        parallel.flight_recorder_entries(), "; each rank keeps them in memory, ",
        sizeof(parallel::FlightEntry), " bytes each: a hang needs the last few thousand)"));
  }
  const float timeout = parallel.collective_timeout_seconds();
  if (!(timeout >= kMinCollectiveTimeoutSeconds && timeout <= kMaxCollectiveTimeoutSeconds)) {
    return Invalid(absl::StrCat(
        "parallel.collective_timeout_seconds must be in [", kMinCollectiveTimeoutSeconds, ", ",
        kMaxCollectiveTimeoutSeconds, "] (got ", timeout,
        "): shorter ends a healthy job at its first collective (and a requeued job again)"));
  }
  NF_RETURN_IF_ERROR(parallel::CheckModelDivisibility(model.num_heads(), model.ffn_dim(),
                                                      parallel.tensor_parallel()));
  const bool interleaved = parallel.pipeline_schedule() == ParallelConfig::INTERLEAVED_ONE_F_ONE_B;
  if (parallel.virtual_stages() > 1 && !interleaved) {
    return Invalid(absl::StrCat("parallel.virtual_stages (", parallel.virtual_stages(),
                                ") needs parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B, or "
                                "set virtual_stages=1"));
  }
  if (interleaved && (parallel.virtual_stages() < 2 || parallel.pipeline_parallel() < 2)) {
    return Invalid(absl::StrCat(
        "parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B needs pipeline_parallel >= 2 and "
        "virtual_stages >= 2 (got ",
        parallel.pipeline_parallel(), " and ", parallel.virtual_stages(),
        "); use ONE_F_ONE_B otherwise"));
  }
  const std::vector<int> split(parallel.layers_per_stage().begin(),
                               parallel.layers_per_stage().end());
  if (split.empty()) {
    return parallel::CheckLayerSplit(model.num_layers(), parallel.pipeline_parallel(),
                                     parallel.virtual_stages());
  }
  auto stages = parallel::StageLayers(model.num_layers(), parallel.pipeline_parallel(),
                                      parallel.virtual_stages(), split);
  if (!stages.ok())
    return Invalid(absl::StrCat("parallel.layers_per_stage: ", stages.status().message()));
  return absl::OkStatus();
}

// Counters the loop would otherwise clamp silently: a negative interval is a typo, not "never".
absl::Status ValidateCheckpointing(const checkpoint::CheckpointConfig& checkpoint,
                                   const TrainOptions& train) {
  NF_RETURN_IF_ERROR(RequireNonNegative("checkpoint.save_interval", checkpoint.save_interval()));
  NF_RETURN_IF_ERROR(RequirePositive("checkpoint.keep_last", checkpoint.keep_last()));
  NF_RETURN_IF_ERROR(RequireNonNegative("checkpoint.keep_every", checkpoint.keep_every()));
  return RequirePositive("train.max_consecutive_skipped", train.max_consecutive_skipped());
}

// Checked whether or not monitoring is on, like the loss scale: turning it on with --set must
// not meet a bad address only once the run directory is written.
absl::Status ValidateMonitoring(const monitoring::MonitoringConfig& monitoring) {
  if (monitoring.port_base() < 1 || monitoring.port_base() > 65535) {
    return Invalid(absl::StrCat("monitoring.port_base (", monitoring.port_base(),
                                ") must be a TCP port in [1, 65535]; every rank listens on "
                                "port_base + its local rank"));
  }
  in6_addr address;
  if (inet_pton(AF_INET, monitoring.bind_address().c_str(), &address) != 1 &&
      inet_pton(AF_INET6, monitoring.bind_address().c_str(), &address) != 1) {
    return Invalid(absl::StrCat("monitoring.bind_address '", monitoring.bind_address(),
                                "' is not an IPv4 or IPv6 address (e.g. 0.0.0.0, 127.0.0.1, ::)"));
  }
  return absl::OkStatus();
}

// Sequence parallelism splits each micro-batch's tokens evenly over the tensor-parallel ranks.
absl::Status ValidateSequenceParallel(const ParallelConfig& parallel, const TrainOptions& train) {
  const int64_t tokens = int64_t{train.micro_batch_size()} * train.seq_len();
  const int tp = parallel.tensor_parallel();
  if (!parallel.sequence_parallel() || tokens % tp == 0) return absl::OkStatus();
  return Invalid(absl::StrCat(
      "parallel.sequence_parallel splits each micro-batch's tokens over the tensor-parallel "
      "ranks: train.micro_batch_size x train.seq_len (",
      train.micro_batch_size(), " x ", train.seq_len(), " = ", tokens,
      ") must be a multiple of parallel.tensor_parallel (", tp,
      "); change either, or set sequence_parallel=false"));
}

}  // namespace

// Spike detection and skipped windows: a typo must not turn detection off or skip nothing.
absl::Status ValidateSpikes(const TrainOptions& train) {
  const SpikeConfig& spike = train.spike();
  NF_RETURN_IF_ERROR(RequireInRange("train.spike.window", spike.window(), 1 << 20,
                                    "the median is taken over the window every step"));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.spike.loss_threshold", spike.loss_threshold()));
  NF_RETURN_IF_ERROR(
      RequireNonNegative("train.spike.grad_norm_threshold", spike.grad_norm_threshold()));
  NF_RETURN_IF_ERROR(
      RequireNonNegative("train.spike.min_relative_spread", spike.min_relative_spread()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.spike.warmup_steps", spike.warmup_steps()));
  NF_RETURN_IF_ERROR(RequirePositive("train.spike.max_consecutive", spike.max_consecutive()));
  NF_RETURN_IF_ERROR(RequireNonNegative("train.spike.max_rollbacks", spike.max_rollbacks()));
  if (!(train.straggler_ratio() >= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.straggler_ratio must be at least 1 (got ", train.straggler_ratio(),
                     "): it is the slowest rank's compute time over the fastest's"));
  }
  for (const SampleWindow& window : train.skip_samples()) {
    NF_RETURN_IF_ERROR(ValidateWindow(window, "train.skip_samples"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTrainConfig(const TrainConfig& config) {
  NF_RETURN_IF_ERROR(model::ValidateModelConfig(config.model()));
  NF_RETURN_IF_ERROR(ValidateBatch(config.train(), config.model()));
  NF_RETURN_IF_ERROR(ValidateOptimizer(config.train().optimizer()));
  NF_RETURN_IF_ERROR(ValidateSchedule(config.train()));
  NF_RETURN_IF_ERROR(ValidateSpikes(config.train()));
  // Checked whatever the precision, so that switching a run to fp16 with --set cannot expose
  // settings nobody looked at.
  NF_RETURN_IF_ERROR(ValidateLossScale(config.train().loss_scale()));
  NF_RETURN_IF_ERROR(ValidateData(config.data(), config.model()));
  NF_RETURN_IF_ERROR(ValidateParallel(config.parallel(), config.model()));
  NF_RETURN_IF_ERROR(ValidateSequenceParallel(config.parallel(), config.train()));
  NF_RETURN_IF_ERROR(ValidateCheckpointing(config.checkpoint(), config.train()));
  NF_RETURN_IF_ERROR(ValidateMonitoring(config.monitoring()));
  if (!config.train().samples().prompts().empty()) {
    const absl::Status causal =
        model::RequireCausalLm(config.model(), "train.samples (text generated while training)");
    if (!causal.ok()) return Invalid(causal.message());
  }
  return absl::OkStatus();
}

}  // namespace nf::launcher
