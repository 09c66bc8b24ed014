// Tests of parallel/flight_recorder.h (the ring, its states), parallel/flight_dumps.h (the
// record's text reads back) and parallel/flight_analysis.h (what nf-flight concludes) on records
// made by hand for each kind of hang: a killed rank, a stopped one, two kinds of
// desynchronised schedule, a transfer never sent, and a job that is not stuck. The end-to-end
// tests under mpirun are flight_recorder_mpi.sh.
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "parallel/flight_analysis.h"
#include "parallel/flight_dumps.h"
#include "parallel/flight_recorder.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FlightRecorderTest, KeepsTheLastOperationsWithTheirStates) {
  FlightRecorder& recorder = FlightRecorder::Get();
  recorder.SetCapacity(3);
  std::vector<uint64_t> ids;
  for (int i = 1; i <= 5; ++i) {
    ids.push_back(recorder.Issued("dp", "mpi", i, CommOp::kAllReduce, -1, 4 * i, DType::kF32));
  }
  recorder.Waiting(ids[4]);
  recorder.Completed(ids[3]);
  recorder.Completed(ids[0]);  // left the ring: ignored
  const std::vector<FlightEntry> entries = recorder.Entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].seq, 3);
  EXPECT_EQ(entries[0].state, FlightState::kIssued);
  EXPECT_EQ(entries[1].state, FlightState::kCompleted);
  EXPECT_GT(entries[1].completed_ns, 0);
  EXPECT_EQ(entries[2].state, FlightState::kWaiting);
  EXPECT_EQ(entries[2].bytes, 20);
  EXPECT_STREQ(entries[2].group, "dp");
  EXPECT_EQ(recorder.dropped(), 2);

  recorder.SetCapacity(0);
  EXPECT_EQ(recorder.Issued("dp", "mpi", 6, CommOp::kBarrier, -1, 0, DType::kU8), 0u);
  EXPECT_TRUE(recorder.Entries().empty());
  recorder.SetCapacity(FlightRecorder::kDefaultCapacity);
}

TEST(FlightRecorderTest, TheWrittenRecordReadsBack) {
  FlightRecorder& recorder = FlightRecorder::Get();
  recorder.SetCapacity(8);
  recorder.RegisterGroup({.group = "pp", .backend = "nccl", .world_ranks = {2, 6}});
  const uint64_t sent = recorder.Issued("pp", "nccl", 4, CommOp::kSend, 6, 1024, DType::kBF16);
  recorder.Completed(sent);
  recorder.Issued("world", "mpi", 9, CommOp::kAllReduce, -1, 8, DType::kF64);
  const std::string text = FormatFlightRecord(
      {.dir = "unused", .world_rank = 2, .world_size = 8, .host = "node\"1"}, "a \"test\"\n");
  const absl::StatusOr<FlightRecord> record = ParseFlightRecord(text, "rank_00002.jsonl");
  NF_ASSERT_OK(record);
  EXPECT_EQ(record->rank, 2);
  EXPECT_EQ(record->world_size, 8);
  EXPECT_EQ(record->host, "node\"1");
  EXPECT_EQ(record->reason, "a \"test\"\n");
  ASSERT_FALSE(record->groups.empty());
  EXPECT_EQ(record->groups.back().group, "pp");
  EXPECT_THAT(record->groups.back().world_ranks, ElementsAre(2, 6));
  ASSERT_EQ(record->entries.size(), 2u);
  const FlightEntry& e = record->entries[0];
  EXPECT_EQ(e.op, CommOp::kSend);
  EXPECT_EQ(e.peer, 6);
  EXPECT_EQ(e.seq, 4);
  EXPECT_EQ(e.bytes, 1024);
  EXPECT_EQ(e.dtype, DType::kBF16);
  EXPECT_EQ(e.state, FlightState::kCompleted);
  EXPECT_EQ(record->entries[1].state, FlightState::kIssued);
  recorder.SetCapacity(FlightRecorder::kDefaultCapacity);

  EXPECT_THAT(ParseFlightRecord("{\"rank\": 3}", "f").status().message(),
              HasSubstr("f:1: 'world_size' is not an integer"));
  EXPECT_THAT(ParseFlightRecord(text + "{oops\n", "f").status().message(), HasSubstr("f:4:"));
}

// ---- What nf-flight concludes -------------------------------------------------------------------

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kT0 = 1'800'000'000 * kSecond;

FlightEntry Op(const char* group, CommOp op, int64_t seq, FlightState state, int peer = -1,
               int64_t bytes = 8) {
  FlightEntry e;
  std::snprintf(e.group, sizeof(e.group), "%s", group);
  std::snprintf(e.backend, sizeof(e.backend), "mpi");
  e.op = op;
  e.seq = seq;
  e.state = state;
  e.peer = peer;
  e.bytes = bytes;
  e.issued_ns = kT0 + seq;
  e.completed_ns = state == FlightState::kCompleted ? kT0 + seq + 1 : 0;
  return e;
}

