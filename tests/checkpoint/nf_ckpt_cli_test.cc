// nf-ckpt as a user runs it: help, inspect and verify of a good checkpoint (found through a run's
// `latest`), and damaged ones refused with exit code 1, a line naming each bad tensor record
// (a checksum, a non-finite value) and one of summary.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "cli_util.h"
#include "core/files/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/trainer.h"
#include "parallel/local_communicator.h"
#include "tests/assert_ok.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::nf::testing::Lines;
using ::nf::testing::Outcome;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class NfCkptCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("nf_ckpt_cli_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    launcher::TrainConfig config;
    model::ModelConfig& m = *config.mutable_model();
    m.set_num_layers(1);
    m.set_d_model(16);
    m.set_num_heads(2);
    m.set_ffn_dim(32);
    m.set_vocab_size(30);
    m.set_max_seq_len(8);
    config.mutable_train()->set_seq_len(8);
    config.mutable_train()->set_micro_batch_size(1);
    config.mutable_train()->set_global_batch_size(1);
    config.mutable_train()->mutable_lr_schedule()->set_warmup_iters(1);
    auto trainer = launcher::Trainer::Create(config);
    NF_ASSERT_OK(trainer);
    NF_ASSERT_OK((*trainer)->TrainStep());
    parallel::LocalCommunicator world;
    NF_ASSERT_OK(SaveCheckpoint(dir_ / "checkpoints", (*trainer)->CheckpointState(),
                                (*trainer)->Progress(), world));
  }
  void TearDown() override { fs::remove_all(dir_); }

  Outcome Run(const std::vector<std::string>& args) {
    return ::nf::testing::RunProgram(NF_CKPT_BINARY, args, dir_);
  }

  fs::path dir_;
};

TEST_F(NfCkptCliTest, HelpNamesEveryCommand) {
  const Outcome outcome = Run({"--help"});
  EXPECT_EQ(outcome.exit_code, 0);
  for (const char* command : {"inspect DIR", "verify DIR", "export DIR", "convert DIR"}) {
    EXPECT_THAT(outcome.out, HasSubstr(command));
  }
}

TEST_F(NfCkptCliTest, InspectsAndVerifiesTheLatestCheckpoint) {
  const std::string checkpoints = (dir_ / "checkpoints").string();
  const Outcome inspect = Run({"inspect", checkpoints});
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, StartsWith(absl::StrCat("checkpoint ", checkpoints, "/iter_0000001\n")));
  EXPECT_THAT(inspect.out, HasSubstr("step 1, 1 samples consumed of a data stream of "));
  EXPECT_THAT(inspect.out, HasSubstr(", 1 optimizer updates"));
  const Outcome verify = Run({"verify", checkpoints});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr(": OK, "));
}

// verify lists every bad tensor record, one line each, then one line of summary.
TEST_F(NfCkptCliTest, ADamagedCheckpointFailsWithOneLinePerBadRecord) {
  const fs::path shard = dir_ / "checkpoints" / "iter_0000001" / "rank_00000.shard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x7f');
  }
  const Outcome verify = Run({"verify", (dir_ / "checkpoints").string()});
  EXPECT_EQ(verify.exit_code, 1);
  const std::vector<std::string> lines = Lines(verify.err);
  ASSERT_EQ(lines.size(), 2u) << verify.err;
  EXPECT_THAT(lines[0], StartsWith("nf-ckpt: checkpoint "));
  EXPECT_THAT(lines[0], HasSubstr("fails its checksum (the file is corrupt)"));
  EXPECT_THAT(lines[1], HasSubstr(": 1 of "));
  EXPECT_THAT(lines[1], HasSubstr(" tensor records fail (listed above)"));
  const Outcome usage = Run({"convert", (dir_ / "checkpoints").string(), "--tp", "2"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("convert needs --pp"));
}

// A checkpoint holding inf in two tensors (written by hand, checksums made to match): verify
// names each of them, as non-finite, and fails.
TEST_F(NfCkptCliTest, VerifyNamesEveryNonFiniteTensor) {
  const fs::path saved = dir_ / "checkpoints" / "iter_0000001";
  Manifest manifest = *ReadManifest(saved);
  std::vector<std::string> poisoned;
  for (const int record : {0, 5}) {
    TensorRecord& r = *manifest.mutable_tensors(record);
    ASSERT_EQ(r.dtype(), "f32");
    Piece& piece = *r.mutable_pieces(0);
    std::string shard = *ReadWholeFile(saved / piece.file());
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(shard.data() + piece.offset(), &inf, sizeof(inf));
    piece.set_crc32c(Crc32c(shard.data() + piece.offset(), static_cast<size_t>(piece.length())));
    NF_ASSERT_OK(ReplaceFileAtomically(saved / piece.file(), shard));
    poisoned.push_back(absl::StrCat(r.name(), " (", TensorRecord::Kind_Name(r.kind()), ")"));
  }
  NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, EncodeManifest(manifest)));
  const Outcome verify = Run({"verify", saved.string()});
  EXPECT_EQ(verify.exit_code, 1);
  const std::vector<std::string> lines = Lines(verify.err);
  ASSERT_EQ(lines.size(), 3u) << verify.err;
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(lines[i], HasSubstr(poisoned[i] + " holds 1 non-finite values"));
  }
  EXPECT_THAT(lines[2], HasSubstr(": 2 of "));
}

