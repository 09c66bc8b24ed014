// What a checkpoint must never do silently: be believed after a bit of its manifest flipped,
// resume at a step its directory does not name, hold a non-finite tensor, or leave a run with
// checkpoints to fall back on starting afresh because `latest` is gone or damaged.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/convert.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/manifest_file.h"
#include "checkpoint/safetensors_export.h"
#include "core/files/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;
using ::testing::HasSubstr;

// A tiny run with checkpoints of steps 1 .. `saves` in `dir`.
void SaveSteps(const TrainConfig& config, const fs::path& dir, int saves) {
  auto trainer = MakeTrainer(config);
  for (int step = 1; step <= saves; ++step) {
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(Save(*trainer, dir, {.keep_last = saves, .keep_every = 0}));
  }
}

std::string Flipped(std::string bytes, size_t bit) {
  bytes[bit / 8] = static_cast<char>(bytes[bit / 8] ^ (1 << (bit % 8)));
  return bytes;
}

// Every single-bit flip of a real manifest is refused: the checksum covers the payload, the
// header's fields are each checked (magic, length against the file, checksum). Today's format
// 1 (the bare message) accepted 223 of 400 random flips.
TEST(ManifestIntegrityTest, EveryBitFlipIsRefused) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP16), dir.path(), 1);
  const fs::path saved = dir.path() / "iter_0000001";
  const std::string bytes = *ReadWholeFile(saved / kManifestName);
  NF_ASSERT_OK(DecodeManifest(bytes, "manifest"));
  int accepted = 0;
  for (size_t bit = 0; bit < 8 * bytes.size(); ++bit) {
    if (DecodeManifest(Flipped(bytes, bit), "manifest").ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 0) << "of " << 8 * bytes.size() << " single-bit flips";
  // And through the file, the way a run reads it, for a spread of bits: refused, one line.
  for (size_t bit = 0; bit < 8 * bytes.size(); bit += 8 * bytes.size() / 97 + 1) {
    NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, Flipped(bytes, bit)));
    const absl::StatusOr<Manifest> read = ReadManifest(saved);
    ASSERT_FALSE(read.ok()) << "bit " << bit;
    EXPECT_EQ(read.status().message().find('\n'), std::string::npos) << read.status();
  }
}

TEST(ManifestIntegrityTest, TheStepMustMatchTheDirectoryName) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 1);
  fs::rename(dir.path() / "iter_0000001", dir.path() / "iter_0000013");
  const absl::StatusOr<Manifest> read = ReadManifest(dir.path() / "iter_0000013");
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("the manifest holds step 1, the directory is named for step 13"));
  // A copy under another name is read at its manifest's word.
  fs::rename(dir.path() / "iter_0000013", dir.path() / "best");
  NF_EXPECT_OK(ReadManifest(dir.path() / "best"));
}

// Pieces must tile each shard file: a byte in no piece would be under no checksum.
TEST(ManifestIntegrityTest, BytesOutsideEveryPieceAreRefused) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 1);
  const fs::path saved = dir.path() / "iter_0000001";
  Manifest manifest = *ReadManifest(saved);
  ShardFile& file = *manifest.mutable_files(0);
  file.set_size(file.size() + 4);
  { std::ofstream(saved / file.name(), std::ios::app | std::ios::binary) << "junk"; }
  NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, EncodeManifest(manifest)));
  const absl::StatusOr<Manifest> read = ReadManifest(saved);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr(absl::StrCat("the pieces of ", file.name(), " cover ", file.size() - 4,
                                     " of its ", file.size(), " bytes")));
}

