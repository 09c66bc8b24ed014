// Tests of launcher/pipeline_executor.h with fake stages on a fake device: p pipeline ranks run
// on threads, each with its own executor, fake stages (PipelineStage) whose memory comes from
// an allocator labelled cuda:7 (host memory no backend serves), and a fake pipeline
// communicator that matches messages between the threads the way MPI and NCCL do for large
// messages (rendezvous: the receiver copies out of the sender's buffer, and a send completes
// only once received), records every send and receive (peer, bytes, device), counts the sends
// not yet waited for, and, like NCCL, refuses host tensors.
//
// Checked: every buffer the executor hands the communicator is on its chunk's device; the
// transfers come in the schedule's order and carry the right micro-batch (the stages check the
// values they receive); the sends pending at once, and the gradient send buffers, stay within
// the pipeline's send window for 4, 16 and 64 micro-batches (the same peak for 16 as for 64);
// evaluation's forward-only run discards every forward and keeps at most two per stage; errors
// name the stage, the action and the micro-batch.
#include "launcher/pipeline_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/status.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using parallel::Action;
using parallel::ScheduleKind;
using ::testing::HasSubstr;

// Where the fake stages live: a GPU index no test machine has, so nothing else can serve it.
const Device kFakeDevice = Device::Cuda(7);

constexpr int64_t kMicroBatchSize = 2, kSeqLen = 3, kDModel = 4;
constexpr int64_t kTokens = kMicroBatchSize * kSeqLen;
constexpr int64_t kActivationBytes = kTokens * kDModel * 4;  // f32 [T, d]

// Host memory labelled kFakeDevice.
class FakeDeviceAllocator final : public Allocator {
 public:
  Device device() const override { return kFakeDevice; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ++allocations_;
    return std::aligned_alloc(
        kCpuAlignment, (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment + kCpuAlignment);
  }
  void Deallocate(void* ptr, size_t /*bytes*/) override { std::free(ptr); }
  int allocations() const { return allocations_; }

 private:
  std::atomic<int> allocations_{0};
};

FakeDeviceAllocator& FakeDevice() {
  static FakeDeviceAllocator* allocator = new FakeDeviceAllocator();
  return *allocator;
}

// ---- The fake pipeline group -------------------------------------------------------------------

// The messages in flight between the threads of one pipeline group.
class Fabric {
 public:
  explicit Fabric(int size) : size_(size), channels_(static_cast<size_t>(size) * size) {}

  struct Message {
    std::optional<Tensor> payload;  // the sender's buffer, read when received
    bool received = false;
  };

  std::shared_ptr<Message> Post(int from, int to, const Tensor& tensor) {
    std::lock_guard<std::mutex> lock(mu_);
    auto message = std::make_shared<Message>();
    message->payload = tensor;
    channels_[Channel(from, to)].push_back(message);
    cv_.notify_all();
    return message;
  }

  absl::Status Take(int from, int to, const Tensor& dst) {
    std::unique_lock<std::mutex> lock(mu_);
    std::deque<std::shared_ptr<Message>>& channel = channels_[Channel(from, to)];
    if (!cv_.wait_for(lock, kTimeout, [&] { return aborted_ || !channel.empty(); })) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", to, " waited too long for a message from rank ", from));
    }
    if (aborted_) return absl::AbortedError("another rank failed");
    std::shared_ptr<Message> message = channel.front();
    channel.pop_front();
    if (message->payload->nbytes() != dst.nbytes()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", to, " receives ", dst.DebugString(),
                                                     " but rank ", from, " sent ",
                                                     message->payload->DebugString()));
    }
    std::memcpy(dst.raw_data(), message->payload->raw_data(), dst.nbytes());
    message->payload.reset();  // the sender may reuse its buffer from now on
    message->received = true;
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::Status WaitReceived(const Message& message) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kTimeout, [&] { return aborted_ || message.received; })) {
      return absl::DeadlineExceededError("a send waited too long for its receiver");
    }
    if (aborted_ && !message.received) return absl::AbortedError("another rank failed");
    return absl::OkStatus();
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  static constexpr std::chrono::seconds kTimeout{60};
  size_t Channel(int from, int to) const { return static_cast<size_t>(from) * size_ + to; }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::shared_ptr<Message>>> channels_;
  bool aborted_ = false;
};

