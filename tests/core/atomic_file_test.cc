// The one writer every tool writes through (core/files/): whatever a hostile user plants at the
// names it writes (a symbolic link or a hard link to a file worth keeping, a file or directory of
// their own under the temporary's old fixed name "NAME.tmp"), nothing but the target changes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/files/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("atomic_file_test_", getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    victim_ = dir_ / "victim";  // stands for a checkpoint's manifest.pb
    std::ofstream(victim_) << "precious";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Links to the victim at `target`.tmp and at the temporary names this process would try first
  // (NAME.tmp-PID-N for the next counters): symbolic and hard, alternately.
  void PlantLinks(const fs::path& target) {
    std::vector<fs::path> names = {target.string() + ".tmp"};
    for (int n = 0; n < 64; ++n)
      names.push_back(absl::StrCat(target.string(), ".tmp-", getpid(), "-", n));
    for (size_t i = 0; i < names.size(); ++i) {
      if (i % 2 == 0) {
        fs::create_symlink(victim_, names[i]);
      } else {
        fs::create_hard_link(victim_, names[i]);
      }
    }
  }

  // The directory's entries, sorted.
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_, victim_;
};

TEST_F(AtomicFileTest, LinksAtTheTemporaryNamesReachNothing) {
  const fs::path target = dir_ / "latest";
  PlantLinks(target);
  const std::vector<std::string> planted = Entries();
  NF_ASSERT_OK(ReplaceFileAtomically(target, "iter_0000002\n"));
  NF_ASSERT_OK(ReplaceFileAtomically(target, "iter_0000003\n"));
  EXPECT_EQ(Read(victim_), "precious");
  EXPECT_EQ(Read(target), "iter_0000003\n");
  EXPECT_FALSE(fs::is_symlink(target));
  // Only the target was added; every planted name is still there, unchanged.
  std::vector<std::string> expected = planted;
  expected.push_back("latest");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(Entries(), expected);
}

// A link at the target itself is replaced, never written through.
TEST_F(AtomicFileTest, ALinkAtTheTargetIsReplacedNotWrittenThrough) {
  fs::create_symlink(victim_, dir_ / "report.json");
  fs::create_hard_link(victim_, dir_ / "hard.json");
  NF_ASSERT_OK(ReplaceFileAtomically(dir_ / "report.json", "{}"));
  NF_ASSERT_OK(ReplaceFileAtomically(dir_ / "hard.json", "{}"));
  EXPECT_EQ(Read(victim_), "precious");
  EXPECT_FALSE(fs::is_symlink(dir_ / "report.json"));
  EXPECT_EQ(Read(dir_ / "report.json"), "{}");
  EXPECT_EQ(Read(dir_ / "hard.json"), "{}");
}

// A user's own NAME.tmp (a file, a directory with notes) is neither truncated nor removed, by a
// commit or by a writer abandoned half way.
TEST_F(AtomicFileTest, AUsersOwnTmpIsLeftAlone) {
  const fs::path out = dir_ / "x.safetensors";
  std::ofstream(out.string() + ".tmp") << "mine";
  {
    absl::StatusOr<AtomicFileWriter> abandoned = AtomicFileWriter::Create(out);
    NF_ASSERT_OK(abandoned);
    NF_ASSERT_OK(abandoned->Append("half", 4));
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"victim", "x.safetensors.tmp"}));
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(out);
  NF_ASSERT_OK(writer);
  NF_ASSERT_OK(writer->Append("whole", 5));
  NF_ASSERT_OK(writer->Commit(OnCommit::kNoReplace));
  EXPECT_EQ(Read(out), "whole");
  EXPECT_EQ(Read(out.string() + ".tmp"), "mine");

  const fs::path converted = dir_ / "p";
  fs::create_directory(dir_ / "p.tmp");
  std::ofstream(dir_ / "p.tmp" / "n") << "notes";
  {
    absl::StatusOr<StagingDirectory> abandoned = StagingDirectory::Create(converted);
    NF_ASSERT_OK(abandoned);
    std::ofstream(abandoned->path() / "rank_00000.shard") << "partial";
  }
  absl::StatusOr<StagingDirectory> staging = StagingDirectory::Create(converted);
  NF_ASSERT_OK(staging);
  std::ofstream(staging->path() / "manifest.pb") << "m";
  NF_ASSERT_OK(staging->Commit());
  EXPECT_EQ(Read(converted / "manifest.pb"), "m");
  EXPECT_EQ(Read(dir_ / "p.tmp" / "n"), "notes");
  EXPECT_EQ(Entries(), (std::vector<std::string>{"p", "p.tmp", "victim", "x.safetensors",
                                                 "x.safetensors.tmp"}));
}

// kNoReplace: what appeared at the target while the file was written is kept, and the
// temporary goes.
TEST_F(AtomicFileTest, ANewOutputNeverReplacesWhatAppearedMeanwhile) {
  const fs::path out = dir_ / "model.safetensors";
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(out);
  NF_ASSERT_OK(writer);
  NF_ASSERT_OK(writer->Append("new", 3));
  fs::create_symlink(victim_, out);
  const absl::Status committed = writer->Commit(OnCommit::kNoReplace);
  EXPECT_TRUE(absl::IsAlreadyExists(committed)) << committed;
  EXPECT_THAT(std::string(committed.message()), HasSubstr("it appeared while writing"));
  EXPECT_TRUE(fs::is_symlink(out));
  EXPECT_EQ(Read(victim_), "precious");

  const fs::path converted = dir_ / "converted";
  absl::StatusOr<StagingDirectory> staging = StagingDirectory::Create(converted);
  NF_ASSERT_OK(staging);
  fs::create_directory(converted);
  EXPECT_TRUE(absl::IsAlreadyExists(staging->Commit()));
  EXPECT_TRUE(fs::is_empty(converted));
}

TEST_F(AtomicFileTest, DurableWriterCreatesOnlyNewFiles) {
  const absl::StatusOr<DurableWriter> over_file = DurableWriter::Create(victim_);
  EXPECT_TRUE(absl::IsAlreadyExists(over_file.status())) << over_file.status();
  fs::create_symlink(dir_ / "nowhere", dir_ / "dangling");
  EXPECT_TRUE(absl::IsAlreadyExists(DurableWriter::Create(dir_ / "dangling").status()));
  EXPECT_FALSE(fs::exists(dir_ / "nowhere"));
  EXPECT_EQ(Read(victim_), "precious");
}

// An append-only file (a run's log.jsonl, its .lock) is opened only when this is its one name.
TEST_F(AtomicFileTest, AppendingRefusesLinks) {
  fs::create_symlink(victim_, dir_ / "log.jsonl");
  fs::create_hard_link(victim_, dir_ / "validation.jsonl");
  const absl::StatusOr<int> symbolic = OpenForAppend(dir_ / "log.jsonl", O_WRONLY, "log");
  EXPECT_THAT(std::string(symbolic.status().message()), HasSubstr("is a symbolic link"));
  const absl::StatusOr<int> hard = OpenForAppend(dir_ / "validation.jsonl", O_WRONLY, "log");
  EXPECT_THAT(std::string(hard.status().message()), HasSubstr("has 2 names (hard links)"));
  const absl::StatusOr<int> plain = OpenForAppend(dir_ / "samples.jsonl", O_WRONLY, "log");
  NF_ASSERT_OK(plain);
  ASSERT_EQ(::write(*plain, "x\n", 2), 2);
  ::close(*plain);
  EXPECT_EQ(Read(dir_ / "samples.jsonl"), "x\n");
  EXPECT_EQ(Read(victim_), "precious");
}

}  // namespace
}  // namespace nf
