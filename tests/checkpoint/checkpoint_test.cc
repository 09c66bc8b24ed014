// Checkpoints on one process: the CRC-32C and shard mapping they rest on, the files a save
// writes, bit-exact resume, and every kind of bad checkpoint refused with a one-line error
// that names the problem, without changing anything on disk.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/convert.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "checkpoint/shard_mapping.h"
#include "core/files/atomic_file.h"
#include "gtest/gtest.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "parallel/local_communicator.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using launcher::TrainConfig;
using launcher::Trainer;
using ::nf::testing::Bytes;
using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;

TEST(Crc32cTest, MatchesTheKnownAnswerAndContinues) {
  // The CRC-32C check value (RFC 3720, iSCSI): "123456789" -> 0xE3069283.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
  // The hardware and table paths agree on every length and alignment.
  std::string noise(300, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 2654435761u) >> 13);
  for (size_t start = 0; start < 9; ++start) {
    for (size_t length = 0; start + length <= noise.size(); length += 7) {
      EXPECT_EQ(Crc32c(noise.data() + start, length), Crc32cPortable(noise.data() + start, length))
          << start << " " << length;
    }
  }
  // RFC 3720 B.4's vectors: 32 bytes of zeros, of ones, ascending and descending.
  std::string zeros(32, '\0'), ones(32, '\xFF'), ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32cPortable(descending.data(), 32), 0x113FDB5Cu);
  // Buffers long enough for the hardware path's three interleaved streams (6 KiB blocks),
  // ending on and around block boundaries, continued from a nonzero CRC.
  std::string long_noise(40000, '\0');
  for (size_t i = 0; i < long_noise.size(); ++i) {
    long_noise[i] = static_cast<char>((i * 2654435761u) >> 17);
  }
  for (size_t length : {6143, 6144, 6145, 12288, 12295, 20000, 39999, 40000}) {
    EXPECT_EQ(Crc32c(long_noise.data(), length), Crc32cPortable(long_noise.data(), length))
        << length;
    EXPECT_EQ(Crc32c(long_noise.data() + 1, length - 1, 0x12345678u),
              Crc32cPortable(long_noise.data() + 1, length - 1, 0x12345678u))
        << length;
  }
  const std::string text = "the quick brown fox jumps over the lazy dog, twice over";
  for (size_t split = 0; split <= text.size(); ++split) {
    EXPECT_EQ(Crc32c(text.data() + split, text.size() - split, Crc32c(text.data(), split)),
              Crc32c(text.data(), text.size()));
  }
}

TEST(ShardMappingTest, ColumnShardsMapToOneRunPerRow) {
  // Global [3, 4] split over 2 ranks by columns: rank 1 holds columns 2 and 3 of each row.
  std::vector<std::vector<int64_t>> runs;
  ForEachGlobalRun({3, 4}, {.sharding = model::Sharding::kSplitCols, .tp_rank = 1, .tp_size = 2}, 1,
                   6, [&](int64_t local, int64_t global, int64_t count) {
                     runs.push_back({local, global, count});
                   });
  // Local elements 1..5: (0,1) | (1,0) (1,1) | (2,0) (2,1).
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{1, 3, 1}, {2, 6, 2}, {4, 10, 2}}));
  runs.clear();
  ForEachGlobalRun({6, 2}, {.sharding = model::Sharding::kSplitRows, .tp_rank = 2, .tp_size = 3}, 0,
                   4, [&](int64_t local, int64_t global, int64_t count) {
                     runs.push_back({local, global, count});
                   });
  EXPECT_EQ(runs, (std::vector<std::vector<int64_t>>{{0, 8, 4}}));
}

class ResumeTest : public ::testing::TestWithParam<launcher::TrainOptions::Precision> {};
INSTANTIATE_TEST_SUITE_P(Precisions, ResumeTest,
                         ::testing::Values(launcher::TrainOptions::FP32,
                                           launcher::TrainOptions::FP16,
                                           launcher::TrainOptions::BF16));

