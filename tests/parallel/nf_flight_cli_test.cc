// nf-flight, the binary, on run directories a hostile or careless user hands it: malformed
// records (counts that overflow an int or would allocate gigabytes, ranks out of range or not
// integers, a peer past the world), records of two runs mixed in one RUN/flight, a forged
// future time, and --request paths the file system refuses. Each must end in exit code 1 and one
// line on stderr naming the file and the field, never a crash, an uncaught exception or a
// misleading analysis.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli_util.h"
#include "parallel/flight_recorder.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kSecond = 1'000'000'000;

// The launch every record of a test is of, unless it says otherwise.
int64_t RunStarted() {
  static const int64_t started = WallClockNanos() - 60 * kSecond;
  return started;
}

// The header of a rank's record; the JSON texts are spliced in as written, so that a test can
// put any literal (2147483648, 1e300) where a number belongs.
struct Header {
  int rank = 0;
  std::string world_size = "2";
  std::string ranks = "[0,1]";
  int64_t time_ns = WallClockNanos() - 2 * kSecond;
  int64_t run_started_ns = RunStarted();
  std::string reason = "watchdog: rank 0: all_reduce did not complete";
};

std::string HeaderLine(const Header& h) {
  return absl::StrFormat(
      R"({"rank":%d,"world_size":%s,"run_started_ns":%d,"label":"rank %d","host":"node0",)"
      R"("reason":"%s","time_ns":%d,"step":3,"capacity":4096,"dropped":0,"stalls":[],)"
      R"("groups":[{"group":"world","backend":"mpi","ranks":%s}]})"
      "\n",
      h.rank, h.world_size, h.run_started_ns, h.rank, h.reason, h.time_ns, h.ranks);
}

// An operation's line: an all-reduce waiting on the world group, or a receive from `peer`.
std::string EntryLine(int64_t issued_ns, const std::string& op = "all_reduce",
                      const std::string& peer = "-1") {
  return absl::StrFormat(
      R"({"id":1,"group":"world","backend":"mpi","seq":5,"op":"%s","peer":%s,"bytes":8,)"
      R"("dtype":"f32","step":3,"state":"waiting","issued_ns":%d,"waiting_ns":%d,)"
      R"("completed_ns":0})"
      "\n",
      op, peer, issued_ns, issued_ns);
}

class NfFlightCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("nf_flight_cli_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "run" / "flight");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path RecordPath(int rank) const {
    return dir_ / "run" / "flight" / absl::StrFormat("rank_%05d.jsonl", rank);
  }
  void Write(int rank, const std::string& text) const { std::ofstream(RecordPath(rank)) << text; }
  // A healthy record of `header.rank`, waiting in all-reduce #5.
  void WriteRecord(const Header& header) const {
    Write(header.rank, HeaderLine(header) + EntryLine(header.time_ns - kSecond));
  }

  testing::Outcome Run(const std::vector<std::string>& args) const {
    return testing::RunProgram(NF_FLIGHT_BINARY, args, dir_);
  }
  testing::Outcome Analyze() const { return Run({(dir_ / "run").string()}); }

  // The refusal every malformed input must end in: exit code 1 and one line naming `file`
  // and `what`.
  static void ExpectRefused(const testing::Outcome& o, const std::string& file,
                            const std::string& what) {
    EXPECT_EQ(o.exit_code, 1) << o.err;
    ASSERT_EQ(testing::Lines(o.err).size(), 1u) << o.err;
    EXPECT_THAT(o.err, HasSubstr(file));
    EXPECT_THAT(o.err, HasSubstr(what));
    EXPECT_EQ(o.out, "");
  }

  fs::path dir_;
};

TEST_F(NfFlightCliTest, TwoHealthyRecordsAreAnalyzed) {
  WriteRecord({.rank = 0});
  WriteRecord({.rank = 1, .reason = "requested: rank 0"});
  const testing::Outcome o = Analyze();
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("2 rank(s), 2 record(s)"));
}

// Old: SIGSEGV (2147483648), uncaught bad_alloc (2000000000), 1e8 RankViews (killed at 19.7 GB)
// and, for 2^32 + 1 cast to an int of 1, a heap-buffer-overflow and "1 rank(s)".
TEST_F(NfFlightCliTest, AWorldSizeOutOfRangeIsRefused) {
  for (const std::string size : {"2147483648", "2000000000", "100000000", "4294967297"}) {
    WriteRecord({.rank = 1, .world_size = size});
    ExpectRefused(Analyze(), "rank_00001.jsonl:1", absl::StrCat("'world_size' is ", size));
  }
  WriteRecord({.rank = 1, .world_size = "1e8"});
  ExpectRefused(Analyze(), "rank_00001.jsonl:1", "'world_size' is not an integer");
}

