// Tests of the nf-launch command line, running the real binary of this build: --help, the
// exit codes (0 done, 1 runtime error, 2 bad command line or configuration) with a one-line
// error naming the problem, and a short run writing config.pbtxt and log.jsonl.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli_util.h"
#include "core/ops/backend.h"
#include "data/indexed_dataset.h"
#include "launcher/run_dir_lock.h"
#include "launcher/train_loop.h"
#include "test_util.h"

#ifndef NF_LAUNCH_BINARY
#error "NF_LAUNCH_BINARY must name the nf-launch executable (tests/CMakeLists.txt)"
#endif

namespace nf::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using ::nf::testing::Lines;
using ::nf::testing::Outcome;
using ::nf::testing::ReadFile;

// A fresh directory for one test's files, removed afterwards.
class NfLaunchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("nf_launch_cli_test_", getpid(), "_", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs nf-launch with `args`, stdout and stderr captured to files.
  Outcome Launch(const std::vector<std::string>& args) {
    return ::nf::testing::RunProgram(NF_LAUNCH_BINARY, args, dir_);
  }

  std::string WriteConfig(const std::string& name, const std::string& text) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  // A valid configuration small enough to train 3 steps in milliseconds.
  std::string TinyConfig() {
    return WriteConfig("tiny.pbtxt", R"pb(
      model { num_layers: 1 d_model: 16 num_heads: 2 ffn_dim: 32 vocab_size: 32 max_seq_len: 8 }
      train {
        seq_len: 8
        micro_batch_size: 2
        global_batch_size: 4
        train_iters: 3
        log_interval: 1
        lr_schedule { warmup_iters: 1 }
      }
    )pb");
  }

  // Expects exit code 2 and a stderr whose first line is "nf-launch: " followed by an error
  // mentioning every one of `mentions`. A command-line (usage) error may add one more line,
  // pointing at --help; nothing else is printed, and nothing is run.
  void ExpectConfigurationError(const Outcome& outcome, const std::vector<std::string>& mentions,
                                bool usage_hint) {
    EXPECT_EQ(outcome.exit_code, 2) << outcome.err;
    const std::vector<std::string> lines = Lines(outcome.err);
    ASSERT_EQ(lines.size(), usage_hint ? 2u : 1u) << outcome.err;
    EXPECT_THAT(lines[0], StartsWith("nf-launch: "));
    for (const std::string& mention : mentions) EXPECT_THAT(lines[0], HasSubstr(mention));
    if (usage_hint) {
      EXPECT_THAT(lines[1], HasSubstr("nf-launch --help"));
    }
    EXPECT_EQ(outcome.out, "") << "nothing is trained";
  }

  // Every regular file under `root` (symbolic links followed), by its path relative to `root`,
  // with its contents: a snapshot to compare.
  static std::map<std::string, std::string> FilesUnder(const std::filesystem::path& root) {
    std::map<std::string, std::string> files;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file()) continue;
      files[std::filesystem::relative(entry.path(), root).string()] = ReadFile(entry.path());
    }
    return files;
  }

  std::filesystem::path dir_;
};

TEST_F(NfLaunchCliTest, HelpDocumentsEveryOptionAndExitCode) {
  for (const std::string flag : {"--help", "-h"}) {
    const Outcome outcome = Launch({flag});
    EXPECT_EQ(outcome.exit_code, 0) << flag;
    EXPECT_EQ(outcome.err, "") << flag;
    EXPECT_THAT(outcome.out, StartsWith("usage: nf-launch --config")) << flag;
    for (const std::string option : {"--config FILE", "--set PATH=VALUE", "--run-dir DIR", "--help",
                                     "config.pbtxt", "log.jsonl", "exit codes"}) {
      EXPECT_THAT(outcome.out, HasSubstr(option)) << flag;
    }
    // Every field of a log record is named.
    for (const std::string field : {"step", "loss", "ppl", "lr", "loss_scale", "grad_norm",
                                    "skipped", "skipped_total", "tokens", "seconds"}) {
      EXPECT_THAT(outcome.out, HasSubstr(field)) << flag;
    }
  }
}

TEST_F(NfLaunchCliTest, HelpWinsOverOtherArguments) {
  const Outcome outcome = Launch({"--set", "model.d_model=1", "--help"});
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_THAT(outcome.out, StartsWith("usage:"));
}

