// Spikes and skipped data in real runs (launcher/trainer.h, launcher/train_loop.h): a gradient
// spike injected into one step (NF_INJECT_GRAD_SPIKE, launcher/fault_injection.h) is recorded,
// skipped or rolled back as train.spike.action says; a rollback's replay equals, bit for bit, a
// run that skipped the same window from the start (train.skip_samples); a run that keeps
// spiking or rolling back stops with a message; the windows and the detector survive a resume.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/load.h"
#include "launcher/config.h"
#include "launcher/fault_injection.h"
#include "launcher/train_loop.h"
#include "launcher/trainer.h"
#include "test_util.h"
#include "tests/cli_util.h"
#include "tests/training_test_util.h"

namespace nf::launcher {
namespace {

using ::nf::testing::Bytes;
using ::nf::testing::Lines;
using ::nf::testing::MakeTrainer;
using ::nf::testing::ReadFile;
using ::nf::testing::TempDir;
using ::testing::HasSubstr;

// 2 layers, d_model 32, vocab 64, 8 samples of 16 tokens per step. The detector watches the
// gradient norm only, with a window of 4 and a limit of at least 26 x the median (spread floor
// 0.5 x the median, threshold 50): an injected spike multiplies the norm by 1000, while a small
// model's norm moves by far less from step to step.
TrainConfig SpikeConfigured(SpikeConfig::Action action, int64_t train_iters) {
  TrainConfig config = nf::testing::TwoLayerTrainConfig(train_iters);
  TrainOptions& train = *config.mutable_train();
  train.mutable_lr_schedule()->set_warmup_iters(2);
  SpikeConfig& spike = *train.mutable_spike();
  spike.set_action(action);
  spike.set_window(4);
  spike.set_warmup_steps(0);
  spike.set_loss_threshold(0);
  spike.set_grad_norm_threshold(50);
  spike.set_min_relative_spread(0.5f);
  config.mutable_checkpoint()->set_save_interval(4);
  config.mutable_checkpoint()->set_keep_last(10);
  NF_EXPECT_OK(ValidateTrainConfig(config));
  return config;
}

// NF_INJECT_GRAD_SPIKE=`steps` while in scope.
class InjectedSpikes {
 public:
  explicit InjectedSpikes(const std::string& steps) {
    setenv("NF_INJECT_GRAD_SPIKE", steps.c_str(), 1);
  }
  ~InjectedSpikes() { unsetenv("NF_INJECT_GRAD_SPIKE"); }
};

// The records of RUN/log.jsonl whose text contains `part`.
std::vector<std::string> Records(const std::filesystem::path& run, const std::string& part) {
  std::vector<std::string> found;
  for (const std::string& line : Lines(ReadFile(run / "log.jsonl"))) {
    if (line.find(part) != std::string::npos) found.push_back(line);
  }
  return found;
}

// `record` without its "seconds" member and what follows (wall time).
std::string WithoutSeconds(const std::string& record) {
  return record.substr(0, record.find(",\"seconds\":"));
}

SampleWindow Window(int64_t begin, int64_t end) {
  SampleWindow w;
  w.set_begin(begin);
  w.set_end(end);
  return w;
}

TEST(SpikeTest, RecordKeepsTheUpdateAndLogsTheSpike) {
  const TempDir run("record");
  std::ostringstream console;
  {
    const InjectedSpikes spikes("6");
    NF_ASSERT_OK(
        RunTraining(SpikeConfigured(SpikeConfig::RECORD, 8), run.path().string(), console));
  }
  const std::vector<std::string> events = Records(run.path(), "\"event\":\"spike\"");
  ASSERT_EQ(events.size(), 1u) << ReadFile(run.path() / "log.jsonl");
  EXPECT_THAT(events[0], HasSubstr("\"step\":6,\"metric\":\"grad_norm\""));
  EXPECT_THAT(events[0], HasSubstr("\"action\":\"record\""));
  EXPECT_THAT(console.str(), HasSubstr("spike at step 6: grad_norm"));
  EXPECT_THAT(Records(run.path(), "\"step\":6,\"loss\"")[0], HasSubstr("\"skipped\":false"));
}

TEST(SpikeTest, SkipAppliesNoUpdateAndTrainingGoesOn) {
  const InjectedSpikes spikes("6");
  std::unique_ptr<Trainer> trainer = MakeTrainer(SpikeConfigured(SpikeConfig::SKIP, 8));
  const Tensor& params = trainer->chunks().front()->params().params();
  for (int step = 1; step <= 5; ++step) {
    const absl::StatusOr<StepStats> stats = trainer->TrainStep();
    NF_ASSERT_OK(stats);
    EXPECT_FALSE(stats->spike) << "step " << step << ": a quiet step";
  }
  const std::vector<uint8_t> before = Bytes(params);
  const std::vector<double> window = trainer->Progress().spike_grad_norms;
  const absl::StatusOr<StepStats> spiked = trainer->TrainStep();
  NF_ASSERT_OK(spiked);
  ASSERT_TRUE(spiked->spike);
  EXPECT_EQ(spiked->spike->metric, "grad_norm");
  EXPECT_GT(spiked->spike->value, spiked->spike->limit);
  EXPECT_TRUE(spiked->skipped);
  EXPECT_EQ(spiked->skip_reason, optim::SkipReason::kSpike);
  EXPECT_TRUE(Bytes(params) == before) << "a skipped spike changes no parameter";
  EXPECT_EQ(trainer->optimizer(0).adamw().updates(), 5);
  EXPECT_EQ(trainer->Progress().spike_grad_norms, window) << "the spike is not recorded";
  const absl::StatusOr<StepStats> next = trainer->TrainStep();
  NF_ASSERT_OK(next);
  EXPECT_FALSE(next->skipped);
  EXPECT_FALSE(next->spike);
}

TEST(SpikeTest, SkipSamplesSkipsEveryStepWhoseBatchOverlapsAWindow) {
  TrainConfig config = SpikeConfigured(SpikeConfig::RECORD, 6);
  // Samples [17, 25): the batches of step 3 ([16, 24)) and step 4 ([24, 32)).
  *config.mutable_train()->add_skip_samples() = Window(17, 25);
  std::unique_ptr<Trainer> trainer = MakeTrainer(config);
  const Tensor& params = trainer->chunks().front()->params().params();
  for (int step = 1; step <= 6; ++step) {
    const std::vector<uint8_t> before = Bytes(params);
    const absl::StatusOr<StepStats> stats = trainer->TrainStep();
    NF_ASSERT_OK(stats);
    const bool skipped = step == 3 || step == 4;
    EXPECT_EQ(stats->skipped, skipped) << "step " << step;
    EXPECT_EQ(stats->skip_reason,
              skipped ? optim::SkipReason::kSkippedData : optim::SkipReason::kNone);
    EXPECT_EQ(stats->tokens, skipped ? 0 : 8 * 16);
    EXPECT_EQ(Bytes(params) == before, skipped);
    EXPECT_EQ(trainer->consumed_samples(), 8 * step) << "a skipped step still moves on";
  }
  EXPECT_EQ(trainer->optimizer(0).adamw().updates(), 4);
  ASSERT_EQ(trainer->Progress().skipped_samples.size(), 1u);
}

TEST(SpikeTest, ARollbackReplaysExactlyAsARunThatSkippedTheWindowFromTheStart) {
  const TempDir rolled("rolled"), skipping("skipping");
  std::ostringstream console;
  {
    // Checkpoints at steps 4 and 8; the spike at step 7 rolls back to step 4 and skips the
    // samples of steps 5-7: [32, 56).
    const InjectedSpikes spikes("7");
    NF_ASSERT_OK(
        RunTraining(SpikeConfigured(SpikeConfig::ROLLBACK, 12), rolled.path().string(), console));
  }
  EXPECT_THAT(console.str(), HasSubstr("rolled back to "));
  EXPECT_THAT(console.str(), HasSubstr("(step 4) after the spike at step 7: samples [32, 56)"));
  const std::vector<std::string> rollbacks = Records(rolled.path(), "\"event\":\"rollback\"");
  ASSERT_EQ(rollbacks.size(), 1u);
  EXPECT_THAT(rollbacks[0],
              HasSubstr("\"to_step\":4,\"skipped_window\":{\"begin\":32,\"end\":56}"));
  EXPECT_EQ(Records(rolled.path(), "\"skip_reason\":\"skipped_data\"").size(), 3u);

  TrainConfig config = SpikeConfigured(SpikeConfig::ROLLBACK, 12);
  *config.mutable_train()->add_skip_samples() = Window(32, 56);
  NF_ASSERT_OK(RunTraining(config, skipping.path().string(), console));

  // Steps 8-12 of both runs, record for record (loss, lr, grad norm ... but wall time).
  auto tail = [](const std::filesystem::path& run) {
    std::vector<std::string> records = Records(run, "\"loss\"");
    records.erase(records.begin(), records.end() - 5);
    for (std::string& r : records) r = WithoutSeconds(r);
    return records;
  };
  const std::vector<std::string> replayed = tail(rolled.path()),
                                 uninterrupted = tail(skipping.path());
  EXPECT_THAT(replayed.front(), HasSubstr("\"step\":8,"));
  EXPECT_EQ(replayed, uninterrupted);
  // And the final checkpoints' parameters and optimizer state, byte for byte.
  const std::filesystem::path shard = "checkpoints/iter_0000012/rank_00000.shard";
  EXPECT_TRUE(ReadFile(rolled.path() / shard) == ReadFile(skipping.path() / shard));
  const absl::StatusOr<checkpoint::Manifest> manifest =
      checkpoint::ReadManifest(rolled.path() / "checkpoints/iter_0000012");
  NF_ASSERT_OK(manifest);
  EXPECT_EQ(manifest->rollbacks(), 1);
  ASSERT_EQ(manifest->skipped_samples_size(), 1);
  EXPECT_EQ(manifest->skipped_samples(0).begin(), 32);
  EXPECT_EQ(manifest->skipped_samples(0).end(), 56);
  EXPECT_EQ(manifest->spike_history().grad_norm_size(), 4);
}

TEST(SpikeTest, ARunThatKeepsRollingBackStops) {
  const TempDir run("rollbacks");
  TrainConfig config = SpikeConfigured(SpikeConfig::ROLLBACK, 12);
  config.mutable_train()->mutable_spike()->set_max_rollbacks(1);
  std::ostringstream console;
  const InjectedSpikes spikes("6,10");
  const absl::StatusOr<RunEnd> end = RunTraining(config, run.path().string(), console);
  EXPECT_EQ(end.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(end.status().message(),
              HasSubstr("a spike at step 10 after 1 rollbacks (train.spike.max_rollbacks 1): "
                        "stopping; the last good checkpoint is "));
  EXPECT_THAT(end.status().message(), HasSubstr("iter_0000008"));
}

TEST(SpikeTest, SpikesInARowStopASkippingRun) {
  const TempDir run("in_a_row");
  TrainConfig config = SpikeConfigured(SpikeConfig::SKIP, 12);
  config.mutable_train()->mutable_spike()->set_max_consecutive(2);
  std::ostringstream console;
  const InjectedSpikes spikes("6,7");
  const absl::StatusOr<RunEnd> end = RunTraining(config, run.path().string(), console);
  EXPECT_EQ(end.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(end.status().message(), HasSubstr("2 spikes in a row up to step 7"));
}

TEST(SpikeTest, AResumedRunDecidesAsTheUninterruptedOne) {
  // The detector's window and the skipped windows are in the checkpoint: 8 steps, then 4 more
  // resumed, log the same records as 12 at once (a spike at step 10 included).
  const TempDir once("once"), twice("twice");
  std::ostringstream console;
  const InjectedSpikes spikes("10");
  TrainConfig config = SpikeConfigured(SpikeConfig::SKIP, 12);
  *config.mutable_train()->add_skip_samples() = Window(40, 48);
  NF_ASSERT_OK(RunTraining(config, once.path().string(), console));
  TrainConfig first = config;
  first.mutable_train()->set_exit_interval(8);
  ASSERT_EQ(*RunTraining(first, twice.path().string(), console), RunEnd::kStoppedToResume);
  NF_ASSERT_OK(RunTraining(config, twice.path().string(), console));
  std::vector<std::string> a = Lines(ReadFile(once.path() / "log.jsonl")),
                           b = Lines(ReadFile(twice.path() / "log.jsonl"));
  for (std::string& r : a) r = WithoutSeconds(r);
  for (std::string& r : b) r = WithoutSeconds(r);
  EXPECT_EQ(a, b);
  EXPECT_EQ(Records(once.path(), "\"skip_reason\":\"spike\"").size(), 1u);
}

TEST(SpikeTest, AMalformedInjectionIsRefused) {
  const InjectedSpikes spikes("7,x");
  EXPECT_THAT(InjectedGradSpikeSteps().status().message(),
              HasSubstr("NF_INJECT_GRAD_SPIKE='7,x' must be a comma-separated list"));
}

}  // namespace
}  // namespace nf::launcher