// A directory the OS cannot look into (a name too long, a loop of symbolic links) made nf-ckpt
// die of an uncaught std::filesystem_error; now it is one line, the path and the OS's reason,
// exit 1. Likewise a shard file that is a directory.
TEST_F(NfCkptCliTest, DirectoriesThatCannotBeReadAreOneLineNamingThePathAndTheReason) {
  const std::string long_name = (dir_ / std::string(300, 'a')).string();
  fs::create_directory_symlink("loop", dir_ / "loop");
  const std::string loop = (dir_ / "loop").string();
  for (const auto& [dir, reason] : std::vector<std::pair<std::string, std::string>>{
           {long_name, "File name too long"}, {loop, "Too many levels of symbolic links"}}) {
    const Outcome inspect = Run({"inspect", dir});
    EXPECT_EQ(inspect.exit_code, 1) << inspect.err;
    EXPECT_EQ(Lines(inspect.err), std::vector<std::string>{absl::StrCat("nf-ckpt: cannot read ",
                                                                        dir, "/latest: ", reason)});
  }
  const fs::path shard = dir_ / "checkpoints" / "iter_0000001" / "rank_00000.shard";
  fs::remove(shard);
  fs::create_directory(shard);
  const Outcome verify = Run({"verify", (dir_ / "checkpoints").string()});
  EXPECT_EQ(verify.exit_code, 1) << verify.err;
  EXPECT_EQ(Lines(verify.err),
            std::vector<std::string>{absl::StrCat(
                "nf-ckpt: checkpoint ", (dir_ / "checkpoints" / "iter_0000001").string(),
                ": shard file rank_00000.shard is missing or unreadable (Is a directory)")});
}

// A checkpoint that is not there is said to be missing, not to lack its manifest.
TEST_F(NfCkptCliTest, AMissingCheckpointIsSaidNotToExist) {
  const fs::path nope = dir_ / "nope";
  const Outcome outcome = Run({"inspect", nope.string()});
  EXPECT_EQ(outcome.exit_code, 1);
  EXPECT_EQ(Lines(outcome.err), std::vector<std::string>{absl::StrCat(
                                    "nf-ckpt: checkpoint ", nope.string(), " does not exist")});
}

// Every command that writes replaces nothing: an --out that exists (here a directory) is refused
// before anything is written, and no FILE.tmp is left.
TEST_F(NfCkptCliTest, AnExistingOutIsRefused) {
  const fs::path out = dir_ / "model.safetensors";
  fs::create_directory(out);
  const Outcome outcome = Run({"export", (dir_ / "checkpoints").string(), "--format", "safetensors",
                               "--out", out.string()});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_EQ(Lines(outcome.err),
            std::vector<std::string>{absl::StrCat("nf-ckpt: --out ", out.string(),
                                                  " exists: export writes a new file, choose "
                                                  "another")});
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  EXPECT_TRUE(fs::is_empty(out));
}