// A manifest whose model config cannot be built (each of these crashed or misled a reader that
// trusted it: nf-eval divided by max_seq_len 0) is refused by every reader, naming the field;
// a manifest is read only through DecodeManifest.
TEST(ManifestIntegrityTest, AModelConfigThatCannotBeBuiltIsRefused) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 1);
  const fs::path saved = dir.path() / "iter_0000001";
  const Manifest good = *ReadManifest(saved);
  const std::vector<std::pair<std::function<void(model::ModelConfig&)>, std::string>> cases = {
      {[](model::ModelConfig& m) { m.set_max_seq_len(0); },
       "model.max_seq_len must be positive (got 0)"},
      {[](model::ModelConfig& m) { m.set_max_seq_len(-1); },
       "model.max_seq_len must be positive (got -1)"},
      {[](model::ModelConfig& m) { m.set_dropout(5); }, "model.dropout must be in [0, 1)"},
      {[](model::ModelConfig& m) { m.set_num_layers(1 << 30); },
       "model.num_layers must be at most 4096"},
      {[](model::ModelConfig& m) { m.set_num_heads(3); }, "must be a multiple of model.num_heads"},
  };
  for (const auto& [spoil, expected] : cases) {
    Manifest manifest = good;
    spoil(*manifest.mutable_model());
    NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, EncodeManifest(manifest)));
    const absl::StatusOr<Manifest> read = ReadManifest(saved);
    ASSERT_FALSE(read.ok()) << expected;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("its model config is invalid: "));
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(expected));
  }
}

// Writes a non-finite value into element 3 of `tensor` (a host buffer of f32 or f16).
void Poison(const Tensor& tensor) {
  if (tensor.dtype() == DType::kF32) {
    tensor.data<float>()[3] = std::numeric_limits<float>::infinity();
  } else {
    static_cast<uint16_t*>(tensor.raw_data())[3] = 0x7e00;  // f16 NaN
  }
}

// A non-finite parameter, master weight or moment is never saved: the save fails naming it,
// nothing is committed, `latest` and every older checkpoint stay.
TEST(NonFiniteCheckpointTest, IsNeverWrittenAndKeepsTheLastGoodOne) {
  for (const int poisoned : {0, 1, 2}) {  // the fp16 parameters, the master weights, exp_avg_sq
    SCOPED_TRACE(poisoned);
    TempDir dir;
    const TrainConfig config = TinyConfig(launcher::TrainOptions::FP16);
    auto trainer = MakeTrainer(config);
    TrainSteps(*trainer, 1);
    NF_ASSERT_OK(Save(*trainer, dir.path(), {.keep_last = 1, .keep_every = 0}));
    TrainSteps(*trainer, 1);
    optim::MixedPrecisionAdamW& adamw = trainer->optimizer(0).adamw();
    const Tensor* targets[] = {&trainer->chunks().front()->params().params(), &adamw.master(),
                               &adamw.exp_avg_sq()};
    Poison(*targets[poisoned]);
    const absl::Status saved = Save(*trainer, dir.path(), {.keep_last = 1, .keep_every = 0});
    ASSERT_FALSE(saved.ok());
    const char* kinds[] = {"(PARAM)", "(MASTER)", "(EXP_AVG_SQ)"};
    EXPECT_THAT(std::string(saved.message()), HasSubstr(kinds[poisoned]));
    EXPECT_THAT(std::string(saved.message()), HasSubstr("non-finite values on rank 0"));
    EXPECT_FALSE(fs::exists(dir.path() / "iter_0000002"));
    EXPECT_EQ(*LatestCheckpoint(dir.path()), dir.path() / "iter_0000001");
    NF_EXPECT_OK(Load(*MakeTrainer(config), dir.path() / "iter_0000001"));
  }
}

