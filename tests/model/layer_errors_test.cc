// An error from deep inside the model (a kernel, a tensor-parallel collective) says which
// decoder layer it came from and in which direction: on a 2.7B run "all-reduce failed" alone
// leaves a user reading 32 layers' code. The executor adds the stage and micro-batch on top
// (launcher/pipeline_executor.h).
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/normformer_model.h"
#include "parallel/local_communicator.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;
using ::testing::HasSubstr;

// A group of one whose `fail_at`-th all-reduce (counting from 0, blocking or started: the
// overlapped backward starts its reductions) fails; everything else is the local
// communicator's.
class FailingAllReduce final : public parallel::Communicator {
 public:
  explicit FailingAllReduce(int fail_at) : fail_at_(fail_at) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return local_.name(); }
  absl::Status AllReduce(const Tensor& tensor, parallel::ReduceOp op) override {
    if (calls_++ == fail_at_) return absl::UnavailableError("tp all-reduce: peer went away");
    return local_.AllReduce(tensor, op);
  }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllReduceAsync(
      const Tensor& tensor, parallel::ReduceOp op) override {
    if (calls_++ == fail_at_) return absl::UnavailableError("tp all-reduce: peer went away");
    return local_.AllReduceAsync(tensor, op);
  }
  absl::Status ReduceScatter(const Tensor& input, const Tensor& output) override {
    return local_.ReduceScatter(input, output);
  }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> ReduceScatterAsync(
      const Tensor& input, const Tensor& output) override {
    return local_.ReduceScatterAsync(input, output);
  }
  absl::Status AllGather(const Tensor& input, const Tensor& output) override {
    return local_.AllGather(input, output);
  }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllGatherAsync(
      const Tensor& input, const Tensor& output) override {
    return local_.AllGatherAsync(input, output);
  }
  absl::Status Broadcast(const Tensor& tensor, int root) override {
    return local_.Broadcast(tensor, root);
  }
  absl::Status Send(const Tensor& tensor, int peer) override { return local_.Send(tensor, peer); }
  absl::Status Recv(const Tensor& tensor, int peer) override { return local_.Recv(tensor, peer); }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> SendAsync(const Tensor& tensor,
                                                                  int peer) override {
    return local_.SendAsync(tensor, peer);
  }
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> RecvAsync(const Tensor& tensor,
                                                                  int peer) override {
    return local_.RecvAsync(tensor, peer);
  }
  absl::Status Barrier() override { return local_.Barrier(); }
  int calls() const { return calls_; }

 private:
  parallel::LocalCommunicator local_{"tp"};
  int fail_at_;
  int calls_ = 0;
};

ModelConfig ThreeLayers() {
  ModelConfig c;
  c.set_num_layers(3);
  c.set_d_model(8);
  c.set_num_heads(2);
  c.set_ffn_dim(16);
  c.set_vocab_size(16);
  c.set_max_seq_len(4);
  c.mutable_normformer()->set_scale_attn(true);
  c.mutable_normformer()->set_scale_fc(true);
  return c;
}

// Each of a forward's all-reduces is made to fail in turn (counted first by a group that never
// fails): every failure names its layer and direction first, and every layer gets named.
TEST(LayerErrorsTest, AFailureInsideALayerNamesTheLayerAndTheDirection) {
  const ModelConfig config = ThreeLayers();
  const Tensor ids = MakeIds({1, 4}, {1, 2, 3, 4});
  const Tensor targets = MakeIds({1, 4}, {2, 3, 4, 5});
  FailingAllReduce counting(-1);
  const ModelOptions options = {.micro_batch = 1, .seq_len = 4, .tensor_parallel = &counting};
  {
    auto model = NormFormerModel::Create(config, options);
    NF_ASSERT_OK(model);
    NF_ASSERT_OK((*model)->Forward(ids, targets, 0, true));
  }
  const int forward_calls = counting.calls();
  ASSERT_GT(forward_calls, 3);  // at least one per layer
  std::vector<bool> named(3, false);
  for (int fail_at = 0; fail_at < forward_calls; ++fail_at) {
    FailingAllReduce failing(fail_at);
    ModelOptions with_failure = options;
    with_failure.tensor_parallel = &failing;
    auto model = NormFormerModel::Create(config, with_failure);
    NF_ASSERT_OK(model);
    const absl::StatusOr<NormFormerModel::LossSum> loss = (*model)->Forward(ids, targets, 0, true);
    ASSERT_FALSE(loss.ok()) << "all-reduce " << fail_at;
    const std::string message(loss.status().message());
    EXPECT_THAT(message, HasSubstr("tp all-reduce: peer went away"));
    EXPECT_EQ(loss.status().code(), absl::StatusCode::kUnavailable);
    for (int l = 0; l < 3; ++l) {
      if (message.find("decoder layer " + std::to_string(l) + " forward: ") == 0) named[l] = true;
    }
  }
  EXPECT_EQ(named, std::vector<bool>(3, true));
}

TEST(LayerErrorsTest, ABackwardFailureNamesTheLayer) {
  const ModelConfig config = ThreeLayers();
  const Tensor ids = MakeIds({1, 4}, {1, 2, 3, 4});
  const Tensor targets = MakeIds({1, 4}, {2, 3, 4, 5});
  FailingAllReduce counting(-1);
  ModelOptions options = {.micro_batch = 1, .seq_len = 4, .tensor_parallel = &counting};
  int forward_calls = 0, step_calls = 0;
  {
    auto model = NormFormerModel::Create(config, options);
    NF_ASSERT_OK(model);
    NF_ASSERT_OK((*model)->Forward(ids, targets, 0, true));
    forward_calls = counting.calls();
    NF_ASSERT_OK((*model)->Backward(1.0f));
    step_calls = counting.calls();
  }
  std::vector<bool> named(3, false);
  for (int fail_at = forward_calls; fail_at < step_calls; ++fail_at) {
    FailingAllReduce failing(fail_at);
    options.tensor_parallel = &failing;
    auto model = NormFormerModel::Create(config, options);
    NF_ASSERT_OK(model);
    NF_ASSERT_OK((*model)->Forward(ids, targets, 0, true));
    const absl::Status status = (*model)->Backward(1.0f);
    ASSERT_FALSE(status.ok()) << "all-reduce " << fail_at;
    for (int l = 0; l < 3; ++l) {
      if (status.message().find("decoder layer " + std::to_string(l) + " backward: ") == 0) {
        named[l] = true;
      }
    }
  }
  EXPECT_EQ(named, std::vector<bool>(3, true));
}

}  // namespace
}  // namespace nf::model
