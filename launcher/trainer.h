// Training on one rank: the model, the mixed-precision AdamW over its flat buffers, the LR
// schedule, the fp16 loss scaler and the batch source, wired from a TrainConfig. One call of
// TrainStep is one optimizer step over the global batch (gradient accumulation over its
// micro-batches).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/mixed_precision_optimizer.h"
#include "launcher/batch_source.h"
#include "launcher/train_config.pb.h"
#include "model/normformer_model.h"

namespace nf::launcher {

struct StepStats {
  int64_t step = 0;   // 1-based
  double loss = 0.0;  // mean token loss of the global batch (nats)
  float lr = 0.0f;
  float loss_scale = 1.0f;  // 1 unless fp16
  double grad_norm = 0.0;   // before clipping; NaN/inf on a skipped step
  bool skipped = false;     // non-finite gradients: no update
  int64_t skipped_total = 0;
  int64_t tokens = 0;    // tokens with a loss in this step
  double seconds = 0.0;  // wall time of the step
};

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config);

  absl::StatusOr<StepStats> TrainStep();

  int64_t step() const { return step_; }
  model::NormFormerModel& model() { return *model_; }
  const optim::MixedPrecisionAdamW& optimizer() const { return *optimizer_; }
  const optim::DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  const BatchSource& batches() const { return *batches_; }

 private:
  Trainer(TrainConfig config, std::unique_ptr<model::NormFormerModel> model,
          optim::MixedPrecisionAdamW optimizer, optim::LrSchedule schedule,
          std::optional<optim::DynamicLossScaler> scaler, std::unique_ptr<BatchSource> batches);

  TrainConfig config_;
  std::unique_ptr<model::NormFormerModel> model_;
  std::unique_ptr<optim::MixedPrecisionAdamW> optimizer_;
  optim::LrSchedule schedule_;
  std::optional<optim::DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<BatchSource> batches_;
  int64_t step_ = 0;
  int64_t skipped_total_ = 0;
};

// The model dtype of a precision setting.
DType ModelDType(TrainOptions::Precision precision);

// The optimizer settings of a config as core/optim takes them.
optim::AdamWConfig AdamWConfigOf(const OptimizerConfig& config);

}  // namespace nf::launcher