// A record of `rank` in a world of `world`, written `seconds` after kT0 for `reason`, with the
// world group and `groups`.
FlightRecord Record(int rank, int world, const std::string& reason, std::vector<FlightEntry> ops,
                    std::vector<FlightGroup> groups = {}, int64_t seconds = 10) {
  FlightRecord r;
  r.rank = rank;
  r.world_size = world;
  r.label = "rank " + std::to_string(rank);
  r.host = "node0";
  r.reason = reason;
  r.time_ns = kT0 + seconds * kSecond;
  std::vector<int> all;
  for (int i = 0; i < world; ++i) all.push_back(i);
  r.groups.push_back({.group = "world", .backend = "mpi", .world_ranks = all});
  for (FlightGroup& g : groups) r.groups.push_back(std::move(g));
  r.entries = std::move(ops);
  return r;
}

std::string Text(const FlightFindings& f) { return absl::StrJoin(f.lines, "\n"); }

TEST(FlightAnalysisTest, AKilledRankIsTheOneTheOthersWaitFor) {
  const FlightFindings f =
      AnalyzeFlight({Record(0, 2, "SIGTERM",
                            {Op("world", CommOp::kAllReduce, 4, FlightState::kCompleted),
                             Op("world", CommOp::kAllReduce, 5, FlightState::kWaiting)})});
  EXPECT_THAT(f.culprits, ElementsAre(1));
  EXPECT_FALSE(f.desynchronised);
  EXPECT_THAT(Text(f), HasSubstr("rank 1: no record: it never answered"));
  EXPECT_THAT(Text(f), HasSubstr("rank 0's all_reduce #5 (8 B f32) on group world/mpi waits for "
                                 "rank 1, which left no recent record"));
  EXPECT_THAT(f.lines.back(),
              HasSubstr("verdict: the job waits for rank(s) [1 (no recent record)]"));
}

TEST(FlightAnalysisTest, ARankThatDidNotAnswerTheWatchdogIsNamedEvenInTheSameCollective) {
  // A stopped rank, continued only to be terminated: it wrote its record at the job's end,
  // waiting in the very all-reduce rank 0 timed out in.
  const std::vector<FlightEntry> both = {Op("world", CommOp::kAllReduce, 5, FlightState::kWaiting)};
  const FlightFindings f =
      AnalyzeFlight({Record(0, 2, "watchdog: rank 0: all_reduce ... did not complete", both, {}, 3),
                     Record(1, 2, "SIGTERM", both, {}, 8)});
  EXPECT_THAT(f.culprits, ElementsAre(1));
  EXPECT_THAT(Text(f),
              HasSubstr("rank 1 on node0 (step -1) did not answer the watchdog's request"));
  EXPECT_THAT(f.lines.back(), HasSubstr("[1 (did not answer)]"));
}

TEST(FlightAnalysisTest, ARecordWrittenAfterTheGraceDidNotAnswerWhateverItsReason) {
  // The stopped rank, continued to be ended, found its own deadline passed and dumped as a
  // watchdog too, but only after rank 0 had waited kPeerDumpGrace (5 s) for it.
  const std::vector<FlightEntry> both = {Op("world", CommOp::kAllReduce, 5, FlightState::kWaiting)};
  const FlightFindings f = AnalyzeFlight({Record(0, 2, "watchdog: rank 0: ...", both, {}, 3),
                                          Record(1, 2, "watchdog: rank 1: ...", both, {}, 9)});
  EXPECT_THAT(f.culprits, ElementsAre(1));
}

TEST(FlightAnalysisTest, RanksThatAnsweredAreNotBlamed) {
  const std::vector<FlightEntry> both = {Op("world", CommOp::kAllReduce, 5, FlightState::kWaiting)};
  const FlightFindings f = AnalyzeFlight({Record(0, 2, "watchdog: rank 0: ...", both, {}, 3),
                                          Record(1, 2, "requested: rank 0: ...", both, {}, 3)});
  EXPECT_TRUE(f.culprits.empty());
  EXPECT_EQ(f.lines.back(), "verdict: no rank waits for another");
}