TEST_F(NfLaunchCliTest, MissingConfigIsUsageError) {
  ExpectConfigurationError(Launch({"--run-dir", (dir_ / "run").string()}), {"--config is required"},
                           /*usage_hint=*/true);
  ExpectConfigurationError(Launch({}), {"--config is required"}, /*usage_hint=*/true);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST_F(NfLaunchCliTest, MissingRunDirIsUsageError) {
  ExpectConfigurationError(Launch({"--config", TinyConfig()}), {"--run-dir is required"},
                           /*usage_hint=*/true);
}

TEST_F(NfLaunchCliTest, UnknownArgumentIsUsageError) {
  ExpectConfigurationError(Launch({"--config", TinyConfig(), "--bogus", "--run-dir", "x"}),
                           {"unknown argument '--bogus'"}, /*usage_hint=*/true);
  // A stray positional argument too.
  ExpectConfigurationError(Launch({"--config", TinyConfig(), "extra"}),
                           {"unknown argument 'extra'"}, /*usage_hint=*/true);
}

TEST_F(NfLaunchCliTest, OptionWithoutValueIsUsageError) {
  ExpectConfigurationError(Launch({"--config", TinyConfig(), "--run-dir", "x", "--set"}),
                           {"--set needs a value"}, /*usage_hint=*/true);
  ExpectConfigurationError(Launch({"--run-dir", "x", "--config"}), {"--config needs a value"},
                           /*usage_hint=*/true);
}

TEST_F(NfLaunchCliTest, BadSetFieldNamesOverrideAndField) {
  const std::string run_dir = (dir_ / "run").string();
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "model.no_such_field=3", "--run-dir", run_dir}),
      {"--set model.no_such_field=3", "no_such_field"}, /*usage_hint=*/false);
  // A value of the wrong type, and one that fails validation.
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "model.d_model=wide", "--run-dir", run_dir}),
      {"--set model.d_model=wide", "'wide'"}, /*usage_hint=*/false);
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "model.d_model=15", "--run-dir", run_dir}),
      {"model.d_model (15)", "model.num_heads"}, /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(run_dir)) << "a rejected configuration runs nothing";
}

TEST_F(NfLaunchCliTest, UnknownFieldInConfigFileNamesFileLineAndField) {
  const std::string path = WriteConfig("bad.pbtxt", "model {\n  num_layers: 1\n  wings: 2\n}\n");
  ExpectConfigurationError(Launch({"--config", path, "--run-dir", (dir_ / "run").string()}),
                           {absl::StrCat(path, ":3:"), "wings"}, /*usage_hint=*/false);
}

TEST_F(NfLaunchCliTest, UnreadableConfigFileIsConfigurationError) {
  const std::string path = (dir_ / "no_such.pbtxt").string();
  ExpectConfigurationError(Launch({"--config", path, "--run-dir", (dir_ / "run").string()}),
                           {path, ": No such file or directory"}, /*usage_hint=*/false);
  // A path through a regular file: the OS's reason, not a guess.
  const std::string under_a_file = WriteConfig("a_file", "") + "/config.pbtxt";
  ExpectConfigurationError(Launch({"--config", under_a_file, "--run-dir", (dir_ / "run").string()}),
                           {"cannot read config file " + under_a_file + ": Not a directory"},
                           /*usage_hint=*/false);
}

TEST_F(NfLaunchCliTest, ShortRunWritesConfigAndOneLogLinePerStep) {
  const std::filesystem::path run_dir = dir_ / "run";
  const Outcome outcome =
      Launch({"--config", TinyConfig(), "--set", "train.seed=7", "--run-dir", run_dir.string()});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.err, "");
  // Two header lines (the run; what MFU is measured against), with log_interval 1 one
  // progress line per step, and the final checkpoint.
  const std::vector<std::string> console = Lines(outcome.out);
  ASSERT_EQ(console.size(), 6u) << outcome.out;
  EXPECT_THAT(console[0], StartsWith("normformer: "));
  EXPECT_THAT(console[1], StartsWith("MFU: "));
  EXPECT_THAT(console[4], StartsWith("step 3/3 | loss "));
  EXPECT_EQ(console[5],
            absl::StrCat("saved checkpoint ", (run_dir / "checkpoints").string(), "/iter_0000003"));

  // The resolved configuration, with the override applied and defaults written out.
  const std::string config = ReadFile(run_dir / "config.pbtxt");
  EXPECT_THAT(config, HasSubstr("seed: 7"));
  EXPECT_THAT(config, HasSubstr("train_iters: 3"));
  EXPECT_THAT(config, HasSubstr("scale_attn: true"));

  const std::vector<std::string> log = Lines(ReadFile(run_dir / "log.jsonl"));
  ASSERT_EQ(log.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(log[i], StartsWith(absl::StrCat("{\"step\":", i + 1, ",\"loss\":")));
    EXPECT_THAT(log[i], HasSubstr("\"tokens\":32,"));  // global batch 4 x seq_len 8
  }
}

