// Tests of launcher/spike_detector.h (the median/MAD rule, warm-up, the spread's floor, what
// enters the window, the saved state) and launcher/skipped_samples.h (merging and overlap).
#include "launcher/spike_detector.h"

#include <cmath>
#include <limits>
#include <vector>

#include "launcher/skipped_samples.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using ::testing::HasSubstr;

SpikeConfig Config(int window, float threshold, int64_t warmup = 0, float floor = 0.0f) {
  SpikeConfig config;
  config.set_window(window);
  config.set_loss_threshold(threshold);
  config.set_grad_norm_threshold(threshold);
  config.set_warmup_steps(warmup);
  config.set_min_relative_spread(floor);
  return config;
}

// Losses 3.0, 3.1, 2.9, 3.0, 3.2, 2.8, ... (median 3.0, MAD 0.1) and grad norms 1.0 +- 0.05.
SpikeDetector Filled(const SpikeConfig& config, int values) {
  SpikeDetector detector(config);
  const double pattern[] = {0.0, 0.1, -0.1, 0.0, 0.2, -0.2};
  for (int i = 0; i < values; ++i) {
    detector.Record(3.0 + pattern[i % 6], 1.0 + pattern[i % 6] / 2);
  }
  return detector;
}

TEST(SpikeDetectorTest, FlagsAValueBeyondTheMedianByThresholdRobustDeviations) {
  const SpikeDetector detector = Filled(Config(12, 6), 12);
  // Median 3.0; |deviations| 0, .1, .1, 0, .2, .2 twice: MAD 0.1, spread 0.14826.
  const double limit = 3.0 + 6 * 1.4826 * 0.1;
  EXPECT_FALSE(detector.Check(100, limit - 1e-9, 1.0));
  const std::optional<Spike> spike = detector.Check(100, limit + 1e-9, 1.0);
  ASSERT_TRUE(spike);
  EXPECT_EQ(spike->metric, "loss");
  EXPECT_NEAR(spike->median, 3.0, 1e-12);
  EXPECT_NEAR(spike->limit, limit, 1e-12);
  EXPECT_DOUBLE_EQ(spike->value, limit + 1e-9);
  const std::optional<Spike> norm = detector.Check(100, 3.0, 5.0);
  ASSERT_TRUE(norm);
  EXPECT_EQ(norm->metric, "grad_norm");
}

TEST(SpikeDetectorTest, OnlyUpwardDeviationsAreSpikes) {
  const SpikeDetector detector = Filled(Config(12, 6), 12);
  EXPECT_FALSE(detector.Check(100, 0.01, 0.001)) << "a loss falling fast is good news";
}

TEST(SpikeDetectorTest, NothingIsFlaggedBeforeWarmUpOrAHalfFullWindow) {
  const SpikeConfig config = Config(12, 6, /*warmup=*/50);
  EXPECT_FALSE(Filled(config, 12).Check(49, 100.0, 100.0)) << "step 49 is still warming up";
  EXPECT_TRUE(Filled(config, 12).Check(50, 100.0, 100.0));
  EXPECT_FALSE(Filled(config, 5).Check(50, 100.0, 100.0)) << "5 values of a window of 12";
  EXPECT_TRUE(Filled(config, 6).Check(50, 100.0, 100.0));
}

TEST(SpikeDetectorTest, TheSpreadHasAFloorRelativeToTheMedian) {
  // Every loss 2.0: the MAD is 0, and without a floor any rise would be a spike.
  SpikeConfig config = Config(8, 6, 0, /*floor=*/0.01f);
  SpikeDetector detector(config);
  for (int i = 0; i < 8; ++i) detector.Record(2.0, 1.0);
  const double limit = 2.0 + 6 * (double{0.01f} * 2.0);  // the config holds a float
  EXPECT_FALSE(detector.Check(10, limit - 1e-9, 1.0));
  EXPECT_TRUE(detector.Check(10, limit + 1e-9, 1.0));
}