// Old: SIGSEGV (AddressSanitizer: use-after-free in flight_analysis.cc) for both.
TEST_F(NfFlightCliTest, AGroupRankOutOfRangeOrNotAnIntegerIsRefused) {
  WriteRecord({.rank = 0, .ranks = "[-7,0]"});
  ExpectRefused(Analyze(), "rank_00000.jsonl:1", "a rank of group 'world' is -7, outside [0, 1]");
  WriteRecord({.rank = 0, .ranks = "[1e300,0]"});
  ExpectRefused(Analyze(), "rank_00000.jsonl:1", "a rank of group 'world' is not an integer");
}

// Old: "waits for rank 1215752191" (the peer cut to an int).
TEST_F(NfFlightCliTest, APeerOutsideTheWorldIsRefused) {
  const Header header = {.rank = 0};
  Write(0, HeaderLine(header) + EntryLine(header.time_ns - kSecond, "recv", "99999999999"));
  ExpectRefused(Analyze(), "rank_00000.jsonl:2", "'peer' is 99999999999, outside [0, 1]");
}

// Old: the records of a world of 4 and one of 2 merged: ranks 2 and 3 "never answered".
TEST_F(NfFlightCliTest, RecordsOfTwoWorldsAreRefused) {
  WriteRecord({.rank = 0});
  WriteRecord({.rank = 1});
  WriteRecord({.rank = 2,
               .world_size = "4",
               .ranks = "[0,1,2,3]",
               .time_ns = WallClockNanos() - 3600 * kSecond});
  const testing::Outcome o = Analyze();
  ExpectRefused(o, "rank_00002.jsonl", "are records of different runs ('world_size' 2 against 4");
  EXPECT_THAT(o.err, HasSubstr("rank_00002.jsonl is the older"));
  EXPECT_THAT(o.err, Not(HasSubstr("never answered")));
}

// A requeued job's restart: rank 1 (a lost node) wrote nothing in the latest launch, and its
// record of the earlier launch is still there. Old: merged as one job, rank 1 read as a stale
// rank of this launch. Now it is set aside, said so, and rank 1 has no record of this launch.
TEST_F(NfFlightCliTest, RecordsOfAnEarlierLaunchOfTheRunAreSetAside) {
  WriteRecord({.rank = 0});
  WriteRecord({.rank = 1, .run_started_ns = WallClockNanos() - 7200 * kSecond});
  const testing::Outcome o = Analyze();
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("set aside 1 record(s) of an earlier launch of this run (" +
                               RecordPath(1).string() + ")"));
  EXPECT_THAT(o.out, HasSubstr("2 rank(s), 1 record(s)"));
}

// --request writes RUN/flight/REQUEST: never inside a checkpoint, here one whose flight/ a user
// made. Old: the request file was written there.
TEST_F(NfFlightCliTest, ARequestIntoACheckpointIsRefused) {
  const fs::path checkpoint = dir_ / "run" / "checkpoints" / "iter_0000004";
  fs::create_directories(checkpoint / "flight");
  std::ofstream(checkpoint / "manifest.pb") << "m";
  const testing::Outcome o = Run({"--request", checkpoint.string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_EQ(testing::Lines(o.err).size(), 1u) << o.err;
  EXPECT_THAT(o.err, HasSubstr("is inside checkpoint " + checkpoint.string()));
  EXPECT_FALSE(fs::exists(checkpoint / "flight" / "REQUEST"));
}

// Old: rank 0's record, an hour "older" than the forged one, was named stale (silent).
TEST_F(NfFlightCliTest, AFutureTimeIsRefusedNotBelieved) {
  WriteRecord({.rank = 0});
  WriteRecord({.rank = 1, .time_ns = WallClockNanos() + 3600 * kSecond});
  const testing::Outcome o = Analyze();
  ExpectRefused(o, "rank_00001.jsonl:1", "'time_ns' is ");
  EXPECT_THAT(o.err, HasSubstr("after this machine's clock"));
}

// Old: an uncaught std::filesystem::filesystem_error (abort) for both.
TEST_F(NfFlightCliTest, RequestOnAPathTheFileSystemRefusesIsOneLine) {
  const std::string long_name(300, 'r');
  testing::Outcome o = Run({"--request", (dir_ / long_name).string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_EQ(testing::Lines(o.err).size(), 1u) << o.err;
  EXPECT_THAT(o.err, HasSubstr("is not a directory (File name too long)"));

  fs::create_symlink(dir_ / "loop_b", dir_ / "loop_a");
  fs::create_symlink(dir_ / "loop_a", dir_ / "loop_b");
  o = Run({"--request", (dir_ / "loop_a").string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_EQ(testing::Lines(o.err).size(), 1u) << o.err;
  EXPECT_THAT(o.err, HasSubstr("loop_a/flight is not a directory (Too many levels of symbolic"));

  o = Run({(dir_ / long_name).string()});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_EQ(testing::Lines(o.err).size(), 1u) << o.err;
}

}  // namespace
}  // namespace nf::parallel