TEST_F(NfLaunchCliTest, RunDirThatCannotBeCreatedIsRefusedBeforeAnyWork) {
  // A regular file where the run directory's parent should be: refused with exit code 2 and the
  // reason on one line, before anything is built or trained.
  const std::string blocker = WriteConfig("blocker", "not a directory");
  const Outcome outcome = Launch(
      {"--config", TinyConfig(), "--run-dir", (std::filesystem::path(blocker) / "run").string()});
  EXPECT_EQ(outcome.exit_code, 2) << outcome.err;
  const std::vector<std::string> lines = Lines(outcome.err);
  ASSERT_EQ(lines.size(), 1u) << outcome.err;
  EXPECT_THAT(lines[0], StartsWith("nf-launch: cannot create run directory"));
  EXPECT_THAT(lines[0], HasSubstr(": Not a directory"));
  EXPECT_EQ(outcome.out, "");
}

// A run directory whose files cannot be written (here a directory where log.jsonl goes, a
// regular file where checkpoints/ goes): exit 1, one line naming the path and the OS's reason.
TEST_F(NfLaunchCliTest, RunDirectoryFilesThatCannotBeWrittenAreNamedWithTheReason) {
  const std::filesystem::path log_run = dir_ / "log_run";
  std::filesystem::create_directories(log_run / "log.jsonl");
  Outcome outcome = Launch({"--config", TinyConfig(), "--run-dir", log_run.string()});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_EQ(Lines(outcome.err), std::vector<std::string>{absl::StrCat(
                                    "nf-launch: cannot open log ", (log_run / "log.jsonl").string(),
                                    " for appending: Is a directory")});

  const std::filesystem::path checkpoint_run = dir_ / "checkpoint_run";
  std::filesystem::create_directories(checkpoint_run);
  std::ofstream(checkpoint_run / "checkpoints") << "not a directory";
  outcome = Launch({"--config", TinyConfig(), "--run-dir", checkpoint_run.string()});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_EQ(Lines(outcome.err),
            std::vector<std::string>{absl::StrCat("nf-launch: cannot create checkpoint directory ",
                                                  (checkpoint_run / "checkpoints").string(),
                                                  ": Not a directory")});
}

// An exception no status was expected for ends nf-launch with one line and exit 1, not with
// std::terminate's abort (exit code 134 and a core dump): here std::bad_alloc from a sample index
// of absurd size (1e14 steps of a 10-document dataset, petabytes of index), past the memory
// check that would otherwise refuse it (ASampleIndexTooBigIsRefusedByTheMemoryCheck).
TEST_F(NfLaunchCliTest, AnExceptionIsOneLineAndExitCodeOne) {
#ifdef __SANITIZE_ADDRESS__
  // AddressSanitizer's operator new reports an impossible size and ends the process itself
  // instead of throwing (GCC 12's, whatever allocator_may_return_null says): the plain build's
  // pass of scripts/test.sh runs this test.
  GTEST_SKIP() << "std::bad_alloc is never thrown under AddressSanitizer";
#endif
  const std::string prefix = (dir_ / "corpus").string();
  auto writer = data::IndexedDatasetWriter::Create(prefix, data::TokenDType::kU16);
  NF_ASSERT_OK(writer);
  for (int d = 0; d < 10; ++d) {
    NF_ASSERT_OK(writer->AddDocument(std::vector<int32_t>(40, d + 1)));
  }
  NF_ASSERT_OK(writer->Finish());
  const Outcome outcome = Launch({"--config", TinyConfig(), "--set", "data.path=" + prefix, "--set",
                                  "train.train_iters=100000000000000", "--run-dir",
                                  (dir_ / "run").string(), "--skip-memory-check"});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_EQ(outcome.err, "nf-launch: out of memory (std::bad_alloc)\n");
}