// No command writes inside a checkpoint or a run's checkpoints directory: an export over the
// manifest (which used to exit 0 and destroy the latest checkpoint), a file beside the shards, a
// conversion under a checkpoint's name in checkpoints/ (which retention would then count) and an
// import into a staging directory are refused, and every byte of the checkpoints stays.
TEST_F(NfCkptCliTest, NothingIsWrittenInsideACheckpoint) {
  const fs::path checkpoints = dir_ / "checkpoints";
  const fs::path saved = checkpoints / "iter_0000001";
  const std::string manifest_before = *ReadWholeFile(saved / kManifestName);
  const Outcome exported = Run({"export", checkpoints.string(), "--format", "fairseq", "--out",
                                (dir_ / "model.safetensors").string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  struct Refusal {
    std::vector<std::string> args;
    fs::path out;
    std::string inside;
  };
  const std::vector<Refusal> refusals = {
      {{"export", checkpoints.string(), "--format", "fairseq"},
       saved / kManifestName,
       absl::StrCat(" is inside checkpoint ", saved.string(), ": ")},
      {{"export", checkpoints.string(), "--format", "safetensors"},
       saved / "sub" / "x.safetensors",
       absl::StrCat(" is inside checkpoint ", saved.string(), ": ")},
      {{"convert", checkpoints.string(), "--tp", "1", "--pp", "1", "--dp", "1"},
       checkpoints / "iter_0000099",
       " is inside checkpoint "},
      {{"convert", checkpoints.string(), "--tp", "1", "--pp", "1", "--dp", "1"},
       checkpoints / "converted",
       absl::StrCat(" is inside the checkpoints directory ", checkpoints.string(),
                    ", which only training")},
      {{"import", (dir_ / "model.safetensors").string()},
       checkpoints / "iter_0000007.tmp" / "x",
       " is inside checkpoint "},
  };
  for (const Refusal& refusal : refusals) {
    std::vector<std::string> args = refusal.args;
    args.insert(args.end(), {"--out", refusal.out.string()});
    const Outcome outcome = Run(args);
    SCOPED_TRACE(refusal.out.string());
    ASSERT_EQ(Lines(outcome.err).size(), 1u) << outcome.err;
    EXPECT_THAT(outcome.err,
                HasSubstr(absl::StrCat("nf-ckpt: --out ", refusal.out.string(), refusal.inside)));
    EXPECT_EQ(outcome.exit_code, 1);
    if (refusal.out.filename() != kManifestName) {
      EXPECT_FALSE(fs::exists(refusal.out));
    }
  }
  EXPECT_EQ(*ReadWholeFile(saved / kManifestName), manifest_before);
  EXPECT_FALSE(fs::exists(checkpoints / "iter_0000099"));
  EXPECT_EQ(CheckpointSteps(checkpoints), std::vector<int64_t>{1});
  const Outcome verify = Run({"verify", checkpoints.string()});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
}

// Links and files planted where the tools used to write their temporaries (OUT.tmp) reach
// nothing: an export with OUT.tmp a symbolic link to the manifest used to exit 0 and leave the
// checkpoint failing "bad magic"; with a hard link to a shard it failed and left the shard
// truncated; a conversion removed a user's own p.tmp directory. Now each export and conversion
// succeeds, every planted name is left as it was, and the checkpoint verifies.
TEST_F(NfCkptCliTest, LinksAndFilesAtTemporaryNamesReachNothing) {
  const fs::path checkpoints = dir_ / "checkpoints";
  const fs::path saved = checkpoints / "iter_0000001";
  const std::string manifest = *ReadWholeFile(saved / kManifestName);
  const std::string shard = *ReadWholeFile(saved / "rank_00000.shard");
  fs::create_symlink(saved / kManifestName, dir_ / "x.st.tmp");
  fs::create_hard_link(saved / "rank_00000.shard", dir_ / "y.st.tmp");
  std::ofstream(dir_ / "z.st.tmp") << "mine";
  fs::create_directory(dir_ / "p.tmp");
  std::ofstream(dir_ / "p.tmp" / "n") << "notes";
  for (const char* out : {"x.st", "y.st", "z.st"}) {
    const Outcome exported = Run({"export", checkpoints.string(), "--format", "safetensors",
                                  "--out", (dir_ / out).string()});
    EXPECT_EQ(exported.exit_code, 0) << out << ": " << exported.err;
  }
  const Outcome converted = Run({"convert", checkpoints.string(), "--tp", "1", "--pp", "1", "--dp",
                                 "1", "--out", (dir_ / "p").string()});
  EXPECT_EQ(converted.exit_code, 0) << converted.err;
  EXPECT_EQ(*ReadWholeFile(saved / kManifestName), manifest);
  EXPECT_EQ(*ReadWholeFile(saved / "rank_00000.shard"), shard);
  EXPECT_TRUE(fs::is_symlink(dir_ / "x.st.tmp"));
  EXPECT_EQ(fs::hard_link_count(dir_ / "y.st.tmp"), 2u);
  EXPECT_EQ(*ReadWholeFile(dir_ / "z.st.tmp"), "mine");
  EXPECT_EQ(*ReadWholeFile(dir_ / "p.tmp" / "n"), "notes");
  for (const fs::path& verified : {checkpoints, dir_ / "p"}) {
    const Outcome verify = Run({"verify", verified.string()});
    EXPECT_EQ(verify.exit_code, 0) << verify.err;
  }
  // Nothing else was left beside the outputs (no temporaries of the tool's own).
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (name != "stdout.txt" && name != "stderr.txt") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoints", "p", "p.tmp", "x.st", "x.st.tmp",
                                             "y.st", "y.st.tmp", "z.st", "z.st.tmp"}));
}

// A manifest whose model config disagrees with its tensors (vocab_size 2^24 over an embedding
// of 128 rows) used to pass verify; nf-eval then allocated 8.5 GB for the config's vocabulary
// before failing. Every reader now refuses it with one line naming the tensor and the config.
TEST_F(NfCkptCliTest, AModelConfigThatDisagreesWithTheTensorsIsRefused) {
  const fs::path saved = dir_ / "checkpoints" / "iter_0000001";
  Manifest manifest = *ReadManifest(saved);
  manifest.mutable_model()->set_vocab_size(1 << 24);
  NF_ASSERT_OK(ReplaceFileAtomically(saved / kManifestName, EncodeManifest(manifest)));
  for (const char* command : {"verify", "inspect"}) {
    const Outcome outcome = Run({command, saved.string()});
    EXPECT_EQ(outcome.exit_code, 1) << command;
    ASSERT_EQ(Lines(outcome.err).size(), 1u) << outcome.err;
    EXPECT_THAT(outcome.err, HasSubstr("model.vocab_size 16777216"));
    EXPECT_THAT(outcome.err, HasSubstr("the config and the tensors disagree"));
  }
}

}  // namespace
}  // namespace nf::checkpoint