// One written anyway (by an older build, or by hand) is refused by load, verify and export
// alike (they all assemble through AssembleTensor), naming the tensor.
TEST(NonFiniteCheckpointTest, IsRefusedWhenRead) {
  TempDir dir;
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  SaveSteps(config, dir.path(), 1);
  const fs::path saved = dir.path() / "iter_0000001";
  Manifest manifest = *ReadManifest(saved);
  TensorRecord& record = *manifest.mutable_tensors(0);
  Piece& piece = *record.mutable_pieces(0);
  std::string shard = *ReadWholeFile(saved / piece.file());
  const float inf = std::numeric_limits<float>::infinity();
  shard.replace(static_cast<size_t>(piece.offset()), sizeof(inf),
                reinterpret_cast<const char*>(&inf), sizeof(inf));
  piece.set_crc32c(Crc32c(shard.data() + piece.offset(), static_cast<size_t>(piece.length())));
  NF_ASSERT_OK(ReplaceFileAtomically(saved / piece.file(), shard));
  NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, EncodeManifest(manifest)));
  const absl::StatusOr<AssembledTensor> assembled =
      AssembleTensor(saved, *ReadManifest(saved), record);
  ASSERT_FALSE(assembled.ok());
  EXPECT_THAT(std::string(assembled.status().message()),
              HasSubstr(absl::StrCat(record.name(), " (PARAM) holds 1 non-finite values")));
  const absl::Status loaded = Load(*MakeTrainer(config), saved);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.message()), HasSubstr("non-finite"));
}

// A file system that refuses writes past a size, for this process: RLIMIT_FSIZE with SIGXFSZ
// ignored makes a write past `bytes` fail with EFBIG, as ENOSPC would on a full disk. Restored
// when it goes out of scope.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = SIG_DFL;
};

// A save that fails for lack of space says why (the OS's reason and the file) and leaves no
// staging directory behind to fill the disk further; `latest` and the previous checkpoint stay.
TEST(FailedSaveTest, LeavesNothingBehindAndSaysWhy) {
  TempDir dir;
  const TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  auto trainer = MakeTrainer(config);
  TrainSteps(*trainer, 1);
  NF_ASSERT_OK(Save(*trainer, dir.path()));
  TrainSteps(*trainer, 1);
  absl::Status saved;
  {
    const FileSizeLimit full(4096);  // the shard is larger
    saved = Save(*trainer, dir.path());
  }
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(std::string(saved.message()), HasSubstr("cannot write "));
  EXPECT_THAT(std::string(saved.message()), HasSubstr("rank_00000.shard: File too large"));
  EXPECT_EQ(SortedNames(dir.path()), (std::vector<std::string>{"iter_0000001", "latest"}));
  // ReplaceFileAtomically (latest, a run's config.pbtxt) likewise leaves no .tmp.
  absl::Status replaced;
  {
    const FileSizeLimit full(16);
    replaced = ReplaceFileAtomically(dir.path() / "config.pbtxt", std::string(100, 'x'));
  }
  EXPECT_THAT(std::string(replaced.message()), HasSubstr("config.pbtxt.tmp-"));
  EXPECT_THAT(std::string(replaced.message()), HasSubstr(": File too large"));
  EXPECT_EQ(SortedNames(dir.path()), (std::vector<std::string>{"iter_0000001", "latest"}));
}

// An export or a conversion that fails for lack of space leaves no temporary behind either.
TEST(FailedSaveTest, AFailedExportOrConversionLeavesNoTemporaries) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 1);
  const fs::path saved = dir.path() / "iter_0000001";
  const absl::StatusOr<Manifest> manifest = ReadManifest(saved);
  NF_ASSERT_OK(manifest);
  TempDir out;  // outside the checkpoints directory, where nothing may be written
  absl::Status exported, converted;
  {
    const FileSizeLimit full(4096);  // a fraction of the parameters
    exported = ExportSafetensors(saved, *manifest, out.path() / "model.safetensors", std::nullopt);
    converted = ConvertCheckpoint(saved, *manifest, {}, out.path() / "converted");
  }
  EXPECT_THAT(std::string(exported.message()), HasSubstr("model.safetensors.tmp-"));
  EXPECT_THAT(std::string(exported.message()), HasSubstr(": File too large"));
  EXPECT_THAT(std::string(converted.message()), HasSubstr("rank_00000.shard: File too large"));
  EXPECT_EQ(SortedNames(out.path()), std::vector<std::string>{});
}