// A run interrupted after its step-3 checkpoint and started again with the same command
// continues from RUN/checkpoints/latest: its log records of steps 4-6 equal the uninterrupted
// run's (dropout on, so masks and data order must continue exactly too).
TEST_F(NfLaunchCliTest, RerunningResumesFromTheLatestCheckpointBitForBit) {
  const std::string config = TinyConfig();
  const std::vector<std::string> common = {"--config", config,
                                           "--set",    "train.train_iters=6",
                                           "--set",    "model.dropout=0.1",
                                           "--set",    "checkpoint.save_interval=3"};
  auto with = [&](std::vector<std::string> extra, const std::string& run) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--run-dir", (dir_ / run).string()});
    return args;
  };
  ASSERT_EQ(Launch(with({}, "whole")).exit_code, 0);
  // The interruption: the same run stopped at step 3 (the schedule still decays over 6 steps).
  const Outcome first = Launch(with(
      {"--set", "train.train_iters=3", "--set", "train.lr_schedule.decay_iters=6"}, "resumed"));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const Outcome second = Launch(with({}, "resumed"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.out, HasSubstr("resumed from "));
  EXPECT_THAT(second.out, HasSubstr("iter_0000003 at step 3"));
  const std::vector<std::string> whole = Lines(ReadFile(dir_ / "whole" / "log.jsonl"));
  const std::vector<std::string> resumed = Lines(ReadFile(dir_ / "resumed" / "log.jsonl"));
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(resumed.size(), 6u);
  // Every field but the wall time.
  auto strip_seconds = [](const std::string& line) {
    return line.substr(0, line.find("\"seconds\""));
  };
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(strip_seconds(resumed[i]), strip_seconds(whole[i]));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "resumed" / "checkpoints" / "iter_0000006"));
}

// train.exit_interval stops the run after step 3 with a checkpoint and exit code 3 ("resume
// me"); the same command again resumes and finishes, and the log equals an uninterrupted run's.
TEST_F(NfLaunchCliTest, ExitIntervalStopsWithACheckpointAndTheSameCommandResumes) {
  const std::vector<std::string> common = {
      "--config", TinyConfig(), "--set", "train.train_iters=6", "--set", "model.dropout=0.1"};
  auto with = [&](std::vector<std::string> extra, const std::string& run) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--run-dir", (dir_ / run).string()});
    return args;
  };
  ASSERT_EQ(Launch(with({}, "whole")).exit_code, 0);
  const std::vector<std::string> stopping = with({"--set", "train.exit_interval=3"}, "stopped");
  const Outcome first = Launch(stopping);
  EXPECT_EQ(first.exit_code, 3) << first.err;
  EXPECT_THAT(first.out, HasSubstr("stopping after step 3: train.exit_interval (3) reached; rerun "
                                   "the same command to resume (exit code 3)"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "stopped" / "checkpoints" / "iter_0000003"));
  const Outcome second = Launch(stopping);
  EXPECT_EQ(second.exit_code, 0) << second.err;  // step 6 is the last: the run ends normally
  auto strip_seconds = [](const std::string& line) {
    return line.substr(0, line.find("\"seconds\""));
  };
  const std::vector<std::string> whole = Lines(ReadFile(dir_ / "whole" / "log.jsonl"));
  const std::vector<std::string> stopped = Lines(ReadFile(dir_ / "stopped" / "log.jsonl"));
  ASSERT_EQ(stopped.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(strip_seconds(stopped[i]), strip_seconds(whole[i]));
}

// RUN/finished.json says that the run reached train_iters: a run that starts removes one an
// earlier run left (here a shorter run's), a run stopped to resume writes none, and the run
// that reaches train_iters writes it after its last checkpoint (run-requeued.sh trusts exit code
// 0 only beside it).
TEST_F(NfLaunchCliTest, OnlyARunThatReachedTrainItersLeavesFinishedJson) {
  const std::filesystem::path run_dir = dir_ / "run";
  const std::filesystem::path finished = run_dir / kFinishedFile;
  std::filesystem::create_directories(run_dir);
  std::ofstream(finished) << "{\"step\":2,\"train_iters\":2}\n";
  const std::vector<std::string> args = {"--config",  TinyConfig(),
                                         "--set",     "train.train_iters=6",
                                         "--set",     "train.exit_interval=3",
                                         "--run-dir", run_dir.string()};
  const Outcome stopped = Launch(args);
  ASSERT_EQ(stopped.exit_code, 3) << stopped.err;
  EXPECT_FALSE(std::filesystem::exists(finished)) << "a stopped run left " << finished;
  const Outcome resumed = Launch(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(ReadFile(finished), "{\"step\":6,\"train_iters\":6}\n");
  EXPECT_TRUE(std::filesystem::exists(run_dir / "checkpoints" / "iter_0000006"));
}

// A resume refused (the run's checkpoint is another model's) leaves the run directory as it was,
// every file of it: it used to delete finished.json, add a TensorBoard event file and rewrite
// .lock and config.pbtxt before the resume refused.
TEST_F(NfLaunchCliTest, ARefusedResumeLeavesTheRunDirectoryAsItWas) {
  const std::string run_dir = (dir_ / "run").string();
  ASSERT_EQ(Launch({"--config", TinyConfig(), "--run-dir", run_dir}).exit_code, 0);
  const std::map<std::string, std::string> before = FilesUnder(dir_ / "run");
  ASSERT_TRUE(before.contains("finished.json"));
  const Outcome refused = Launch({"--config", TinyConfig(), "--set", "model.d_model=32", "--set",
                                  "train.train_iters=6", "--run-dir", run_dir});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("model.d_model"));
  EXPECT_EQ(FilesUnder(dir_ / "run"), before);
  EXPECT_THAT(before.at("config.pbtxt"), HasSubstr("d_model: 16"));
}

