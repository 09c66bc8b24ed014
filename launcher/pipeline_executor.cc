#include "launcher/pipeline_executor.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::launcher {

using parallel::Action;

absl::StatusOr<PipelineExecutor> PipelineExecutor::Create(
    std::vector<model::NormFormerModel*> chunks, parallel::Communicator& pp,
    parallel::ScheduleKind kind, int micro_batches) {
  NF_ASSIGN_OR_RETURN(std::vector<Action> schedule,
                      parallel::BuildSchedule(kind, pp.size(), pp.rank(), micro_batches,
                                              static_cast<int>(chunks.size())));
  PipelineExecutor executor(std::move(chunks), pp, std::move(schedule));
  const model::NormFormerModel& any = *executor.chunks_.front();
  const int64_t tokens = any.options().micro_batch * any.options().seq_len;
  NF_ASSIGN_OR_RETURN(executor.received_,
                      Tensor::Zeros(any.options().dtype, {tokens, any.config().d_model()}));
  return executor;
}

bool PipelineExecutor::IsFirstStage(int chunk) const { return chunks_[chunk]->placement().first(); }

bool PipelineExecutor::IsLastStage(int chunk) const { return chunks_[chunk]->placement().last(); }

absl::Status PipelineExecutor::WaitActivationSend(int micro_batch, int chunk) {
  for (PendingSend& send : sends_) {
    if (send.handle && send.action.kind == Action::kSendActivation &&
        send.action.micro_batch == micro_batch && send.action.model_chunk == chunk) {
      NF_RETURN_IF_ERROR(send.handle->Wait());
      send.handle.reset();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PipelineExecutor::Result> PipelineExecutor::Run(const PipelineStep& step,
                                                               BatchSource& batches,
                                                               const GradsDoneFn& grads_done) {
  Result result;
  // The pipeline group's wait seconds (communicator.h) grow only by this schedule's sends and
  // receives while it runs.
  const auto pipeline_waited = [this] {
    return pp_->stats().seconds_of(parallel::CommOp::kSend) +
           pp_->stats().seconds_of(parallel::CommOp::kRecv);
  };
  const double waited_before = pipeline_waited();
  std::vector<int> backwards_left(chunks_.size(), 0);
  for (const Action& a : schedule_) {
    if (a.kind == Action::kBackward) ++backwards_left[a.model_chunk];
  }
  const Tensor* input = nullptr;  // the activation or gradient just received
  for (const Action& a : schedule_) {
    model::NormFormerModel& chunk = *chunks_[a.model_chunk];
    switch (a.kind) {
      case Action::kRecvActivation:
      case Action::kRecvGrad:
        NF_RETURN_IF_ERROR(pp_->Recv(received_, a.peer));
        input = &received_;
        break;
      case Action::kForward: {
        const int64_t global_micro_batch = step.first_micro_batch + a.micro_batch;
        const uint64_t first_sample = static_cast<uint64_t>(
            step.step * step.global_batch_size + global_micro_batch * step.micro_batch_size);
        const bool first = IsFirstStage(a.model_chunk), last = IsLastStage(a.model_chunk);
        if (first || last) {
          const auto load_start = std::chrono::steady_clock::now();
          NF_ASSIGN_OR_RETURN(const int64_t loaded, batches.Load(step.step, global_micro_batch));
          result.data_seconds +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
          if (static_cast<uint64_t>(loaded) != first_sample) {
            return absl::InternalError(absl::StrCat("micro-batch ", global_micro_batch, " of step ",
                                                    step.step, " starts at sample ", loaded,
                                                    ", expected ", first_sample));
          }
        }
        NF_ASSIGN_OR_RETURN(
            const Tensor* const output,
            chunk.ForwardStage(a.micro_batch, first ? &batches.inputs() : nullptr,
                               first ? nullptr : input, last ? batches.targets() : Tensor(),
                               first_sample, true));
        input = nullptr;
        // Sent by a later action; valid until this micro-batch's backward on the chunk.
        if (!last) outputs_[{a.micro_batch, a.model_chunk}] = *output;
        break;
      }
      case Action::kSendActivation: {
        const auto output = outputs_.find({a.micro_batch, a.model_chunk});
        if (output == outputs_.end()) {
          return absl::InternalError(absl::StrCat(a.ToString(), " before its forward"));
        }
        NF_ASSIGN_OR_RETURN(std::unique_ptr<parallel::CommHandle> handle,
                            pp_->SendAsync(output->second, a.peer));
        sends_.push_back({.action = a, .buffer = output->second, .handle = std::move(handle)});
        outputs_.erase(output);
        break;
      }
      case Action::kBackward: {
        NF_RETURN_IF_ERROR(WaitActivationSend(a.micro_batch, a.model_chunk));
        const bool final_backward = --backwards_left[a.model_chunk] == 0;
        model::NormFormerModel::GradsDoneFrom done;
        if (final_backward && grads_done) {
          done = [&, c = a.model_chunk](int64_t offset) { return grads_done(c, offset); };
        }
        NF_RETURN_IF_ERROR(chunk.BackwardStage(
            a.micro_batch, IsLastStage(a.model_chunk) ? nullptr : input, step.loss_weight, done));
        input = nullptr;
        break;
      }
      case Action::kSendGrad: {
        Tensor buffer;
        if (grad_pool_.empty()) {
          NF_ASSIGN_OR_RETURN(buffer, Tensor::Zeros(received_.dtype(), received_.shape()));
        } else {
          buffer = std::move(grad_pool_.back());
          grad_pool_.pop_back();
        }
        // input_grad() is overwritten by the chunk's next backward: send a copy.
        NF_RETURN_IF_ERROR(ops::Cast(chunk.input_grad(), buffer));
        NF_ASSIGN_OR_RETURN(std::unique_ptr<parallel::CommHandle> handle,
                            pp_->SendAsync(buffer, a.peer));
        sends_.push_back({.action = a, .buffer = buffer, .handle = std::move(handle)});
        break;
      }
    }
  }
  absl::Status status;
  for (PendingSend& send : sends_) {
    if (send.handle) status.Update(send.handle->Wait());
    if (send.action.kind == Action::kSendGrad) grad_pool_.push_back(std::move(send.buffer));
  }
  sends_.clear();
  NF_RETURN_IF_ERROR(status);
  result.pipeline_wait_seconds = pipeline_waited() - waited_before;
  return result;
}

}  // namespace nf::launcher
