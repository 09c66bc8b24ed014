// Tests of parallel/flight_records.h (a rank's record read as hostile input: every count and
// value checked, records of one run only) and of what parallel/flight_analysis.h does with what
// passes: lines bounded by the records, whatever the world size, and no control character of a
// record reaching the terminal. The binary on malformed run directories: nf_flight_cli_test.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/flight_analysis.h"
#include "parallel/flight_records.h"
#include "parallel/local_communicator.h"
#include "parallel/run_start.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kNow = 1'800'000'000 * kSecond;

// A record's header with `groups` (JSON) and `extra` members spliced in.
std::string Header(int rank, int world, const std::string& groups, const std::string& extra = "") {
  return absl::StrFormat(
      R"({"rank":%d,"world_size":%d,"label":"","host":"node0","reason":"requested: x",)"
      R"("time_ns":%d,"step":3,"stalls":[],"groups":[%s]%s})"
      "\n",
      rank, world, kNow - kSecond, groups, extra);
}

std::string WorldGroup(const std::string& ranks) {
  return absl::StrCat(R"({"group":"world","backend":"mpi","ranks":)", ranks, "}");
}

absl::Status Parsed(const std::string& text) {
  return ParseFlightRecord(text, "rank_00000.jsonl", kNow).status();
}

TEST(FlightRecordsTest, ValuesOutOfRangeAreRefusedNamingTheField) {
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,0]"))).message(),
              HasSubstr("rank_00000.jsonl:1: a rank of group 'world' is 0 twice"));
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,2]"))).message(),
              HasSubstr("a rank of group 'world' is 2, outside [0, 1]"));
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,1,1,0]"))).message(),
              HasSubstr("'ranks' has 4 items, more than 2"));
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,1]"), R"(,"stalls":[{"start_ns":5,"end_ns":4}])"))
                  .message(),
              HasSubstr("a stall ends before it starts"));
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,1]"), R"(,"run_started_ns":-1)")).message(),
              HasSubstr("'run_started_ns' is -1, before 1970"));
  // A minute of clock skew between nodes is tolerated; more is refused.
  NF_EXPECT_OK(Parsed(Header(0, 2, WorldGroup("[0,1]"),
                             absl::StrCat(R"(,"run_started_ns":)", kNow + 50 * kSecond))));
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,1]"),
                            absl::StrCat(R"(,"run_started_ns":)", kNow + 70 * kSecond)))
                  .message(),
              HasSubstr("'run_started_ns' is 2027-01-15 08:01:10.000 UTC, after this machine's "
                        "clock (2027-01-15 08:00:00.000 UTC) by more than 1m"));
  const std::string entry = absl::StrFormat(
      R"({"id":1,"group":"world","backend":"mpi","seq":5,"op":"send","peer":-1,"bytes":8,)"
      R"("dtype":"f32","step":3,"state":"waiting","issued_ns":%d,"waiting_ns":0,)"
      R"("completed_ns":0})"
      "\n",
      kNow - 2 * kSecond);
  EXPECT_THAT(Parsed(Header(0, 2, WorldGroup("[0,1]")) + entry).message(),
              HasSubstr("rank_00000.jsonl:2: 'peer' is -1, outside [0, 1]"));
}

TEST(FlightRecordsTest, LinesTooLongAreRefusedBeforeTheyAreParsed) {
  const std::string label(kMaxFlightHeaderBytes, 'x');
  EXPECT_THAT(
      Parsed(Header(0, 1, WorldGroup("[0]"), absl::StrCat(R"(,"note":")", label, "\""))).message(),
      HasSubstr("rank_00000.jsonl:1: a line of "));
  EXPECT_THAT(
      Parsed(Header(0, 1, WorldGroup("[0]")) + "{\"id\":\"" + std::string(5000, 'y') + "\"}\n")
          .message(),
      HasSubstr("rank_00000.jsonl:2: a line of 5009 bytes, more than 4096"));
}

FlightRecord Record(int rank, int world, std::vector<FlightGroup> groups) {
  FlightRecord r;
  r.file = absl::StrFormat("rank_%05d.jsonl", rank);
  r.rank = rank;
  r.world_size = world;
  r.time_ns = kNow;
  r.groups = std::move(groups);
  return r;
}