TEST(FlightAnalysisTest, TheFirstCollectiveIssuedDifferentlyIsTheDivergence) {
  const FlightFindings f = AnalyzeFlight({
      Record(0, 3, "requested: x",
             {Op("world", CommOp::kAllReduce, 6, FlightState::kCompleted),
              Op("world", CommOp::kAllReduce, 7, FlightState::kWaiting)}),
      Record(1, 3, "watchdog: y",
             {Op("world", CommOp::kAllReduce, 6, FlightState::kCompleted),
              Op("world", CommOp::kBarrier, 7, FlightState::kWaiting, -1, 0)}),
      Record(2, 3, "requested: x",
             {Op("world", CommOp::kAllReduce, 6, FlightState::kCompleted),
              Op("world", CommOp::kAllReduce, 7, FlightState::kWaiting)}),
  });
  EXPECT_TRUE(f.desynchronised);
  EXPECT_THAT(f.culprits, ElementsAre(1));
  EXPECT_THAT(Text(f), HasSubstr("first divergence on group world/mpi (ranks [0, 1, 2]) at "
                                 "collective #7: ranks [0, 2] all_reduce 8 B f32; ranks [1] "
                                 "barrier 0 B f32"));
}

TEST(FlightAnalysisTest, AnExtraCollectiveOnOneRankIsOutOfStep) {
  // NF_INJECT_DESYNC's hang at tp 2 x dp 2: rank 1 waits in a world barrier nobody else
  // issued; rank 0 waits for it in tp, ranks 2 and 3 in dp: every awaited rank waits in turn.
  auto groups = [](int rank) {
    const int tp_base = rank / 2 * 2;
    return std::vector<FlightGroup>{
        {.group = "tp", .backend = "mpi", .world_ranks = {tp_base, tp_base + 1}},
        {.group = "dp", .backend = "mpi", .world_ranks = {rank % 2, rank % 2 + 2}}};
  };
  const FlightEntry world16 = Op("world", CommOp::kAllReduce, 16, FlightState::kCompleted);
  const FlightFindings f = AnalyzeFlight({
      Record(0, 4, "watchdog: a",
             {world16, Op("tp", CommOp::kAllReduce, 168, FlightState::kCompleted),
              Op("tp", CommOp::kAllReduce, 169, FlightState::kWaiting)},
             groups(0)),
      Record(1, 4, "requested: a",
             {world16, Op("tp", CommOp::kAllReduce, 168, FlightState::kCompleted),
              Op("dp", CommOp::kAllReduce, 3, FlightState::kCompleted),
              Op("world", CommOp::kBarrier, 17, FlightState::kWaiting, -1, 0)},
             groups(1)),
      Record(2, 4, "requested: a",
             {world16, Op("dp", CommOp::kAllReduce, 4, FlightState::kWaiting)}, groups(2)),
      Record(3, 4, "requested: a",
             {world16, Op("dp", CommOp::kAllReduce, 4, FlightState::kWaiting)}, groups(3)),
  });
  EXPECT_TRUE(f.desynchronised);
  EXPECT_THAT(f.culprits, ElementsAre(1));
  EXPECT_THAT(Text(f), HasSubstr("rank 1 issued 17 collectives on group world/mpi (ranks [0, 1, "
                                 "2, 3]), the others 16: it is out of step"));
}

TEST(FlightAnalysisTest, AReceiveWaitsForTheSendItsPeerHasNotIssued) {
  const FlightFindings f = AnalyzeFlight({
      Record(0, 2, "SIGTERM", {Op("pp", CommOp::kSend, 2, FlightState::kCompleted, 1, 4096)},
             {{.group = "pp", .backend = "mpi", .world_ranks = {0, 1}}}),
      Record(1, 2, "SIGTERM",
             {Op("pp", CommOp::kRecv, 2, FlightState::kCompleted, 0, 4096),
              Op("pp", CommOp::kRecv, 3, FlightState::kWaiting, 0, 4096)},
             {{.group = "pp", .backend = "mpi", .world_ranks = {0, 1}}}),
  });
  EXPECT_THAT(f.culprits, ElementsAre(0));
  EXPECT_THAT(Text(f), HasSubstr("rank 1's recv #3 from rank 0 (4096 B f32) on group pp/mpi "
                                 "waits for rank 0, which has not sent #3 to rank 1 (its last is "
                                 "#2); it is in no communication"));
}

TEST(FlightAnalysisTest, ACompletedRecordIsNotAHang) {
  const std::vector<FlightEntry> done = {
      Op("world", CommOp::kAllReduce, 3, FlightState::kCompleted)};
  const FlightFindings f = AnalyzeFlight(
      {Record(0, 2, "SIGUSR2 (a request)", done), Record(1, 2, "requested: nf-flight", done)});
  EXPECT_TRUE(f.culprits.empty());
  EXPECT_FALSE(f.desynchronised);
  EXPECT_EQ(f.lines.back(), "verdict: no rank waits for another");
}

}  // namespace
}  // namespace nf::parallel