struct Transfer {
  bool send = false;
  int peer = -1;
  int64_t bytes = 0;
  Device device;
};

// One rank of the fake pipeline group.
class FakePipelineComm final : public parallel::Communicator {
 public:
  FakePipelineComm(Fabric& fabric, int rank, int size, bool device_only)
      : fabric_(&fabric), rank_(rank), size_(size), device_only_(device_only) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> SendAsync(const Tensor& tensor,
                                                                  int peer) override {
    NF_RETURN_IF_ERROR(Check("send", tensor, peer));
    transfers_.push_back({.send = true,
                          .peer = peer,
                          .bytes = static_cast<int64_t>(tensor.nbytes()),
                          .device = tensor.device()});
    Count(parallel::CommOp::kSend, static_cast<int64_t>(tensor.nbytes()));
    live_sends_ += 1;
    live_bytes_ += static_cast<int64_t>(tensor.nbytes());
    peak_live_sends_ = std::max(peak_live_sends_, live_sends_);
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    return std::unique_ptr<parallel::CommHandle>(std::make_unique<Handle>(
        this, fabric_->Post(rank_, peer, tensor), static_cast<int64_t>(tensor.nbytes())));
  }
  // The receive copies the message out at Wait(), as MPI may.
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> RecvAsync(const Tensor& tensor,
                                                                  int peer) override {
    NF_RETURN_IF_ERROR(Check("receive", tensor, peer));
    transfers_.push_back({.send = false,
                          .peer = peer,
                          .bytes = static_cast<int64_t>(tensor.nbytes()),
                          .device = tensor.device()});
    Count(parallel::CommOp::kRecv, static_cast<int64_t>(tensor.nbytes()));
    return std::unique_ptr<parallel::CommHandle>(
        std::make_unique<RecvHandle>(*fabric_, peer, rank_, tensor));
  }
  absl::Status Recv(const Tensor& tensor, int peer) override {
    NF_ASSIGN_OR_RETURN(std::unique_ptr<parallel::CommHandle> handle, RecvAsync(tensor, peer));
    return handle->Wait();
  }
  absl::Status Send(const Tensor& tensor, int peer) override {
    NF_ASSIGN_OR_RETURN(std::unique_ptr<parallel::CommHandle> handle, SendAsync(tensor, peer));
    return handle->Wait();
  }

  // Not used by the executor.
  absl::Status AllReduce(const Tensor&, parallel::ReduceOp) override { return Unused(); }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllReduceAsync(
      const Tensor&, parallel::ReduceOp) override {
    return Unused();
  }
  absl::Status ReduceScatter(const Tensor&, const Tensor&) override { return Unused(); }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> ReduceScatterAsync(const Tensor&,
                                                                           const Tensor&) override {
    return Unused();
  }
  absl::Status AllGather(const Tensor&, const Tensor&) override { return Unused(); }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllGatherAsync(const Tensor&,
                                                                       const Tensor&) override {
    return Unused();
  }
  absl::Status Broadcast(const Tensor&, int) override { return Unused(); }
  absl::Status Barrier() override { return Unused(); }

  const std::vector<Transfer>& transfers() const { return transfers_; }
  int live_sends() const { return live_sends_; }
  int peak_live_sends() const { return peak_live_sends_; }
  int64_t peak_live_bytes() const { return peak_live_bytes_; }
  int dropped_sends() const { return dropped_sends_; }
  // Starts the next run's peaks from what is pending now.
  void ResetPeaks() {
    peak_live_sends_ = live_sends_;
    peak_live_bytes_ = live_bytes_;
  }

 private:
  class Handle final : public parallel::CommHandle {
   public:
    Handle(FakePipelineComm* comm, std::shared_ptr<Fabric::Message> message, int64_t bytes)
        : comm_(comm), message_(std::move(message)), bytes_(bytes) {}
    ~Handle() override {
      if (!waited_) ++comm_->dropped_sends_;
    }
    absl::Status Wait() override {
      if (waited_) return absl::FailedPreconditionError("a send waited for twice");
      waited_ = true;
      comm_->live_sends_ -= 1;
      comm_->live_bytes_ -= bytes_;
      return comm_->fabric_->WaitReceived(*message_);
    }

   private:
    FakePipelineComm* comm_;
    std::shared_ptr<Fabric::Message> message_;
    int64_t bytes_;
    bool waited_ = false;
  };