TEST(FlightRecordsTest, RecordsThatCannotBeOfOneRunAreNotMerged) {
  const FlightGroup world = {.group = "world", .backend = "mpi", .world_ranks = {0, 1, 2}};
  NF_EXPECT_OK(MergeFlightRecords({Record(2, 3, {world}), Record(0, 3, {world})}));

  EXPECT_THAT(MergeFlightRecords({Record(1, 3, {world}), Record(1, 3, {world})}).status().message(),
              HasSubstr("rank_00001.jsonl and rank_00001.jsonl are both rank 1's record"));
  // Rank 2's record says its dp group is {1, 2}; rank 0's says rank 2's dp is {0, 2}.
  const FlightGroup dp02 = {.group = "dp", .backend = "mpi", .world_ranks = {0, 2}};
  const FlightGroup dp12 = {.group = "dp", .backend = "mpi", .world_ranks = {1, 2}};
  EXPECT_THAT(MergeFlightRecords({Record(0, 3, {dp02}), Record(2, 3, {dp12})}).status().message(),
              HasSubstr("rank_00000.jsonl lists group dp/mpi of rank 2 as ranks [0, 2], "
                        "rank_00002.jsonl as ranks [1, 2]"));
  // A process that trained twice lists the groups of both trainings: its latest are its own.
  const FlightGroup dp01 = {.group = "dp", .backend = "mpi", .world_ranks = {0, 1}};
  NF_EXPECT_OK(MergeFlightRecords({Record(0, 3, {dp02, dp01}), Record(1, 3, {dp01})}));
}

class ReadFlightRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("flight_records_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

// Old: read as rank 1's (a second "rank 1" replaced the first in the analysis).
TEST_F(ReadFlightRecordsTest, ARecordWhoseRankIsNotItsFileNameIsRefused) {
  const std::string record = absl::StrFormat(
      R"({"rank":1,"world_size":4,"label":"","host":"h","reason":"r","time_ns":%d,"step":3,)"
      R"("groups":[]})"
      "\n",
      WallClockNanos() - kSecond);
  std::ofstream(dir_ / "rank_00003.jsonl") << record;
  std::ofstream(dir_ / "rank_00003.jsonl.tmp-12-0") << "a writer's temporary: not a record";
  EXPECT_THAT(ReadFlightRecords(dir_).status().message(),
              HasSubstr("rank_00003.jsonl:1: 'rank' is 1, not the file name's 3"));
  fs::rename(dir_ / "rank_00003.jsonl", dir_ / "rank_00001.jsonl");
  const auto records = ReadFlightRecords(dir_);
  NF_ASSERT_OK(records);
  EXPECT_EQ(records->size(), 1u);
}

// Old: the read blocked until a writer opened the FIFO (nf-flight hung).
TEST_F(ReadFlightRecordsTest, ARecordThatIsNotARegularFileIsRefused) {
  ASSERT_EQ(mkfifo((dir_ / "rank_00000.jsonl").c_str(), 0600), 0);
  EXPECT_THAT(ReadFlightRecords(dir_).status().message(),
              HasSubstr("rank_00000.jsonl is not a regular file"));
}

// Old: one line per rank of the world (a 167-byte record saying 1e8 ranks: 1e8 lines).
TEST(FlightAnalysisBoundsTest, RanksWithoutARecordAreNamedInSpans) {
  FlightRecord r = Record(0, kMaxFlightWorldSize, {});
  r.reason = "requested: x";
  const FlightFindings f = AnalyzeFlight({r});
  EXPECT_EQ(f.lines.size(), 4u);
  EXPECT_THAT(f.lines, Contains(absl::StrCat("ranks 1-", kMaxFlightWorldSize - 1,
                                             ": no record: they never answered (killed, "
                                             "stopped, or their nodes are lost)")));
  EXPECT_EQ(f.lines.back(), absl::StrCat("verdict: rank(s) [1-", kMaxFlightWorldSize - 1,
                                         "] left no record; no one waits for them"));
}

// Old: the reason's newline and escape sequence went to the terminal as they were.
TEST(FlightAnalysisBoundsTest, ARecordsControlCharactersAreShownNotPrinted) {
  FlightRecord r = Record(0, 1, {});
  r.reason = "requested: x\n\x1b[2Jverdict: no rank waits for another";
  const FlightFindings f = AnalyzeFlight({r});
  EXPECT_THAT(f.lines, Each(Not(HasSubstr("\n"))));
  EXPECT_THAT(f.lines, Each(Not(HasSubstr("\x1b"))));
  EXPECT_THAT(f.lines, Contains(HasSubstr("requested: x\\x0a\\x1b[2Jverdict")));
}

TEST(RunStartTest, EveryRankGetsRankZerosClock) {
  LocalCommunicator world;
  const int64_t before = WallClockNanos();
  const absl::StatusOr<int64_t> started = AgreeOnRunStart(world);
  NF_ASSERT_OK(started);
  EXPECT_GE(*started, before);
  EXPECT_LE(*started, WallClockNanos());
}

}  // namespace
}  // namespace nf::parallel