// A run stopped after 3 steps and resumed from its checkpoint equals the uninterrupted run bit
// for bit: every loss and every byte of parameters, master weights and moments.
TEST_P(ResumeTest, ResumedRunEqualsTheUninterruptedOneBitForBit) {
  const TrainConfig config = TinyConfig(GetParam());
  TempDir dir;
  auto whole = MakeTrainer(config);
  const std::vector<double> expected = TrainSteps(*whole, 6);

  auto first = MakeTrainer(config);
  TrainSteps(*first, 3);
  NF_ASSERT_OK(Save(*first, dir.path()));
  const fs::path saved = dir.path() / "iter_0000003";
  EXPECT_TRUE(fs::exists(saved / kManifestName));
  EXPECT_TRUE(fs::exists(saved / "rank_00000.shard"));
  EXPECT_EQ(*LatestCheckpoint(dir.path()), saved);

  auto resumed = MakeTrainer(config);
  NF_ASSERT_OK(Load(*resumed, saved));
  EXPECT_EQ(resumed->step(), 3);
  const std::vector<double> continued = TrainSteps(*resumed, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(continued[i], expected[3 + i]) << "step " << 4 + i;
  optim::MixedPrecisionAdamW& a = whole->optimizer(0).adamw();
  optim::MixedPrecisionAdamW& b = resumed->optimizer(0).adamw();
  EXPECT_EQ(Bytes(whole->chunks().front()->params().params()),
            Bytes(resumed->chunks().front()->params().params()));
  EXPECT_EQ(Bytes(a.master()), Bytes(b.master()));
  EXPECT_EQ(Bytes(a.exp_avg()), Bytes(b.exp_avg()));
  EXPECT_EQ(Bytes(a.exp_avg_sq()), Bytes(b.exp_avg_sq()));
  EXPECT_EQ(a.updates(), b.updates());
  if (whole->loss_scaler() != nullptr) {
    EXPECT_EQ(whole->loss_scaler()->state(), resumed->loss_scaler()->state());
  }
}

// An async save holds the state of the step it was started at, even though training moves the
// parameters while it is written, and commits at Poll or Finish; a second Start finishes the
// first save.
TEST(AsyncCheckpointerTest, SavesTheSnapshotWhileTrainingGoesOn) {
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP16);
  auto whole = MakeTrainer(config);
  const std::vector<double> expected = TrainSteps(*whole, 6);

  parallel::LocalCommunicator world;
  // Without a reserved buffer, and with one (as nf-launch reserves it): the first save copies
  // into it.
  for (const bool reserve : {false, true}) {
    SCOPED_TRACE(reserve ? "reserved" : "not reserved");
    TempDir dir;
    std::vector<std::string> committed;
    {
      AsyncCheckpointer saver(
          dir.path(), {.keep_last = 5, .keep_every = 0},
          [&](const fs::path& p) { committed.push_back(p.filename().string()); });
      auto trainer = MakeTrainer(config);
      if (reserve) saver.Reserve(trainer->CheckpointState());
      TrainSteps(*trainer, 2);
      NF_ASSERT_OK(saver.Start(trainer->CheckpointState(), trainer->Progress(), world));
      TrainSteps(*trainer, 1);  // moves every parameter while step 2's snapshot is written
      NF_ASSERT_OK(saver.Start(trainer->CheckpointState(), trainer->Progress(), world));
      EXPECT_EQ(committed, std::vector<std::string>{"iter_0000002"});  // finished by Start
      TrainSteps(*trainer, 2);
      while (saver.pending()) NF_ASSERT_OK(saver.Poll(world));
      NF_ASSERT_OK(saver.Finish(world));
    }
    EXPECT_EQ(committed, (std::vector<std::string>{"iter_0000002", "iter_0000003"}));
    EXPECT_EQ(*LatestCheckpoint(dir.path()), dir.path() / "iter_0000003");
    for (const char* name : {"iter_0000002", "iter_0000003"}) {
      auto resumed = MakeTrainer(config);
      NF_ASSERT_OK(Load(*resumed, dir.path() / name));
      const int64_t from = resumed->step();
      const std::vector<double> continued = TrainSteps(*resumed, static_cast<int>(6 - from));
      for (size_t i = 0; i < continued.size(); ++i) {
        EXPECT_EQ(continued[i], expected[from + i]) << name << " step " << from + i + 1;
      }
    }
  }
}