  class RecvHandle final : public parallel::CommHandle {
   public:
    RecvHandle(Fabric& fabric, int from, int to, Tensor dst)
        : fabric_(&fabric), from_(from), to_(to), dst_(std::move(dst)) {}
    absl::Status Wait() override { return fabric_->Take(from_, to_, dst_); }

   private:
    Fabric* fabric_;
    int from_, to_;
    Tensor dst_;
  };

  absl::Status Check(absl::string_view what, const Tensor& tensor, int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " cannot ", what, " with rank ", peer, " of ", size_));
    }
    if (device_only_ && tensor.device().type == DeviceType::kCpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL moves device tensors only, got ", tensor.DebugString(), " to ", what));
    }
    return absl::OkStatus();
  }
  static absl::Status Unused() { return absl::UnimplementedError("not a pipeline operation"); }

  Fabric* fabric_;
  int rank_, size_;
  bool device_only_;
  std::string name_ = "pp";
  std::vector<Transfer> transfers_;
  int live_sends_ = 0, peak_live_sends_ = 0, dropped_sends_ = 0;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0;
};

// ---- Fake stages -------------------------------------------------------------------------------

// What stage s sends for the micro-batch starting at sample `first_sample`, and the gradient
// it sends back: every element, so a receiver can tell which message it got.
float ActivationValue(int stage, uint64_t first_sample) {
  return static_cast<float>(stage * 1000 + static_cast<int>(first_sample) + 1);
}
float GradValue(int stage, uint64_t first_sample) {
  return -static_cast<float>(stage * 1000 + static_cast<int>(first_sample)) - 0.5f;
}

absl::Status ExpectAll(const Tensor& t, float value, const std::string& what) {
  const float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (data[i] != value) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": element ", i, " is ", data[i], ", expected ", value));
    }
  }
  return absl::OkStatus();
}

void Fill(const Tensor& t, float value) { std::fill_n(t.data<float>(), t.numel(), value); }

// A model chunk in miniature: keeps one output per micro-batch in flight, pooled like
// NormFormerModel's activations (so a released output is overwritten by a later forward), and
// checks every input it is given: device, and the value of the right (stage, micro-batch).
class FakeStage final : public PipelineStage {
 public:
  FakeStage(int stage, int num_stages) : stage_(stage), num_stages_(num_stages) {}