// The fault-injection variables are checked against the run before its directory exists: a
// malformed one used to create the run directory first, and a layer or rank beyond the model or
// the job (or one past 2^31, which wrapped) silently injected nothing.
TEST_F(NfLaunchCliTest, AnInjectionThatCannotHappenIsRefusedBeforeTheRunDirectory) {
  const std::filesystem::path run = dir_ / "run";
  for (const auto& [variable, value, mention] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"NF_INJECT_NAN", "x", "NF_INJECT_NAN='x' must be STEP:LAYER:TP_RANK"},
           {"NF_INJECT_NAN", "2:4294967296:0", "must be STEP:LAYER:TP_RANK"},
           {"NF_INJECT_NAN", "2:1:0", "NF_INJECT_NAN names layer 1 but model.num_layers is 1"},
           {"NF_INJECT_NAN", "2:0:1", "names tensor-parallel rank 1 but parallel.tensor_parallel"},
           {"NF_INJECT_DESYNC", "1:2", "NF_INJECT_DESYNC names world rank 1 but the job's world"},
       }) {
    SCOPED_TRACE(variable + "=" + value);
    setenv(variable.c_str(), value.c_str(), 1);
    const Outcome outcome = Launch({"--config", TinyConfig(), "--run-dir", run.string()});
    unsetenv(variable.c_str());
    ExpectConfigurationError(outcome, {mention}, /*usage_hint=*/false);
    EXPECT_FALSE(std::filesystem::exists(run));
  }
}

// Links planted at the names a run writes its files under reach no checkpoint: a symbolic link
// at checkpoints/latest.tmp to an older checkpoint's manifest and a hard link at
// RUN/config.pbtxt.tmp to another's used to be truncated and written through at the next save
// (and `latest` became the link). A link at an append-only log is refused, naming it.
TEST_F(NfLaunchCliTest, LinksAtTheRunsFileNamesReachNoCheckpoint) {
  const std::filesystem::path run = dir_ / "run", checkpoints = run / "checkpoints";
  const std::vector<std::string> every_step = {"--set", "checkpoint.save_interval=1", "--set",
                                               "checkpoint.keep_last=10"};
  std::vector<std::string> args = {"--config", TinyConfig(), "--run-dir", run.string()};
  args.insert(args.end(), every_step.begin(), every_step.end());
  ASSERT_EQ(Launch(args).exit_code, 0);
  const std::map<std::string, std::string> saved = FilesUnder(checkpoints);
  std::filesystem::create_symlink(checkpoints / "iter_0000001" / "manifest.pb",
                                  checkpoints / "latest.tmp");
  std::filesystem::create_hard_link(checkpoints / "iter_0000002" / "manifest.pb",
                                    run / "config.pbtxt.tmp");
  args.insert(args.end(), {"--set", "train.train_iters=5"});
  const Outcome resumed = Launch(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::map<std::string, std::string> after = FilesUnder(checkpoints);
  for (const auto& [name, contents] : saved) {
    if (name == "latest") continue;
    EXPECT_EQ(after.at(name), contents) << name;
  }
  EXPECT_FALSE(std::filesystem::is_symlink(checkpoints / "latest"));
  EXPECT_EQ(after.at("latest"), "iter_0000005\n");
  EXPECT_TRUE(std::filesystem::is_symlink(checkpoints / "latest.tmp"));

  std::filesystem::remove(run / "log.jsonl");
  std::filesystem::create_symlink(checkpoints / "iter_0000003" / "manifest.pb", run / "log.jsonl");
  args.back() = "train.train_iters=6";
  const Outcome refused = Launch(args);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(Lines(refused.err),
            std::vector<std::string>{absl::StrCat(
                "nf-launch: log ", (run / "log.jsonl").string(),
                " is a symbolic link: appending would write where it points; remove it (a new one "
                "is created)")});
  EXPECT_EQ(FilesUnder(checkpoints).at("iter_0000003/manifest.pb"),
            saved.at("iter_0000003/manifest.pb"));
}

// Progress counters are int64 products of the step count, the batch and the sequence length: a
// train_iters that would overflow them is refused before anything runs (it used to run, save a
// checkpoint that verify refused, and fail to resume).
TEST_F(NfLaunchCliTest, AStepCountThatWouldOverflowTheCountersIsRefused) {
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "train.train_iters=576460752303423488",
              "--run-dir", (dir_ / "run").string()}),
      {"train.train_iters (576460752303423488) x train.global_batch_size (4) x train.seq_len (8) "
       "exceeds 2^53 tokens"},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

