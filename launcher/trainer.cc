#include "launcher/trainer.h"

#include <chrono>

#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::launcher {
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

optim::AdamWConfig AdamWConfigOf(const OptimizerConfig& o) {
  return {.beta1 = o.beta1(),
          .beta2 = o.beta2(),
          .eps = o.eps(),
          .weight_decay = o.weight_decay(),
          .clip_grad = o.clip_grad()};
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config) {
  const TrainOptions& train = config.train();
  NF_ASSIGN_OR_RETURN(std::unique_ptr<model::NormFormerModel> model,
                      model::NormFormerModel::Create(
                          config.model(), {.dtype = ModelDType(train.precision()),
                                           .micro_batch = train.micro_batch_size(),
                                           .seq_len = train.seq_len(),
                                           .activation_recompute = train.activation_recompute(),
                                           .seed = train.seed()}));
  model::ParamTable& table = model->params();
  NF_ASSIGN_OR_RETURN(
      optim::MixedPrecisionAdamW optimizer,
      optim::MixedPrecisionAdamW::Create(table.params(), table.grads(), table.DecayRanges(),
                                         AdamWConfigOf(train.optimizer())));
  NF_RETURN_IF_ERROR(optimizer.InitializeMasterFromModel());
  const optim::LrSchedule schedule = ScheduleOf(train);
  NF_RETURN_IF_ERROR(optim::Validate(schedule));
  std::optional<optim::DynamicLossScaler> scaler;
  if (train.precision() == TrainOptions::FP16) {
    NF_ASSIGN_OR_RETURN(scaler,
                        optim::DynamicLossScaler::Create(ScalerConfigOf(train.loss_scale())));
  }
  NF_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> batches, MakeBatchSource(config));
  return std::unique_ptr<Trainer>(new Trainer(config, std::move(model), std::move(optimizer),
                                              schedule, std::move(scaler), std::move(batches)));
}

Trainer::Trainer(TrainConfig config, std::unique_ptr<model::NormFormerModel> model,
                 optim::MixedPrecisionAdamW optimizer, optim::LrSchedule schedule,
                 std::optional<optim::DynamicLossScaler> scaler,
                 std::unique_ptr<BatchSource> batches)
    : config_(std::move(config)),
      model_(std::move(model)),
      optimizer_(std::make_unique<optim::MixedPrecisionAdamW>(std::move(optimizer))),
      schedule_(schedule),
      scaler_(std::move(scaler)),
      batches_(std::move(batches)) {}

absl::StatusOr<StepStats> Trainer::TrainStep() {
  const auto start = std::chrono::steady_clock::now();
  const TrainOptions& train = config_.train();
  const int64_t global = train.global_batch_size(), micro = train.micro_batch_size();
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  // Each token's loss enters the gradient with weight loss_scale / tokens: the gradient of the
  // global batch's mean loss, times the loss scale.
  const int64_t batch_tokens = global * train.seq_len();
  const float loss_weight = loss_scale / static_cast<float>(batch_tokens);

  NF_RETURN_IF_ERROR(model_->params().ZeroGrads());
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t micro_batch = 0; micro_batch < global / micro; ++micro_batch) {
    NF_ASSIGN_OR_RETURN(const int64_t first_sample, batches_->Load(step_, micro_batch));
    NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum loss,
                        model_->Forward(batches_->inputs(), batches_->targets(),
                                        static_cast<uint64_t>(first_sample), true));
    NF_RETURN_IF_ERROR(model_->Backward(loss_weight));
    loss_sum += loss.sum;
    tokens += loss.tokens;
  }
  const float lr = optim::LearningRate(schedule_, optimizer_->updates() + 1);
  NF_ASSIGN_OR_RETURN(const optim::StepResult result, optimizer_->Step(lr, loss_scale));
  if (scaler_) scaler_->Update(result.skipped);
  if (result.skipped) ++skipped_total_;
  ++step_;
  return StepStats{
      .step = step_,
      .loss = tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0,
      .lr = lr,
      .loss_scale = loss_scale,
      .grad_norm = result.grad_norm,
      .skipped = result.skipped,
      .skipped_total = skipped_total_,
      .tokens = tokens,
      .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

}  // namespace nf::launcher