  int stage() const override { return stage_; }
  bool first() const override { return stage_ == 0; }
  bool last() const override { return stage_ == num_stages_ - 1; }
  Device device() const override { return kFakeDevice; }
  DType activation_dtype() const override { return DType::kF32; }
  Shape activation_shape() const override { return {kTokens, kDModel}; }
  absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) const override {
    if (zeros_on_host_) return Tensor::HostZeros(dtype, std::move(shape));
    NF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, std::move(shape), FakeDevice()));
    std::memset(t.raw_data(), 0, t.nbytes());
    return t;
  }

  absl::StatusOr<const Tensor*> Forward(int micro_batch, const Tensor* input_ids,
                                        const Tensor* input_hidden, const Tensor& targets,
                                        uint64_t first_sample, bool train) override {
    if (micro_batch == fail_forward_) return absl::InternalError("kernel exploded");
    ++(train ? train_forwards_ : eval_forwards_);
    if (first()) {
      if (input_ids == nullptr || input_hidden != nullptr) {
        return absl::InvalidArgumentError("the first stage reads token ids only");
      }
    } else {
      if (input_hidden == nullptr) return absl::InvalidArgumentError("no input activation");
      NF_RETURN_IF_ERROR(CheckOnDevice(*input_hidden, "input activation"));
      NF_RETURN_IF_ERROR(
          ExpectAll(*input_hidden, ActivationValue(stage_ - 1, first_sample),
                    absl::StrCat("stage ", stage_, " input of sample ", first_sample)));
    }
    if (last() && !targets.defined()) return absl::InvalidArgumentError("no targets");
    if (in_flight_.contains(micro_batch)) {
      return absl::FailedPreconditionError(
          absl::StrCat("micro-batch ", micro_batch, " forwarded twice"));
    }
    std::unique_ptr<InFlight> mb;
    if (pool_.empty()) {
      NF_ASSIGN_OR_RETURN(Tensor output, Zeros(DType::kF32, activation_shape()));
      mb = std::make_unique<InFlight>(InFlight{.output = std::move(output)});
    } else {
      mb = std::move(pool_.back());
      pool_.pop_back();
    }
    mb->first_sample = first_sample;
    Fill(mb->output, ActivationValue(stage_, first_sample));
    const Tensor* output = &mb->output;
    in_flight_[micro_batch] = std::move(mb);
    peak_in_flight_ = std::max(peak_in_flight_, static_cast<int>(in_flight_.size()));
    if (last()) {
      ++losses_;
      return nullptr;
    }
    return output;
  }

  absl::Status Backward(int micro_batch, const Tensor* output_grad, float /*loss_weight*/,
                        const model::NormFormerModel::GradsDoneFrom& grads_done_from) override {
    if (micro_batch == fail_backward_) return absl::InternalError("backward kernel exploded");
    const auto it = in_flight_.find(micro_batch);
    if (it == in_flight_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("micro-batch ", micro_batch, " is not in flight"));
    }
    const uint64_t first_sample = it->second->first_sample;
    if (!last()) {
      if (output_grad == nullptr) return absl::InvalidArgumentError("no output gradient");
      NF_RETURN_IF_ERROR(CheckOnDevice(*output_grad, "output gradient"));
      NF_RETURN_IF_ERROR(
          ExpectAll(*output_grad, GradValue(stage_ + 1, first_sample),
                    absl::StrCat("stage ", stage_, " output gradient of sample ", first_sample)));
    }
    if (!input_grad_.defined()) {
      NF_ASSIGN_OR_RETURN(input_grad_, Zeros(DType::kF32, activation_shape()));
    }
    Fill(input_grad_, GradValue(stage_, first_sample));  // overwritten by the next backward
    ++backwards_;
    pool_.push_back(std::move(it->second));
    in_flight_.erase(it);
    if (grads_done_from) NF_RETURN_IF_ERROR(grads_done_from(0));
    return absl::OkStatus();
  }

  absl::Status CopyInputGrad(const Tensor& dst) override {
    NF_RETURN_IF_ERROR(CheckOnDevice(dst, "input gradient copy"));
    if (!input_grad_.defined() || dst.nbytes() != input_grad_.nbytes()) {
      return absl::FailedPreconditionError("no input gradient of that size");
    }
    std::memcpy(dst.raw_data(), input_grad_.raw_data(), dst.nbytes());
    return absl::OkStatus();
  }

  void DiscardForward(int micro_batch) override {
    const auto it = in_flight_.find(micro_batch);
    if (it == in_flight_.end()) return;
    ++discards_;
    pool_.push_back(std::move(it->second));
    in_flight_.erase(it);
  }

  int in_flight() const { return static_cast<int>(in_flight_.size()); }
  int peak_in_flight() const { return peak_in_flight_; }
  int train_forwards() const { return train_forwards_; }
  int eval_forwards() const { return eval_forwards_; }
  int backwards() const { return backwards_; }
  int discards() const { return discards_; }
  int losses() const { return losses_; }
  void ResetPeak() { peak_in_flight_ = in_flight(); }
  void FailForwardOf(int micro_batch) { fail_forward_ = micro_batch; }
  void FailBackwardOf(int micro_batch) { fail_backward_ = micro_batch; }
  void AllocateOnHost() { zeros_on_host_ = true; }

 private:
  struct InFlight {
    Tensor output;
    uint64_t first_sample = 0;
  };

  absl::Status CheckOnDevice(const Tensor& t, absl::string_view what) const {
    if (t.device() == kFakeDevice) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", stage_, " got its ", what, " on ", t.device().ToString()));
  }

  int stage_, num_stages_;
  std::map<int, std::unique_ptr<InFlight>> in_flight_;  // stable addresses, like the model's
  std::vector<std::unique_ptr<InFlight>> pool_;
  Tensor input_grad_;
  int peak_in_flight_ = 0, train_forwards_ = 0, eval_forwards_ = 0, backwards_ = 0;
  int discards_ = 0, losses_ = 0;
  int fail_forward_ = -1, fail_backward_ = -1;
  bool zeros_on_host_ = false;
};