// A run directory inside a checkpoint (or a run's checkpoints directory) is refused: the run's
// files would land among a checkpoint's.
TEST_F(NfLaunchCliTest, ARunDirectoryInsideACheckpointIsRefused) {
  const std::string run_dir = (dir_ / "run").string();
  ASSERT_EQ(Launch({"--config", TinyConfig(), "--run-dir", run_dir}).exit_code, 0);
  const std::filesystem::path checkpoints = dir_ / "run" / "checkpoints";
  for (const std::filesystem::path& inside :
       {checkpoints / "iter_0000003" / "again", checkpoints / "another"}) {
    ExpectConfigurationError(Launch({"--config", TinyConfig(), "--run-dir", inside.string()}),
                             {absl::StrCat("--run-dir ", inside.string(), " is inside ")},
                             /*usage_hint=*/false);
    EXPECT_FALSE(std::filesystem::exists(inside));
  }
}

// A run directory another live nf-launch holds is refused at once, naming the holder.
TEST_F(NfLaunchCliTest, ASecondRunInALiveRunDirectoryIsRefused) {
  auto held = RunDirLock::Acquire(dir_ / "busy");
  NF_ASSERT_OK(held);
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--run-dir", (dir_ / "busy").string()}),
      {absl::StrCat("run directory ", (dir_ / "busy").string(),
                    " is in use by another nf-launch (pid ", getpid(),
                    "): wait for it to end or choose another --run-dir")},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "busy" / "log.jsonl"));
}

// fp32 gradients that are not finite cannot recover: the run stops at once with exit code 1,
// saying why and which checkpoint is the last good one, and saves nothing more. lr 1e37 makes
// step 1's update huge but finite (~1e37, saved at step 1), so step 2's gradients overflow.
TEST_F(NfLaunchCliTest, NonFiniteGradientsStopTheRunKeepingTheLastCheckpoint) {
  const Outcome outcome = Launch({"--config", TinyConfig(), "--set", "train.train_iters=6", "--set",
                                  "checkpoint.save_interval=1", "--set", "train.optimizer.lr=1e37",
                                  "--run-dir", (dir_ / "run").string()});
  EXPECT_EQ(outcome.exit_code, 1);
  const std::vector<std::string> err = Lines(outcome.err);
  ASSERT_EQ(err.size(), 1u) << outcome.err;
  EXPECT_THAT(err[0], HasSubstr("non-finite gradients at step "));
  EXPECT_THAT(err[0], HasSubstr("(FP32): stopping; the last good checkpoint is "));
  const std::string latest = ReadFile(dir_ / "run" / "checkpoints" / "latest");
  EXPECT_THAT(err[0], HasSubstr(latest.substr(0, latest.size() - 1)));
}

