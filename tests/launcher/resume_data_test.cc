// A resumed run reads the data stream from the checkpoint's consumed-sample count on: with
// another global batch size it continues the same samples (none skipped, none repeated), and a
// config whose steps cannot continue the stream exactly is refused, not silently reshuffled.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "data/indexed_dataset.h"
#include "data/synthetic_corpus.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/batch_source.h"
#include "tests/assert_ok.h"
#include "training_test_util.h"

namespace nf::launcher {
namespace {

namespace fs = std::filesystem;
using checkpoint::TempDir;
using ::nf::testing::Bytes;
using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;

// The inputs of micro-batch `micro_batch` of the global batch at stream sample `batch_start`,
// read by a source of its own (a stream of `stream_size` samples; 0: the config's default).
std::vector<uint8_t> Inputs(const TrainConfig& config, int64_t batch_start, int64_t micro_batch,
                            int64_t stream_size = 0) {
  auto source = MakeBatchSource(config, DataSplit::kTrain, stream_size);
  NF_EXPECT_OK(source);
  NF_EXPECT_OK((*source)->Load(batch_start, micro_batch));
  return Bytes((*source)->inputs());
}

// Trains `steps` steps of `config` and saves; returns the checkpoint's directory.
fs::path TrainAndSave(const TrainConfig& config, const TempDir& dir, int steps) {
  auto trainer = MakeTrainer(config);
  TrainSteps(*trainer, steps);
  NF_EXPECT_OK(checkpoint::Save(*trainer, dir.path()));
  return dir.path() / checkpoint::IterationDirName(steps);
}

TEST(ResumeDataTest, AnotherGlobalBatchSizeContinuesTheSyntheticStream) {
  const TrainConfig config = checkpoint::TinyConfig(TrainOptions::FP32);  // G 4, m 2
  TempDir dir;
  const fs::path saved = TrainAndSave(config, dir, 3);  // samples [0, 12) read
  for (const int global_batch : {8, 2}) {
    SCOPED_TRACE(global_batch);
    TrainConfig resumed = config;
    resumed.mutable_train()->set_global_batch_size(global_batch);
    auto trainer = MakeTrainer(resumed);
    NF_ASSERT_OK(checkpoint::Load(*trainer, saved));
    EXPECT_EQ(trainer->consumed_samples(), 12);
    TrainSteps(*trainer, 1);
    EXPECT_EQ(trainer->consumed_samples(), 12 + global_batch);
    // The step's last micro-batch (of G / 2) holds samples 12 + G - 2, 12 + G - 1.
    EXPECT_EQ(Bytes(trainer->batches().inputs()), Inputs(resumed, 12, global_batch / 2 - 1));
  }
}

class ResumeDatasetTest : public ::testing::Test {
 protected:
  // 50 documents of 30 to 49 tokens of a Markov chain over the tiny model's 40 tokens: 1,975
  // tokens, one epoch of 123 samples of 16 + 1 tokens.
  void SetUp() override {
    const std::string prefix = (dir_.path() / "chain").string();
    auto writer = data::IndexedDatasetWriter::Create(prefix, data::TokenDType::kU16);
    NF_ASSERT_OK(writer);
    auto chain = data::SyntheticCorpus::Create(40, 2, 11);
    NF_ASSERT_OK(chain);
    for (int d = 0; d < 50; ++d) {
      std::vector<int32_t> tokens(30 + d % 20);
      chain->Sample(d, static_cast<int64_t>(tokens.size()), tokens.data());
      NF_ASSERT_OK(writer->AddDocument(tokens));
    }
    NF_ASSERT_OK(writer->Finish());
    config_ = checkpoint::TinyConfig(TrainOptions::FP32);
    config_.mutable_model()->set_max_seq_len(16);
    config_.mutable_train()->set_seq_len(16);
    config_.mutable_train()->set_global_batch_size(8);
    config_.mutable_train()->set_train_iters(10);  // a stream of 80 samples
    config_.mutable_data()->set_path(prefix);
    config_.mutable_data()->set_split("100,0,0");
  }

  TempDir dir_;
  TrainConfig config_;
};

TEST_F(ResumeDatasetTest, AnotherGlobalBatchSizeReadsOnInTheRunsOwnStream) {
  const fs::path saved = TrainAndSave(config_, dir_, 3);  // samples [0, 24) of 80
  TrainConfig resumed = config_;
  resumed.mutable_train()->set_global_batch_size(4);  // its own default stream: 40 samples
  auto trainer = MakeTrainer(resumed);
  NF_ASSERT_OK(checkpoint::Load(*trainer, saved));
  TrainSteps(*trainer, 1);
  EXPECT_EQ(trainer->consumed_samples(), 28);
  EXPECT_EQ(Bytes(trainer->batches().inputs()), Inputs(resumed, 24, 1, 80));
}

TEST_F(ResumeDatasetTest, ALongerRunContinuesTheStreamWhileItsShuffleStaysTheSame) {
  const fs::path saved = TrainAndSave(config_, dir_, 3);
  TrainConfig longer = config_;
  longer.mutable_train()->set_train_iters(12);  // 96 samples: still within the first epoch
  auto trainer = MakeTrainer(longer);
  NF_ASSERT_OK(checkpoint::Load(*trainer, saved));
  TrainSteps(*trainer, 1);
  EXPECT_EQ(Bytes(trainer->batches().inputs()), Inputs(config_, 24, 3, 80));  // of 4
}

TEST_F(ResumeDatasetTest, ALongerRunThatWouldReshuffleIsRefused) {
  const fs::path saved = TrainAndSave(config_, dir_, 3);
  TrainConfig longer = config_;
  longer.mutable_train()->set_train_iters(100);  // 800 samples: 7 epochs, another shuffle
  auto trainer = MakeTrainer(longer);
  const absl::Status status = checkpoint::Load(*trainer, saved);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("set train.train_iters to at most 10"));
}

}  // namespace
}  // namespace nf::launcher