// Micro-batch k of the batch at sample b starts at sample b + 2 k.
class FakeBatches final : public BatchSource {
 public:
  FakeBatches()
      : inputs_(testing::MakeZeros(DType::kI32, {kMicroBatchSize, kSeqLen})),
        targets_(testing::MakeZeros(DType::kI32, {kMicroBatchSize, kSeqLen})) {}
  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) override {
    return batch_start + micro_batch * kMicroBatchSize;
  }
  int64_t stream_size() const override { return INT64_MAX; }
  const Tensor& inputs() const override { return inputs_; }
  const Tensor& targets() const override { return targets_; }
  std::string Describe() const override { return "fake"; }
  std::vector<int64_t> StreamEpochs() const override { return {}; }

 private:
  Tensor inputs_, targets_;
};

// ---- Running a pipeline on threads ----------------------------------------------------------

enum class Mode { kTrain, kEvaluate };

struct Layout {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int p = 1, v = 1, m = 1;
  std::string Name() const {
    return absl::StrCat(parallel::ScheduleKindName(kind), " p=", p, " v=", v, " m=", m);
  }
};

// One pipeline rank after its runs.
struct RankOutcome {
  absl::Status status;
  std::vector<PipelineExecutor::Result> results;  // one per run
  std::vector<int> comm_peak_sends;               // per run, counted by the communicator
  std::vector<int64_t> comm_peak_bytes;
  std::vector<Transfer> transfers;
  int live_sends_at_end = 0, dropped_sends = 0;
  std::vector<std::unique_ptr<FakeStage>> stages;
  std::vector<parallel::PlanStep> plan, forward_only_plan;
  int window = 0;
};