// The same stop with an async save in flight (bf16: the first non-finite step stops the run, the
// step after the save): the save is committed before the run ends, so the message names it and
// nothing half-written (iter_*.tmp) is left. Before, the run said "(none ...)" and left only the
// staging directory.
TEST_F(NfLaunchCliTest, AStopCommitsTheAsyncSaveInFlightAndNamesIt) {
  const Outcome outcome =
      Launch({"--config", TinyConfig(), "--set", "train.train_iters=6", "--set",
              "train.precision=BF16", "--set", "train.optimizer.lr=1e6", "--set",
              "train.lr_schedule.warmup_iters=0", "--set", "checkpoint.save_interval=1", "--set",
              "checkpoint.async_save=true", "--run-dir", (dir_ / "run").string()});
  EXPECT_EQ(outcome.exit_code, 1);
  const std::vector<std::string> err = Lines(outcome.err);
  ASSERT_EQ(err.size(), 1u) << outcome.err;
  EXPECT_THAT(err[0], HasSubstr("(BF16): stopping; the last good checkpoint is "));
  const std::filesystem::path checkpoints = dir_ / "run" / "checkpoints";
  ASSERT_TRUE(std::filesystem::exists(checkpoints / "latest")) << outcome.err;
  const std::string latest = ReadFile(checkpoints / "latest");
  EXPECT_THAT(err[0], HasSubstr((checkpoints / latest.substr(0, latest.size() - 1)).string()));
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".tmp")));
  }
}

// An update that would itself overflow (lr 1e38: the step size lr / (1 - beta1) is inf in fp32)
// is skipped before it writes anything: with fp32 the run stops at that step, saying so, and
// saves no checkpoint of infinities; the log names the reason.
TEST_F(NfLaunchCliTest, AnOverflowingUpdateStopsTheRunBeforeItIsApplied) {
  const Outcome outcome = Launch({"--config", TinyConfig(), "--set", "train.train_iters=6", "--set",
                                  "checkpoint.save_interval=1", "--set", "train.optimizer.lr=1e38",
                                  "--run-dir", (dir_ / "run").string()});
  EXPECT_EQ(outcome.exit_code, 1);
  const std::vector<std::string> err = Lines(outcome.err);
  ASSERT_EQ(err.size(), 1u) << outcome.err;
  EXPECT_THAT(err[0], HasSubstr("an update overflowing the model dtype at step 1 (FP32): "
                                "stopping; the last good checkpoint is (none"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run" / "checkpoints" / "iter_0000001"));
  const std::vector<std::string> log = Lines(ReadFile(dir_ / "run" / "log.jsonl"));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("\"skipped\":true"));
  EXPECT_THAT(log[0], HasSubstr("\"skip_reason\":\"update_overflow\""));
}

// --dry-run plans without training: the resolved configuration, the layout, FLOPs and one
// memory row per pipeline rank; a layout that cannot run is refused with the reason.
TEST_F(NfLaunchCliTest, DryRunPlansALayoutOrRefusesIt) {
  const std::string config = TinyConfig();
  const Outcome plan = Launch({"--config", config, "--set", "model.num_layers=4", "--set",
                               "parallel.pipeline_parallel=2", "--world-size", "4", "--dry-run"});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("train_iters: 3"));  // the resolved configuration
  EXPECT_THAT(plan.out, HasSubstr("dry run: 4 ranks = tensor_parallel 1 x pipeline_parallel 2 x "
                                  "data_parallel 2, ONE_F_ONE_B"));
  EXPECT_THAT(plan.out, HasSubstr("| 0 | [0, 2) | "));
  EXPECT_THAT(plan.out, HasSubstr("| 1 | [2, 4) | "));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));

  ExpectConfigurationError(
      Launch({"--config", config, "--set", "parallel.pipeline_parallel=2", "--dry-run"}),
      {"model.num_layers (1) does not split into pipeline_parallel 2"}, /*usage_hint=*/false);
}

