// What PipelineExecutor (launcher/pipeline_executor.h) needs of one model chunk of this
// pipeline rank: its forward and backward of a micro-batch, its input gradient, whether it is
// the model's first or last stage, and where its [T, d] activations live. ModelStage adapts a
// NormFormerModel; tests/launcher/pipeline_executor_test.cc drives the executor with fake
// stages on a fake device.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "model/normformer_model.h"

namespace nf::launcher {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  // The model stage this chunk is (chunk * p + pipeline rank), for errors.
  virtual int stage() const = 0;
  virtual bool first() const = 0;  // holds the embedding: reads token ids
  virtual bool last() const = 0;   // holds the head and loss: reads targets, sends nothing on
  // Where the stage's activations and gradients live: every buffer the executor allocates for
  // it is there.
  virtual Device device() const = 0;
  // The hidden states passed between stages: [T = micro_batch * seq_len, d_model].
  virtual DType activation_dtype() const = 0;
  virtual Shape activation_shape() const = 0;
  // A zeroed tensor on device(): ops::Zeros. (A test's stage overrides it to hand out a fake
  // device's memory, which no backend of core/ops serves.)
  virtual absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) const {
    return ops::Zeros(dtype, std::move(shape), device());
  }

  // NormFormerModel::ForwardStage: one micro-batch, its activations kept under `micro_batch`
  // until Backward or DiscardForward; returns the output hidden state of a non-last stage
  // (valid until then), nullptr on the last.
  virtual absl::StatusOr<const Tensor*> Forward(int micro_batch, const Tensor* input_ids,
                                                const Tensor* input_hidden, const Tensor& targets,
                                                uint64_t first_sample, bool train) = 0;
  // NormFormerModel::BackwardStage.
  virtual absl::Status Backward(int micro_batch, const Tensor* output_grad, float loss_weight,
                                const model::NormFormerModel::GradsDoneFrom& grads_done_from) = 0;
  // Copies the gradient of the last Backward's input (non-first stages) into `dst`, an
  // activation-shaped tensor on device().
  virtual absl::Status CopyInputGrad(const Tensor& dst) = 0;
  // Drops the activations of a micro-batch that sees no backward (evaluation).
  virtual void DiscardForward(int micro_batch) = 0;
};

// A NormFormerModel as a pipeline stage; the model must outlive the adapter.
class ModelStage final : public PipelineStage {
 public:
  explicit ModelStage(model::NormFormerModel& model) : model_(&model) {}

  int stage() const override { return model_->placement().stage; }
  bool first() const override { return model_->placement().first(); }
  bool last() const override { return model_->placement().last(); }
  Device device() const override { return model_->options().device; }
  DType activation_dtype() const override { return model_->options().dtype; }
  Shape activation_shape() const override { return model_->hidden_shape(); }
  absl::StatusOr<const Tensor*> Forward(int micro_batch, const Tensor* input_ids,
                                        const Tensor* input_hidden, const Tensor& targets,
                                        uint64_t first_sample, bool train) override {
    return model_->ForwardStage(micro_batch, input_ids, input_hidden, targets, first_sample, train);
  }
  absl::Status Backward(int micro_batch, const Tensor* output_grad, float loss_weight,
                        const model::NormFormerModel::GradsDoneFrom& grads_done_from) override {
    return model_->BackwardStage(micro_batch, output_grad, loss_weight, grads_done_from);
  }
  absl::Status CopyInputGrad(const Tensor& dst) override {
    return ops::Cast(model_->input_grad(), dst);
  }
  void DiscardForward(int micro_batch) override { model_->DiscardForward(micro_batch); }

  model::NormFormerModel& model() const { return *model_; }

 private:
  model::NormFormerModel* model_;
};

}  // namespace nf::launcher
