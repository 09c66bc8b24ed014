// Tests of parallel/flight_recorder.h (the ring, its states), parallel/flight_dumps.h (the
// record's text reads back) and parallel/flight_analysis.h (what nf-flight concludes) on records
// made by hand for each kind of hang: a killed rank, a stopped one (silent, or frozen inside
// the collective the others wait in: process_stalls.h), two kinds of desynchronised schedule,
// a transfer never sent, and a job that is not stuck. The end-to-end
// tests under mpirun are flight_recorder_mpi.sh.
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "parallel/flight_analysis.h"
#include "parallel/flight_dumps.h"
#include "parallel/flight_recorder.h"
#include "parallel/process_stalls.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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
  const std::vector<ProcessStall> stalls = {{.start_ns = 5, .end_ns = 4'000'000'005}};
  const std::string text = FormatFlightRecord({.dir = "unused",
                                               .world_rank = 2,
                                               .world_size = 8,
                                               .run_started_ns = 1'700'000'000'123'456'789,
                                               .host = "node\"1"},
                                              "a \"test\"\n", stalls);
  const absl::StatusOr<FlightRecord> record =
      ParseFlightRecord(text, "rank_00002.jsonl", WallClockNanos());
  NF_ASSERT_OK(record);
  EXPECT_EQ(record->rank, 2);
  EXPECT_EQ(record->world_size, 8);
  EXPECT_EQ(record->run_started_ns, 1'700'000'000'123'456'789);
  EXPECT_EQ(record->host, "node\"1");
  EXPECT_EQ(record->reason, "a \"test\"\n");
  ASSERT_EQ(record->stalls.size(), 1u);
  EXPECT_EQ(record->stalls[0].start_ns, 5);
  EXPECT_EQ(record->stalls[0].end_ns, 4'000'000'005);
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

  EXPECT_THAT(ParseFlightRecord("{\"rank\": 3}", "f", WallClockNanos()).status().message(),
              HasSubstr("f:1: 'world_size' is not an integer"));
  EXPECT_THAT(ParseFlightRecord(text + "{oops\n", "f", WallClockNanos()).status().message(),
              HasSubstr("f:4:"));
}

TEST(StallClockTest, AGapOfASecondBetweenWakesIsAStallTheRestIsJitter) {
  constexpr int64_t kMs = 1'000'000;
  StallClock clock;
  clock.Note(0, 500 * kMs);
  clock.Note(100 * kMs, 600 * kMs);
  clock.Note(999 * kMs, 1499 * kMs);  // 899 ms late: a loaded machine, not a stall
  EXPECT_TRUE(clock.Stalls().empty());
  clock.Note(5'099 * kMs, 5'599 * kMs);  // 4.1 s without a wake: stopped
  ASSERT_EQ(clock.Stalls().size(), 1u);
  EXPECT_EQ(clock.Stalls()[0].start_ns, 1'499 * kMs);
  EXPECT_EQ(clock.Stalls()[0].end_ns, 5'599 * kMs);
  clock.Note(5'000 * kMs, 5'500 * kMs);  // another thread's older reading, arriving late
  EXPECT_EQ(clock.Stalls().size(), 1u);
  for (int i = 1; i <= StallClock::kKept + 2; ++i) {
    clock.Note((5'099 + 2'000 * i) * kMs, (5'599 + 2'000 * i) * kMs);
  }
  ASSERT_EQ(clock.Stalls().size(), static_cast<size_t>(StallClock::kKept));
  EXPECT_EQ(clock.Stalls().back().end_ns, (5'599 + 2'000 * (StallClock::kKept + 2)) * kMs);
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

// Ranks 2 and 3 (tp) both entered all-reduce #7; rank 2 was then stopped for 4 s. Ranks 0 and 1
// wait for the sends of pipeline stage 1, which neither of 2 and 3 has issued.
std::vector<FlightRecord> StageOneFrozenInsideItsAllReduce(bool rank_2_stalled) {
  const std::vector<FlightGroup> tp_first = {
      {.group = "tp", .backend = "mpi", .world_ranks = {0, 1}}};
  const std::vector<FlightGroup> tp_second = {
      {.group = "tp", .backend = "mpi", .world_ranks = {2, 3}}};
  const auto pp = [](int a, int b) {
    return FlightGroup{.group = "pp", .backend = "mpi", .world_ranks = {a, b}};
  };
  std::vector<FlightRecord> records;
  for (int rank : {0, 1}) {
    std::vector<FlightGroup> groups = tp_first;
    groups.push_back(pp(rank, rank + 2));
    records.push_back(Record(rank, 4, "watchdog: ...",
                             {Op("pp", CommOp::kRecv, 3, FlightState::kWaiting, rank + 2)}, groups,
                             4));
  }
  for (int rank : {2, 3}) {
    std::vector<FlightGroup> groups = tp_second;
    groups.push_back(pp(rank - 2, rank));
    records.push_back(Record(rank, 4, "watchdog: ...",
                             {Op("pp", CommOp::kSend, 2, FlightState::kCompleted, rank - 2),
                              Op("tp", CommOp::kAllReduce, 7, FlightState::kWaiting)},
                             groups, 5));
  }
  // A stall before the hang (a slow start) does not count; the one across it does.
  records[3].stalls.push_back({.start_ns = kT0 - 20 * kSecond, .end_ns = kT0 - 18 * kSecond});
  if (rank_2_stalled) records[2].stalls.push_back({.start_ns = kT0, .end_ns = kT0 + 4 * kSecond});
  return records;
}

TEST(FlightAnalysisTest, OfRanksInsideOneCollectiveTheOneThatStoppedRunningHoldsIt) {
  FlightFindings f = AnalyzeFlight(StageOneFrozenInsideItsAllReduce(/*rank_2_stalled=*/false));
  EXPECT_THAT(f.culprits, ElementsAre(2, 3));  // without the stall, no telling which

  f = AnalyzeFlight(StageOneFrozenInsideItsAllReduce(/*rank_2_stalled=*/true));
  EXPECT_THAT(f.culprits, ElementsAre(2));
  EXPECT_THAT(Text(f), HasSubstr("rank 2 on node0 (step -1) did not run for 4.0 s"));
  EXPECT_THAT(Text(f), Not(HasSubstr("rank 3 on node0 (step -1) did not run")));
  EXPECT_EQ(f.lines.back(), "verdict: the job waits for rank(s) [2 (did not run for 4.0 s)]");
}

TEST(FlightAnalysisTest, AFrozenRankIsNamedWhenEveryRankIsInTheSameCollective) {
  // tp 2 alone: both ranks in all-reduce #5, so no rank is awaited by the rule of arrival.
  const std::vector<FlightEntry> both = {Op("world", CommOp::kAllReduce, 5, FlightState::kWaiting)};
  std::vector<FlightRecord> records = {Record(0, 2, "watchdog: rank 0: ...", both, {}, 4),
                                       Record(1, 2, "watchdog: rank 1: ...", both, {}, 5)};
  records[1].stalls.push_back({.start_ns = kT0, .end_ns = kT0 + 4 * kSecond});
  const FlightFindings f = AnalyzeFlight(records);
  EXPECT_THAT(f.culprits, ElementsAre(1));
  EXPECT_EQ(f.lines.back(), "verdict: the job waits for rank(s) [1 (did not run for 4.0 s)]");
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