// Runs `modes` in order on every rank of `layout`, one thread per rank.
std::vector<RankOutcome> RunPipeline(const Layout& layout, const std::vector<Mode>& modes,
                                     bool device_only = true,
                                     const std::function<void(int, FakeStage&)>& tweak = nullptr) {
  Fabric fabric(layout.p);
  std::vector<RankOutcome> outcomes(layout.p);
  std::vector<std::thread> threads;
  for (int r = 0; r < layout.p; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[r];
      FakePipelineComm comm(fabric, r, layout.p, device_only);
      std::vector<PipelineStage*> stages;
      for (int c = 0; c < layout.v; ++c) {
        out.stages.push_back(std::make_unique<FakeStage>(c * layout.p + r, layout.p * layout.v));
        if (tweak) tweak(c * layout.p + r, *out.stages.back());
        stages.push_back(out.stages.back().get());
      }
      FakeBatches batches;
      out.status = [&]() -> absl::Status {
        NF_ASSIGN_OR_RETURN(PipelineExecutor executor,
                            PipelineExecutor::Create(stages, comm, layout.kind, layout.m));
        out.plan = executor.plan();
        out.forward_only_plan = executor.forward_only_plan();
        out.window = executor.send_window();
        for (size_t run = 0; run < modes.size(); ++run) {
          const PipelineStep step = {.step = static_cast<int64_t>(run),
                                     .batch_start = static_cast<int64_t>(run) * 1000,
                                     .first_micro_batch = 0,
                                     .micro_batch_size = kMicroBatchSize,
                                     .loss_weight = 1.0f};
          comm.ResetPeaks();
          for (auto& stage : out.stages) stage->ResetPeak();
          absl::StatusOr<PipelineExecutor::Result> result =
              modes[run] == Mode::kTrain ? executor.Run(step, batches, nullptr)
                                         : executor.RunForwardOnly(step, batches);
          NF_RETURN_IF_ERROR(result.status());
          out.results.push_back(*result);
          out.comm_peak_sends.push_back(comm.peak_live_sends());
          out.comm_peak_bytes.push_back(comm.peak_live_bytes());
        }
        return absl::OkStatus();
      }();
      if (!out.status.ok()) fabric.Abort();
      out.transfers = comm.transfers();
      out.live_sends_at_end = comm.live_sends();
      out.dropped_sends = comm.dropped_sends();
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

// The transfers a plan makes, in order.
std::vector<std::pair<bool, int>> TransfersOf(const std::vector<parallel::PlanStep>& plan) {
  std::vector<std::pair<bool, int>> out;
  for (const parallel::PlanStep& step : plan) {
    for (const Action& a : step.actions) {
      if (!a.is_compute()) out.emplace_back(a.is_send(), a.peer);
    }
  }
  return out;
}

const Layout kLayouts[] = {
    {.kind = ScheduleKind::kOneFOneB, .p = 1, .v = 1, .m = 4},
    {.kind = ScheduleKind::kOneFOneB, .p = 4, .v = 1, .m = 8},
    {.kind = ScheduleKind::kOneFOneB, .p = 3, .v = 1, .m = 2},  // fewer micro-batches than p
    {.kind = ScheduleKind::kGPipe, .p = 2, .v = 1, .m = 4},
    {.kind = ScheduleKind::kInterleavedOneFOneB, .p = 2, .v = 2, .m = 4},
    {.kind = ScheduleKind::kInterleavedOneFOneB, .p = 4, .v = 3, .m = 8},
};

// Training, then evaluation, then training again, on every layout, through a communicator that
// refuses host tensors as NCCL does: every transfer is of a [T, d] tensor on the fake device, in
// the order of the rank's transfer plan (the training one, then the forward-only one, then the
// training one); every stage ran each micro-batch once per run, with dropout in training only,
// and holds nothing at the end; no send was left without a wait.
TEST(PipelineExecutorTest, EveryTransferIsOnTheDeviceInPlanOrder) {
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(layout.Name());
    std::vector<RankOutcome> outcomes =
        RunPipeline(layout, {Mode::kTrain, Mode::kEvaluate, Mode::kTrain});
    for (int r = 0; r < layout.p; ++r) {
      const RankOutcome& out = outcomes[r];
      NF_ASSERT_OK(out.status) << "rank " << r;
      std::vector<std::pair<bool, int>> expected = TransfersOf(out.plan);
      const std::vector<std::pair<bool, int>> eval = TransfersOf(out.forward_only_plan);
      expected.insert(expected.end(), eval.begin(), eval.end());
      const std::vector<std::pair<bool, int>> train = TransfersOf(out.plan);
      expected.insert(expected.end(), train.begin(), train.end());
      ASSERT_EQ(out.transfers.size(), expected.size()) << "rank " << r;
      for (size_t k = 0; k < expected.size(); ++k) {
        const Transfer& t = out.transfers[k];
        EXPECT_EQ(std::make_pair(t.send, t.peer), expected[k]) << "rank " << r << " transfer " << k;
        EXPECT_EQ(t.bytes, kActivationBytes) << "rank " << r << " transfer " << k;
        EXPECT_EQ(t.device, kFakeDevice) << "rank " << r << " transfer " << k;
      }
      EXPECT_EQ(out.live_sends_at_end, 0) << "rank " << r;
      EXPECT_EQ(out.dropped_sends, 0) << "rank " << r;
      for (const auto& stage : out.stages) {
        SCOPED_TRACE(absl::StrCat("stage ", stage->stage()));
        EXPECT_EQ(stage->train_forwards(), 2 * layout.m);
        EXPECT_EQ(stage->eval_forwards(), layout.m);
        EXPECT_EQ(stage->backwards(), 2 * layout.m);
        EXPECT_EQ(stage->discards(), layout.m);  // evaluation's forwards, each once
        EXPECT_EQ(stage->in_flight(), 0);
        EXPECT_EQ(stage->losses(), stage->last() ? 3 * layout.m : 0);
      }
    }
  }
}

// The sends pending at once stay within the rank's send window (SendWindow: p - r under 1F1B
// and GPipe, the activations in flight when interleaved), however many micro-batches: the same
// peak for 16 as for 64. The communicator's own count of sends not yet waited for agrees with
// the executor's, and so do the bytes; the gradient send buffers never outnumber the window,
// and the receive buffers (receives are posted ahead) the window plus one per chunk, the same
// for 16 as for 64 micro-batches.
TEST(PipelineExecutorTest, PendingSendsStayWithinThePipelineDepth) {
  for (const auto& [kind, v] :
       {std::pair{ScheduleKind::kOneFOneB, 1}, std::pair{ScheduleKind::kGPipe, 1},
        std::pair{ScheduleKind::kInterleavedOneFOneB, 2}}) {
    constexpr int p = 4;
    std::map<int, std::vector<int>> peaks, recv_buffers;  // by m, per rank
    for (const int m : {4, 16, 64}) {
      const Layout layout = {.kind = kind, .p = p, .v = v, .m = m};
      SCOPED_TRACE(layout.Name());
      std::vector<RankOutcome> outcomes = RunPipeline(layout, {Mode::kTrain, Mode::kEvaluate});
      for (int r = 0; r < p; ++r) {
        const RankOutcome& out = outcomes[r];
        NF_ASSERT_OK(out.status) << "rank " << r;
        ASSERT_EQ(out.results.size(), 2u);
        EXPECT_EQ(out.window, parallel::SendWindow(kind, p, r, v));
        const PipelineExecutor::Result& train = out.results[0];
        EXPECT_EQ(train.peak_live_sends, out.comm_peak_sends[0]) << "rank " << r;
        EXPECT_EQ(train.peak_send_bytes, out.comm_peak_bytes[0]) << "rank " << r;
        EXPECT_LE(train.peak_live_sends, out.window) << "rank " << r;
        EXPECT_LE(train.peak_send_bytes, out.window * kActivationBytes) << "rank " << r;
        EXPECT_LE(train.send_buffers, out.window) << "rank " << r;
        // Receives posted ahead hold a few more buffers, bounded by the depth too.
        EXPECT_LE(train.recv_buffers, out.window + v) << "rank " << r;
        recv_buffers[m].push_back(train.recv_buffers);
        peaks[m].push_back(train.peak_live_sends);
        // Evaluation: one send pending at most, two forwards kept per stage.
        const PipelineExecutor::Result& eval = out.results[1];
        EXPECT_EQ(eval.peak_live_sends, out.comm_peak_sends[1]) << "rank " << r;
        EXPECT_LE(eval.peak_live_sends, parallel::kForwardOnlySendWindow) << "rank " << r;
        EXPECT_LE(eval.peak_send_bytes, kActivationBytes) << "rank " << r;
        for (const auto& stage : out.stages) EXPECT_LE(stage->peak_in_flight(), 2) << "rank " << r;
      }
    }
    EXPECT_EQ(peaks[16], peaks[64]) << parallel::ScheduleKindName(kind);
    EXPECT_EQ(recv_buffers[16], recv_buffers[64]) << parallel::ScheduleKindName(kind);
  }
}

// A host buffer cannot slip through: a stage whose allocations land on the host is refused at
// once, naming the stage and both devices (NCCL would refuse the first transfer otherwise).
TEST(PipelineExecutorTest, RefusesBuffersOffTheStageDevice) {
  FakeStage stage(0, 2);
  stage.AllocateOnHost();
  Fabric fabric(2);
  FakePipelineComm comm(fabric, 0, 2, /*device_only=*/true);
  const absl::StatusOr<PipelineExecutor> executor =
      PipelineExecutor::Create({&stage}, comm, ScheduleKind::kOneFOneB, 2);
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kInternal) << executor.status();
  EXPECT_THAT(std::string(executor.status().message()),
              HasSubstr("pipeline stage 0 on cuda:7 got a buffer on cpu"));
}