TEST(SpikeDetectorTest, SpikesInTheWindowDoNotMoveTheLimit) {
  // Three huge values among twelve (the RECORD action keeps applied spikes): the median and MAD
  // hardly move, unlike a mean and standard deviation.
  SpikeDetector detector = Filled(Config(12, 6), 9);
  for (int i = 0; i < 3; ++i) detector.Record(1000.0, 1.0);
  const std::optional<Spike> spike = detector.Check(100, 4.5, 1.0);
  ASSERT_TRUE(spike);
  EXPECT_LT(spike->limit, 4.5);
}

TEST(SpikeDetectorTest, AZeroThresholdTurnsAMetricOff) {
  SpikeConfig config = Config(12, 6);
  config.set_loss_threshold(0);
  const SpikeDetector detector = Filled(config, 12);
  EXPECT_FALSE(detector.Check(100, 1e9, 1.0));
  EXPECT_TRUE(detector.Check(100, 1e9, 1e9));
}

TEST(SpikeDetectorTest, NonFiniteValuesAreNeitherFlaggedNorRecorded) {
  SpikeDetector detector = Filled(Config(12, 6), 12);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(detector.Check(100, nan, std::numeric_limits<double>::infinity()));
  detector.Record(nan, nan);
  EXPECT_EQ(detector.losses().size(), 12u);
}

TEST(SpikeDetectorTest, TheWindowKeepsTheNewestValuesAndRestores) {
  SpikeDetector detector(Config(4, 6));
  for (int i = 1; i <= 6; ++i) detector.Record(i, 10.0 * i);
  EXPECT_EQ(detector.losses(), (std::vector<double>{3, 4, 5, 6}));
  EXPECT_EQ(detector.grad_norms(), (std::vector<double>{30, 40, 50, 60}));
  SpikeDetector restored(Config(3, 6));
  restored.Restore(detector.losses(), detector.grad_norms());
  EXPECT_EQ(restored.losses(), (std::vector<double>{4, 5, 6}))
      << "a smaller window keeps the newest";
}

SampleWindow Window(int64_t begin, int64_t end) {
  SampleWindow w;
  w.set_begin(begin);
  w.set_end(end);
  return w;
}

TEST(SkippedSamplesTest, WindowsMergeWhenTheyOverlapOrTouch) {
  const std::vector<SampleWindow> merged = MergeWindows(
      {Window(50, 60), Window(0, 10)}, {Window(10, 20), Window(55, 70), Window(80, 90)});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].begin(), 0);
  EXPECT_EQ(merged[0].end(), 20);
  EXPECT_EQ(merged[1].begin(), 50);
  EXPECT_EQ(merged[1].end(), 70);
  EXPECT_EQ(merged[2].begin(), 80);
}

TEST(SkippedSamplesTest, ABatchOverlappingAWindowFindsIt) {
  const std::vector<SampleWindow> windows = {Window(16, 25)};
  EXPECT_EQ(OverlappingWindow(windows, 8, 16), nullptr) << "[8, 16) ends where it begins";
  EXPECT_NE(OverlappingWindow(windows, 16, 24), nullptr);
  EXPECT_NE(OverlappingWindow(windows, 24, 32), nullptr) << "sample 24 is in the window";
  EXPECT_EQ(OverlappingWindow(windows, 25, 33), nullptr);
}

TEST(SkippedSamplesTest, AnEmptyOrNegativeWindowIsRefused) {
  EXPECT_THAT(ValidateWindow(Window(5, 5), "train.skip_samples").message(),
              HasSubstr("train.skip_samples {begin: 5 end: 5}"));
  EXPECT_FALSE(ValidateWindow(Window(-1, 5), "train.skip_samples").ok());
  NF_EXPECT_OK(ValidateWindow(Window(0, 1), "train.skip_samples"));
}

}  // namespace
}  // namespace nf::launcher