TEST(ResumePointTest, TakesLatestWhenItIsGood) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 2);
  const absl::StatusOr<ResumePoint> point = FindResumePoint(dir.path());
  NF_ASSERT_OK(point);
  EXPECT_EQ(point->dir, dir.path() / "iter_0000002");
  EXPECT_EQ(point->manifest.step(), 2);
  EXPECT_EQ(point->warning, "");
}

TEST(ResumePointTest, AMissingLatestFallsBackToTheNewestThatVerifiesWithAWarning) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 2);
  fs::remove(dir.path() / kLatestName);
  const absl::StatusOr<ResumePoint> point = FindResumePoint(dir.path());
  NF_ASSERT_OK(point);
  EXPECT_EQ(point->dir, dir.path() / "iter_0000002");
  EXPECT_THAT(point->warning, HasSubstr((dir.path() / "latest").string() + " is missing"));
  EXPECT_THAT(point->warning, HasSubstr("resuming from " + (dir.path() / "iter_0000002").string()));
}

TEST(ResumePointTest, ADamagedLatestOrItsCheckpointFallsBackToAnOlderOne) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 2);
  // `latest` with garbage: the newest checkpoint, named in the warning with the problem.
  NF_ASSERT_OK(ReplaceFileAtomically(dir.path() / kLatestName, "iter_00\x01"));
  absl::StatusOr<ResumePoint> point = FindResumePoint(dir.path());
  NF_ASSERT_OK(point);
  EXPECT_EQ(point->dir, dir.path() / "iter_0000002");
  EXPECT_THAT(point->warning, HasSubstr("does not name a checkpoint"));
  // `latest` naming a checkpoint whose manifest is corrupt: the one before, both named.
  NF_ASSERT_OK(ReplaceFileAtomically(dir.path() / kLatestName, "iter_0000002\n"));
  NF_ASSERT_OK(ReplaceFileAtomically(dir.path() / "iter_0000002" / kManifestName, "garbage"));
  point = FindResumePoint(dir.path());
  NF_ASSERT_OK(point);
  EXPECT_EQ(point->dir, dir.path() / "iter_0000001");
  EXPECT_THAT(point->warning, HasSubstr("names iter_0000002, which fails"));
  EXPECT_THAT(point->warning, HasSubstr("resuming from " + (dir.path() / "iter_0000001").string()));
}

TEST(ResumePointTest, CheckpointsOfWhichNoneVerifiesAreRefusedNotIgnored) {
  TempDir dir;
  SaveSteps(TinyConfig(launcher::TrainOptions::FP32), dir.path(), 2);
  fs::remove(dir.path() / kLatestName);
  for (const char* name : {"iter_0000001", "iter_0000002"}) {
    NF_ASSERT_OK(ReplaceFileAtomically(dir.path() / name / kManifestName, "garbage"));
  }
  const absl::StatusOr<ResumePoint> point = FindResumePoint(dir.path());
  ASSERT_FALSE(point.ok());
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(point.status().message()), HasSubstr("not starting afresh"));
  EXPECT_EQ(point.status().message().find('\n'), std::string::npos);
}

// A `latest` the OS cannot read (here a directory) is not taken for a missing one: a run with
// no checkpoint to fall back on refuses to start afresh over it, naming the file and the reason.
TEST(ResumePointTest, ALatestThatCannotBeReadIsNotAFreshRun) {
  TempDir dir;
  fs::create_directories(dir.path() / kLatestName);
  const absl::StatusOr<ResumePoint> point = FindResumePoint(dir.path());
  ASSERT_FALSE(point.ok());
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(point.status().message()),
              HasSubstr(absl::StrCat("cannot read ", (dir.path() / kLatestName).string(),
                                     ": Is a directory")));
}

TEST(ResumePointTest, AnEmptyDirectoryIsAFreshRun) {
  TempDir dir;
  EXPECT_EQ(FindResumePoint(dir.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindResumePoint(dir.path() / "none").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace nf::checkpoint