// A dataset that does not exist is refused before anything starts, naming the field.
TEST_F(NfLaunchCliTest, AMisspeltOpTimingRequestIsRefused) {
  setenv("NF_OP_TIMING", "yes", 1);
  const Outcome outcome = Launch({"--config", TinyConfig(), "--run-dir", (dir_ / "run").string()});
  unsetenv("NF_OP_TIMING");
  ExpectConfigurationError(
      outcome, {"NF_OP_TIMING=yes is not a choice: 1 times every op, 0 or unset times none"},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST_F(NfLaunchCliTest, AThreadCountThatIsNotANumberIsRefused) {
  for (const char* bad : {"two", "0", "-4", "8x"}) {
    setenv("NF_NUM_THREADS", bad, 1);
    const Outcome outcome =
        Launch({"--config", TinyConfig(), "--run-dir", (dir_ / "run").string()});
    unsetenv("NF_NUM_THREADS");
    ExpectConfigurationError(
        outcome, {absl::StrCat("NF_NUM_THREADS=", bad, " is not a positive number of threads")},
        /*usage_hint=*/false);
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST_F(NfLaunchCliTest, MissingDatasetIsRefusedNamingTheField) {
  const std::string prefix = (dir_ / "no_such_corpus").string();
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "data.path=" + prefix, "--run-dir",
              (dir_ / "run").string()}),
      {absl::StrCat("data.path '", prefix, "': ", prefix,
                    ".idx does not exist (nf-preprocess --output-prefix ", prefix, " writes it)")},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST_F(NfLaunchCliTest, DatasetFileThatIsADirectoryIsRefusedBeforeAnyWork) {
  const std::string prefix = (dir_ / "corpus").string();
  std::filesystem::create_directory(prefix + ".idx");
  WriteConfig("corpus.bin", "");
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "data.path=" + prefix, "--run-dir",
              (dir_ / "run").string()}),
      {absl::StrCat("data.path '", prefix, "': ", prefix, ".idx is not a regular file")},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

// 10^14 steps of 4 samples: a sample index of 24 bytes a sample (8.5 PiB) no machine holds,
// refused by the memory check before anything is written (it used to end in std::bad_alloc
// once the run directory was taken). The files only need to exist: the check comes first.
TEST_F(NfLaunchCliTest, ASampleIndexTooBigIsRefusedByTheMemoryCheck) {
  const std::string prefix = (dir_ / "corpus").string();
  WriteConfig("corpus.idx", "");
  WriteConfig("corpus.bin", "");
  ExpectConfigurationError(
      Launch({"--config", TinyConfig(), "--set", "data.path=" + prefix, "--set",
              "train.train_iters=100000000000000", "--run-dir", (dir_ / "run").string()}),
      {"not enough host memory of node ",
       "sample index 8940696.72 GiB (train.train_iters x train.global_batch_size samples)"},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST_F(NfLaunchCliTest, CudaDeviceWithoutAGpuIsRefusedBeforeAnyWork) {
  const Outcome outcome = Launch({"--config", TinyConfig(), "--set", "train.device=CUDA",
                                  "--run-dir", (dir_ / "run").string()});
  if (ops::GpuCount() > 0) {  // a GPU machine trains (tests/gpu checks what it computes)
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    return;
  }
  ExpectConfigurationError(outcome, {"train.device: CUDA, but this process sees no GPU"},
                           /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

// A model no machine holds: about 53 trillion parameters (12 x 64 layers x 262144^2 + ...),
// whose fp32 parameter buffer alone (211 TB) exceeds the 128 TiB of address space x86-64 (with
// 4-level page tables) gives a process, so that allocating it fails whatever the machine's
// overcommit policy.
std::vector<std::string> AbsurdModel() {
  return {"--set", "model.d_model=262144", "--set", "model.ffn_dim=1048576",
          "--set", "model.num_layers=64",  "--set", "model.num_heads=64"};
}

TEST_F(NfLaunchCliTest, AModelTooBigForTheMachineIsRefusedBeforeAnyWork) {
  std::vector<std::string> args = {"--config", TinyConfig(), "--run-dir", (dir_ / "run").string()};
  for (const std::string& arg : AbsurdModel()) args.push_back(arg);
  ExpectConfigurationError(
      Launch(args),
      {"not enough host memory of node ", ": this rank needs an estimated ",
       "(one rank: parameters ", "GiB is available (", "model.d_model, model.ffn_dim",
       "train.micro_batch_size x train.seq_len", "nf-launch --skip-memory-check starts anyway"},
      /*usage_hint=*/false);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run")) << "not even the lock is left";
}

TEST_F(NfLaunchCliTest, SkipMemoryCheckStartsAnyway) {
  std::vector<std::string> args = {"--config", TinyConfig(), "--run-dir", (dir_ / "run").string(),
                                   "--skip-memory-check"};
  for (const std::string& arg : AbsurdModel()) args.push_back(arg);
  const Outcome outcome = Launch(args);
  // Past the check, the allocation itself fails, as it did before the check existed.
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_THAT(outcome.err, HasSubstr("out of host memory allocating"));
  EXPECT_THAT(outcome.err, Not(HasSubstr("not enough host memory")));
}

TEST_F(NfLaunchCliTest, ASmallModelPassesTheMemoryCheck) {
  const Outcome outcome = Launch({"--config", TinyConfig(), "--run-dir", (dir_ / "run").string()});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.err, "");
}

}  // namespace
}  // namespace nf::launcher