// A checkpointer that reserved a buffer and never saved goes away quietly, leaving nothing.
TEST(AsyncCheckpointerTest, AReservationWithoutASaveLeavesNothing) {
  TempDir dir;
  auto trainer = MakeTrainer(TinyConfig(launcher::TrainOptions::FP32));
  {
    AsyncCheckpointer saver(dir.path() / "checkpoints", {.keep_last = 5, .keep_every = 0});
    saver.Reserve(trainer->CheckpointState());
    TrainSteps(*trainer, 1);
  }
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoints"));
}

// A save still in flight when the checkpointer goes away (a run ending in an error on this rank)
// is discarded whole: no staging directory is left, and `latest` still names the last commit.
TEST(AsyncCheckpointerTest, ASaveNotFinishedIsDiscardedWithoutATrace) {
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  TempDir dir;
  auto trainer = MakeTrainer(config);
  parallel::LocalCommunicator world;
  {
    AsyncCheckpointer saver(dir.path(), {.keep_last = 5, .keep_every = 0});
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(saver.Start(trainer->CheckpointState(), trainer->Progress(), world));
    NF_ASSERT_OK(saver.Finish(world));
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(saver.Start(trainer->CheckpointState(), trainer->Progress(), world));
    EXPECT_TRUE(fs::exists(dir.path() / "iter_0000002.tmp"));
  }
  const std::vector<std::string> names = SortedNames(dir.path());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000001", "latest"}));
  EXPECT_EQ(*LatestCheckpoint(dir.path()), dir.path() / "iter_0000001");
}