// A failing layer or kernel is reported with the action it failed in: the stage, forward or
// backward, and the micro-batch; the code is the original one.
TEST(PipelineExecutorTest, ErrorsNameTheStageActionAndMicroBatch) {
  const Layout single = {.kind = ScheduleKind::kOneFOneB, .p = 1, .v = 1, .m = 4};
  std::vector<RankOutcome> forward = RunPipeline(
      single, {Mode::kTrain}, true, [](int, FakeStage& stage) { stage.FailForwardOf(2); });
  EXPECT_EQ(forward[0].status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(forward[0].status.message(), "stage 0 forward of micro-batch 2: kernel exploded");

  std::vector<RankOutcome> backward = RunPipeline(
      single, {Mode::kTrain}, true, [](int, FakeStage& stage) { stage.FailBackwardOf(1); });
  EXPECT_EQ(backward[0].status.message(),
            "stage 0 backward of micro-batch 1: backward kernel exploded");

  // On a later stage of a pipeline: that rank reports its stage; the others see it abort.
  const Layout pipeline = {.kind = ScheduleKind::kOneFOneB, .p = 2, .v = 1, .m = 4};
  std::vector<RankOutcome> later =
      RunPipeline(pipeline, {Mode::kEvaluate}, true, [](int stage, FakeStage& fake) {
        if (stage == 1) fake.FailForwardOf(3);
      });
  EXPECT_EQ(later[1].status.message(), "stage 1 forward of micro-batch 3: kernel exploded");
}

}  // namespace
}  // namespace nf::launcher
