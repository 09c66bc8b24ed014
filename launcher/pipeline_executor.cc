#include "launcher/pipeline_executor.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/trace_range.h"

namespace nf::launcher {

using parallel::Action;

namespace {

// A buffer the executor allocated for `stage` must be on its device: NCCL refuses anything
// else, and the MPI communicator would silently stage it through the host.
absl::Status CheckOnDevice(const Tensor& buffer, const PipelineStage& stage) {
  if (buffer.device() == stage.device()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("pipeline stage ", stage.stage(), " on ",
                                          stage.device().ToString(), " got a buffer on ",
                                          buffer.device().ToString()));
}

}  // namespace

absl::StatusOr<PipelineExecutor> PipelineExecutor::Create(std::vector<PipelineStage*> stages,
                                                          parallel::Communicator& pp,
                                                          parallel::ScheduleKind kind,
                                                          int micro_batches) {
  if (stages.empty()) return absl::InvalidArgumentError("a pipeline rank needs a model chunk");
  const int p = pp.size(), r = pp.rank(), v = static_cast<int>(stages.size());
  PipelineExecutor executor(std::move(stages), pp);
  // Every rank's lists, for the plan: where a receive goes depends on when its peer sends.
  NF_ASSIGN_OR_RETURN(const auto schedules, parallel::BuildAllSchedules(kind, p, micro_batches, v));
  NF_ASSIGN_OR_RETURN(const auto forward_only,
                      parallel::BuildAllForwardOnlySchedules(p, micro_batches, v));
  NF_ASSIGN_OR_RETURN(auto plans, parallel::BuildTransferPlans(schedules));
  NF_ASSIGN_OR_RETURN(auto forward_only_plans, parallel::BuildTransferPlans(forward_only));
  executor.schedule_ = schedules[r];
  executor.forward_only_ = forward_only[r];
  executor.plan_ = std::move(plans[r]);
  executor.forward_only_plan_ = std::move(forward_only_plans[r]);
  executor.window_ = parallel::SendWindow(kind, p, r, v);
  // One receive buffer per chunk up front: a stage whose memory is not on its device is
  // refused here rather than at its first transfer.
  executor.recv_pool_.resize(executor.stages_.size());
  for (size_t c = 0; c < executor.stages_.size(); ++c) {
    NF_ASSIGN_OR_RETURN(Tensor buffer,
                        executor.PooledBuffer(*executor.stages_[c], executor.recv_pool_[c],
                                              executor.recv_buffers_));
    executor.recv_pool_[c].push_back(std::move(buffer));
  }
  return executor;
}

absl::StatusOr<PipelineExecutor> PipelineExecutor::Create(
    std::vector<model::NormFormerModel*> chunks, parallel::Communicator& pp,
    parallel::ScheduleKind kind, int micro_batches) {
  std::vector<std::unique_ptr<PipelineStage>> owned;
  std::vector<PipelineStage*> stages;
  for (model::NormFormerModel* chunk : chunks) {
    owned.push_back(std::make_unique<ModelStage>(*chunk));
    stages.push_back(owned.back().get());
  }
  NF_ASSIGN_OR_RETURN(PipelineExecutor executor,
                      Create(std::move(stages), pp, kind, micro_batches));
  executor.owned_ = std::move(owned);  // the adapters stay where stages_ points
  return executor;
}

absl::Status PipelineExecutor::Annotate(const absl::Status& status, const Action& a) const {
  if (status.ok()) return status;
  std::string what;
  switch (a.kind) {
    case Action::kForward:
      what = "forward";
      break;
    case Action::kBackward:
      what = "backward";
      break;
    case Action::kSendActivation:
      what = absl::StrCat("send of the activation to rank ", a.peer);
      break;
    case Action::kSendGrad:
      what = absl::StrCat("send of the gradient to rank ", a.peer);
      break;
    case Action::kRecvActivation:
      what = absl::StrCat("receive of the activation from rank ", a.peer);
      break;
    case Action::kRecvGrad:
      what = absl::StrCat("receive of the gradient from rank ", a.peer);
      break;
  }
  return WithContext(status, absl::StrCat("stage ", stages_[a.model_chunk]->stage(), " ", what,
                                          " of micro-batch ", a.micro_batch));
}

absl::Status PipelineExecutor::CompleteSend(size_t index, bool train) {
  PendingSend send = std::move(sends_[index]);
  sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(index));
  const absl::Status status = send.handle->Wait();
  live_send_bytes_ -= static_cast<int64_t>(send.buffer.nbytes());
  if (send.action.kind == Action::kSendGrad) {
    grad_pool_.push_back(std::move(send.buffer));
  } else if (!train) {
    // Evaluation keeps a forward only until its output has gone.
    stages_[send.action.model_chunk]->DiscardForward(send.action.micro_batch);
  }
  return Annotate(status, send.action);
}