// The state an async save copies beside the next step stays unchanged until the copy is done:
// the step's optimizer update waits for every state reader (here one that finishes 200 ms
// later), and the step then goes on as usual.
TEST(AsyncCheckpointerTest, TheNextUpdateWaitsForTheSnapshotCopy) {
  auto trainer = MakeTrainer(TinyConfig(launcher::TrainOptions::FP32));
  const std::vector<float> before = *ToFloatVector(trainer->chunks().front()->params().params());
  std::promise<void> copied;
  trainer->optimizer(0).AddStateReader(copied.get_future().share());
  std::future<absl::StatusOr<launcher::StepStats>> step =
      std::async(std::launch::async, [&] { return trainer->TrainStep(); });
  EXPECT_EQ(step.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_EQ(*ToFloatVector(trainer->chunks().front()->params().params()), before);
  copied.set_value();
  NF_ASSERT_OK(step.get().status());
  EXPECT_NE(*ToFloatVector(trainer->chunks().front()->params().params()), before);
  EXPECT_GT(trainer->optimizer(0).state_reader_wait_seconds(), 0.0);
}

// Converting to another layout and back reproduces the original shard byte for byte, and the
// converted checkpoint (8 shard files, ZeRO-1 slices) loads into one process bit-exactly.
TEST(ConvertTest, RoundTripsThroughAnotherLayoutAndLoads) {
  const TrainConfig config = TinyConfig(launcher::TrainOptions::BF16);
  TempDir dir;
  auto trainer = MakeTrainer(config);
  TrainSteps(*trainer, 2);
  // The conversions go beside the run's checkpoints/ (nothing may be written inside it).
  NF_ASSERT_OK(Save(*trainer, dir.path() / "checkpoints"));
  const fs::path saved = dir.path() / "checkpoints" / "iter_0000002";
  const Manifest manifest = *ReadManifest(saved);
  const fs::path wide = dir.path() / "wide", back = dir.path() / "back";
  NF_ASSERT_OK(ConvertCheckpoint(saved, manifest,
                                 {.tensor_parallel = 2,
                                  .pipeline_parallel = 2,
                                  .data_parallel = 2,
                                  .virtual_stages = 1,
                                  .distributed_optimizer = true,
                                  .grad_bucket_elements = 300},
                                 wide));
  const Manifest wide_manifest = *ReadManifest(wide);
  EXPECT_EQ(wide_manifest.files_size(), 8);
  EXPECT_EQ(wide_manifest.layout().tensor_parallel(), 2);
  NF_ASSERT_OK(ConvertCheckpoint(wide, wide_manifest, {}, back));
  EXPECT_EQ(*ReadWholeFile(back / "rank_00000.shard"), *ReadWholeFile(saved / "rank_00000.shard"));

  auto loaded = MakeTrainer(config);
  NF_ASSERT_OK(Load(*loaded, wide));
  optim::MixedPrecisionAdamW& a = trainer->optimizer(0).adamw();
  optim::MixedPrecisionAdamW& b = loaded->optimizer(0).adamw();
  EXPECT_EQ(Bytes(trainer->chunks().front()->params().params()),
            Bytes(loaded->chunks().front()->params().params()));
  EXPECT_EQ(Bytes(a.master()), Bytes(b.master()));
  EXPECT_EQ(Bytes(a.exp_avg_sq()), Bytes(b.exp_avg_sq()));

  const absl::Status exists = ConvertCheckpoint(saved, manifest, {}, wide);
  // An existing checkpoint as --out is refused as one: nothing is ever written inside it.
  EXPECT_NE(exists.message().find(absl::StrCat("is inside checkpoint ", wide.string())),
            absl::string_view::npos)
      << exists;
  const absl::Status odd =
      ConvertCheckpoint(saved, manifest, {.tensor_parallel = 3}, dir.path() / "odd");
  EXPECT_NE(odd.message().find("is not divisible by tensor_parallel (3)"), absl::string_view::npos)
      << odd;
  EXPECT_FALSE(fs::exists(dir.path() / "odd"));
}

TEST(RetentionTest, KeepsTheNewestAndEveryMthForever) {
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  TempDir dir;
  auto trainer = MakeTrainer(config);
  for (int step = 1; step <= 7; ++step) {
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(Save(*trainer, dir.path(), {.keep_last = 2, .keep_every = 3}));
  }
  const std::vector<std::string> names = SortedNames(dir.path());
  EXPECT_EQ(names,
            (std::vector<std::string>{"iter_0000003", "iter_0000006", "iter_0000007", "latest"}));
}

TEST(RetentionTest, CountsOnlyDirectoriesWhoseManifestReads) {
  // An empty directory under a later checkpoint's name (a copy that never happened, a failed
  // rsync) is not a checkpoint: it must neither push a real one out of keep_last nor be removed.
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  TempDir dir;
  auto trainer = MakeTrainer(config);
  for (int step = 1; step <= 3; ++step) {
    TrainSteps(*trainer, 1);
    if (step == 3) fs::create_directory(dir.path() / "iter_0000009");
    NF_ASSERT_OK(Save(*trainer, dir.path(), {.keep_last = 2}));
  }
  const std::vector<std::string> names = SortedNames(dir.path());
  EXPECT_EQ(names,
            (std::vector<std::string>{"iter_0000002", "iter_0000003", "iter_0000009", "latest"}));
  EXPECT_EQ(CheckpointSteps(dir.path()), (std::vector<int64_t>{2, 3}));
}

// ---- Bad checkpoints -------------------------------------------------------------------------

// Every file under `dir` with its bytes: a failed load must leave all of it as it was.
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().string()] = *ReadWholeFile(entry.path());
  }
  return files;
}

class BadCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TinyConfig(launcher::TrainOptions::FP32);
    auto trainer = MakeTrainer(config_);
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(Save(*trainer, dir_.path()));
    saved_ = dir_.path() / "iter_0000001";
    shard_ = saved_ / "rank_00000.shard";
  }

  // Loads into a fresh trainer; expects a failure whose message is one line containing
  // `expected`, and no file changed by the attempt.
  void ExpectRefused(const TrainConfig& config, const std::string& expected) {
    const auto before = Snapshot(dir_.path());
    auto trainer = MakeTrainer(config);
    const absl::Status status = Load(*trainer, saved_);
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find(expected), absl::string_view::npos) << status;
    EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
    EXPECT_TRUE(Snapshot(dir_.path()) == before);
  }

  TrainConfig config_;
  TempDir dir_;
  fs::path saved_, shard_;
};

TEST_F(BadCheckpointTest, TruncatedShard) {
  fs::resize_file(shard_, fs::file_size(shard_) - 7);
  ExpectRefused(config_, "shard file rank_00000.shard has ");
  ExpectRefused(config_, "(truncated or replaced)");
}

TEST_F(BadCheckpointTest, FlippedByte) {
  std::fstream f(shard_, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(100);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(100);
  f.write(&c, 1);
  f.close();
  ExpectRefused(config_, "fails its checksum (the file is corrupt)");
}

TEST_F(BadCheckpointTest, MissingManifest) {
  fs::remove(saved_ / kManifestName);
  ExpectRefused(config_, "has no manifest.pb: it is incomplete or not a checkpoint");
}

TEST_F(BadCheckpointTest, AnotherModelsCheckpoint) {
  TrainConfig other = config_;
  other.mutable_model()->set_d_model(32);
  other.mutable_model()->mutable_normformer()->set_scale_fc(false);
  ExpectRefused(other,
                "was written for another model: model.d_model (checkpoint 16, run 32), "
                "model.normformer.scale_fc (checkpoint true, run false)");
}

TEST_F(BadCheckpointTest, WrongFormatVersion) {
  Manifest manifest = *ReadManifest(saved_);
  manifest.set_format_version(kFormatVersion + 1);
  NF_ASSERT_OK(ReplaceFileAtomically(saved_ / kManifestName, EncodeManifest(manifest)));
  ExpectRefused(config_, absl::StrCat("format version ", kFormatVersion + 1,
                                      "; this build reads version ", kFormatVersion));
}

TEST_F(BadCheckpointTest, ManifestOfTheFirstFormat) {
  // Format 1 was the bare protobuf message: refused as what it is, not misread.
  Manifest manifest = *ReadManifest(saved_);
  manifest.set_format_version(1);
  NF_ASSERT_OK(ReplaceFileAtomically(saved_ / kManifestName, manifest.SerializeAsString()));
  ExpectRefused(config_,
                "manifest.pb: manifest format 1, written by an older build without a "
                "manifest checksum; this build reads format 2");
}

TEST_F(BadCheckpointTest, GarbageManifest) {
  std::string bytes = EncodeManifest(*ReadManifest(saved_));
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  NF_ASSERT_OK(ReplaceFileAtomically(saved_ / kManifestName, bytes));
  ExpectRefused(config_, "manifest.pb: fails its checksum (the file is corrupt)");
}

TEST_F(BadCheckpointTest, LatestNamingSomethingElse) {
  NF_ASSERT_OK(ReplaceFileAtomically(dir_.path() / kLatestName, "../../etc\n"));
  const absl::StatusOr<fs::path> latest = LatestCheckpoint(dir_.path());
  ASSERT_FALSE(latest.ok());
  EXPECT_NE(latest.status().message().find("does not name a checkpoint ('../../etc')"),
            absl::string_view::npos)
      << latest.status();
}

}  // namespace
}  // namespace nf::checkpoint