absl::Status PipelineExecutor::CompleteSendsAbove(int window, bool train) {
  while (!sends_.empty() && static_cast<int>(sends_.size()) >= window) {
    NF_RETURN_IF_ERROR(CompleteSend(0, train));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> PipelineExecutor::PooledBuffer(const PipelineStage& stage,
                                                      std::vector<Tensor>& pool, int& allocated) {
  for (auto it = pool.begin(); it != pool.end(); ++it) {
    if (it->device() == stage.device() && it->dtype() == stage.activation_dtype() &&
        it->shape() == stage.activation_shape()) {
      Tensor buffer = std::move(*it);
      pool.erase(it);
      return buffer;
    }
  }
  NF_ASSIGN_OR_RETURN(Tensor buffer,
                      stage.Zeros(stage.activation_dtype(), stage.activation_shape()));
  NF_RETURN_IF_ERROR(CheckOnDevice(buffer, stage));
  ++allocated;
  return buffer;
}

absl::Status PipelineExecutor::StartGroup(const parallel::PlanStep& group, int window, bool train,
                                          Result& result) {
  std::vector<parallel::Transfer> transfers;
  std::vector<Tensor> buffers;  // by transfer
  for (const Action& a : group.actions) {
    PipelineStage& stage = *stages_[a.model_chunk];
    Tensor buffer;
    if (a.kind == Action::kSendActivation) {
      NF_RETURN_IF_ERROR(Annotate(CompleteSendsAbove(window, train), a));
      const auto output = outputs_.find({a.micro_batch, a.model_chunk});
      if (output == outputs_.end()) {
        return absl::InternalError(absl::StrCat(a.ToString(), " before its forward"));
      }
      buffer = std::move(output->second);
      outputs_.erase(output);
    } else if (a.kind == Action::kSendGrad) {
      NF_RETURN_IF_ERROR(Annotate(CompleteSendsAbove(window, train), a));
      NF_ASSIGN_OR_RETURN(buffer, PooledBuffer(stage, grad_pool_, grad_buffers_));
      // The input gradient is overwritten by the chunk's next backward: send a copy.
      NF_RETURN_IF_ERROR(Annotate(stage.CopyInputGrad(buffer), a));
    } else {
      NF_ASSIGN_OR_RETURN(buffer, PooledBuffer(stage, recv_pool_[a.model_chunk], recv_buffers_));
    }
    transfers.push_back({.op = a.is_send() ? parallel::CommOp::kSend : parallel::CommOp::kRecv,
                         .tensor = buffer,
                         .peer = a.peer});
    buffers.push_back(std::move(buffer));
  }
  const TraceRange trace(parallel::PlanStepToString(group));
  auto handles = pp_->StartBatch(transfers);
  if (!handles.ok()) return Annotate(handles.status(), group.actions.front());
  for (size_t i = 0; i < group.actions.size(); ++i) {
    const Action& a = group.actions[i];
    if (a.is_send()) {
      live_send_bytes_ += static_cast<int64_t>(buffers[i].nbytes());
      sends_.push_back(
          {.action = a, .buffer = std::move(buffers[i]), .handle = std::move((*handles)[i])});
      result.peak_live_sends = std::max(result.peak_live_sends, static_cast<int>(sends_.size()));
      result.peak_send_bytes = std::max(result.peak_send_bytes, live_send_bytes_);
    } else {
      recvs_[{a.kind == Action::kRecvActivation, a.micro_batch, a.model_chunk}] = {
          .action = a, .buffer = std::move(buffers[i]), .handle = std::move((*handles)[i])};
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PipelineExecutor::PendingRecv>> PipelineExecutor::TakeInput(
    const Action& compute) {
  const PipelineStage& stage = *stages_[compute.model_chunk];
  const bool forward = compute.kind == Action::kForward;
  if (forward ? stage.first() : stage.last()) return std::nullopt;  // reads ids, or the loss
  const auto it = recvs_.find({forward, compute.micro_batch, compute.model_chunk});
  if (it == recvs_.end()) {
    return absl::InternalError(
        absl::StrCat(compute.ToString(), " before the receive of its input was started"));
  }
  PendingRecv recv = std::move(it->second);
  recvs_.erase(it);
  NF_RETURN_IF_ERROR(Annotate(recv.handle->Wait(), recv.action));
  return recv;
}

absl::Status PipelineExecutor::RunCompute(const Action& a, bool train, const PipelineStep& step,
                                          BatchSource& batches, const GradsDoneFn& grads_done,
                                          std::vector<int>& backwards_left, const Tensor* input,
                                          Result& result) {
  const TraceRange trace(a.ToString());
  PipelineStage& stage = *stages_[a.model_chunk];
  switch (a.kind) {
    case Action::kForward: {
      const int64_t global_micro_batch = step.first_micro_batch + a.micro_batch;
      const uint64_t first_sample =
          static_cast<uint64_t>(step.batch_start + global_micro_batch * step.micro_batch_size);
      const bool first = stage.first(), last = stage.last();
      if (first || last) {
        const auto load_start = std::chrono::steady_clock::now();
        NF_ASSIGN_OR_RETURN(const int64_t loaded,
                            batches.Load(step.batch_start, global_micro_batch));
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
          stage.Forward(a.micro_batch, first ? &batches.inputs() : nullptr, first ? nullptr : input,
                        last ? batches.targets() : Tensor(), first_sample, train));
      if (!last) {
        // Sent by the next action; valid until this micro-batch's backward on the chunk, or
        // in evaluation until the send completes.
        outputs_[{a.micro_batch, a.model_chunk}] = *output;
      } else if (!train) {
        stage.DiscardForward(a.micro_batch);  // nothing to send, no backward
      }
      return absl::OkStatus();
    }
    case Action::kBackward: {
      const bool final_backward = --backwards_left[a.model_chunk] == 0;
      model::NormFormerModel::GradsDoneFrom done;
      if (final_backward && grads_done) {
        done = [&, c = a.model_chunk](int64_t offset) { return grads_done(c, offset); };
      }
      NF_RETURN_IF_ERROR(
          stage.Backward(a.micro_batch, stage.last() ? nullptr : input, step.loss_weight, done));
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(a.ToString(), " is not a computation"));
}

absl::StatusOr<PipelineExecutor::Result> PipelineExecutor::RunPlan(
    const std::vector<parallel::PlanStep>& plan, int window, bool train, const PipelineStep& step,
    BatchSource& batches, const GradsDoneFn& grads_done, ComputeObserver* observer) {
  Result result;
  // The pipeline group's wait seconds (communicator.h) grow only by this plan's sends and
  // receives while it runs.
  const auto pipeline_waited = [this] {
    return pp_->stats().seconds_of(parallel::CommOp::kSend) +
           pp_->stats().seconds_of(parallel::CommOp::kRecv);
  };
  const double waited_before = pipeline_waited();
  std::vector<int> backwards_left(stages_.size(), 0);
  for (const parallel::PlanStep& s : plan) {
    if (s.is_compute() && s.actions[0].kind == Action::kBackward) {
      ++backwards_left[s.actions[0].model_chunk];
    }
  }
  for (const parallel::PlanStep& s : plan) {
    if (!s.is_compute()) {
      NF_RETURN_IF_ERROR(StartGroup(s, window, train, result));
      continue;
    }
    const Action& a = s.actions[0];
    // The waits SimulateUnderNcclRules models, and no others.
    if (a.kind == Action::kBackward) {
      // Its activation send read the activations the backward releases.
      for (size_t k = 0; k < sends_.size(); ++k) {
        const Action& sent = sends_[k].action;
        if (sent.kind == Action::kSendActivation && sent.micro_batch == a.micro_batch &&
            sent.model_chunk == a.model_chunk) {
          NF_RETURN_IF_ERROR(CompleteSend(k, train));
          break;
        }
      }
    }
    NF_ASSIGN_OR_RETURN(const std::optional<PendingRecv> input, TakeInput(a));
    const int stage = stages_[a.model_chunk]->stage();
    if (observer != nullptr) observer->Started(a, stage);
    NF_RETURN_IF_ERROR(Annotate(RunCompute(a, train, step, batches, grads_done, backwards_left,
                                           input ? &input->buffer : nullptr, result),
                                a));
    if (observer != nullptr) observer->Finished(a, stage);
    // The computation has read its input (stages copy what they keep).
    if (input) recv_pool_[a.model_chunk].push_back(input->buffer);
  }
  absl::Status status;
  while (!sends_.empty()) status.Update(CompleteSend(0, train));
  NF_RETURN_IF_ERROR(status);
  if (!recvs_.empty()) {
    return absl::InternalError(
        absl::StrCat(recvs_.begin()->second.action.ToString(), " was started and never read"));
  }
  result.send_buffers = grad_buffers_;
  result.recv_buffers = recv_buffers_;
  result.pipeline_wait_seconds = pipeline_waited() - waited_before;
  last_result_ = result;
  return result;
}

absl::StatusOr<PipelineExecutor::Result> PipelineExecutor::Run(const PipelineStep& step,
                                                               BatchSource& batches,
                                                               const GradsDoneFn& grads_done,
                                                               ComputeObserver* observer) {
  return RunPlan(plan_, window_, /*train=*/true, step, batches, grads_done, observer);
}

absl::StatusOr<PipelineExecutor::Result> PipelineExecutor::RunForwardOnly(const PipelineStep& step,
                                                                          BatchSource& batches) {
  return RunPlan(forward_only_plan_, parallel::kForwardOnlySendWindow, /*train=*/false, step,
                 batches, nullptr, nullptr);
}

}  // namespace nf::launcher
