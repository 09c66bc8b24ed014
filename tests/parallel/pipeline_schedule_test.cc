// Tests of parallel/pipeline_schedule.h: for every schedule kind, p in 1..4, m in 1..8 and
// v in 1..3 where the combination is valid, every rank's list computes each (micro-batch, chunk)
// once forward and once backward, forward first, with its transfers around it; the lists of all
// ranks pair up and run to completion on the unit-time simulator; peak activation memory and
// the bubble are the textbook ones. Also exact lists for small cases, the checker and simulator
// catching broken lists, refusals with their advice, and the layer split. Also the executor's
// bounded waits for its sends (SendWindow) and evaluation's forward-only lists.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::parallel {

// Failures print actions readably (found by argument-dependent lookup, hence this namespace).
void PrintTo(const Action& action, std::ostream* os) { *os << action.ToString(); }

namespace {

using nf::testing::ExpectInvalidArgument;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                   ScheduleKind::kInterleavedOneFOneB};

struct Config {
  ScheduleKind kind;
  int p, m, v;
  std::string Name() const {
    return absl::StrCat(ScheduleKindName(kind), " p=", p, " m=", m, " v=", v);
  }
};

// The combinations BuildSchedule must accept: non-interleaved kinds with v = 1; interleaving
// with v >= 2 on p >= 2 ranks and whole rounds of p micro-batches.
bool Valid(const Config& c) {
  if (c.kind != ScheduleKind::kInterleavedOneFOneB) return c.v == 1;
  return c.v >= 2 && c.p >= 2 && c.m % c.p == 0;
}

std::vector<Config> AllConfigs() {
  std::vector<Config> configs;
  for (ScheduleKind kind : kKinds) {
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 8; ++m) {
        for (int v = 1; v <= 3; ++v) configs.push_back({.kind = kind, .p = p, .m = m, .v = v});
      }
    }
  }
  return configs;
}

std::vector<std::vector<Action>> BuildAll(const Config& c) {
  auto schedules = BuildAllSchedules(c.kind, c.p, c.m, c.v);
  NF_EXPECT_OK(schedules) << c.Name();
  return schedules.ok() ? *std::move(schedules) : std::vector<std::vector<Action>>();
}

Action Make(Action::Kind kind, int mb, int chunk = 0, int peer = -1) {
  return {.kind = kind, .micro_batch = mb, .model_chunk = chunk, .peer = peer};
}

// "F0 F1 B0 ..." with ".c" for the chunk when interleaved: the compute order only.
std::string ComputeOrder(const std::vector<Action>& list, bool chunks) {
  std::vector<std::string> out;
  for (const Action& a : list) {
    if (!a.is_compute()) continue;
    out.push_back(absl::StrCat(a.kind == Action::kForward ? "F" : "B", a.micro_batch,
                               chunks ? absl::StrCat(".", a.model_chunk) : ""));
  }
  return absl::StrJoin(out, " ");
}

TEST(PipelineScheduleTest, AcceptsExactlyTheValidCombinations) {
  for (const Config& c : AllConfigs()) {
    for (int r = 0; r < c.p; ++r) {
      EXPECT_EQ(BuildSchedule(c.kind, c.p, r, c.m, c.v).ok(), Valid(c)) << c.Name() << " r=" << r;
    }
  }
}

// Per rank: each (micro-batch, chunk) is computed forward exactly once and backward exactly
// once, forward first; each forward is immediately preceded by the receive of its input from
// the previous model stage's rank and followed by the send of its output to the next one
// (neither at the ends of the model), each backward likewise with gradients the other way.
TEST(PipelineScheduleTest, EveryRankComputesEachMicroBatchOnceWithItsTransfers) {
  for (const Config& c : AllConfigs()) {
    if (!Valid(c)) continue;
    const std::vector<std::vector<Action>> schedules = BuildAll(c);
    ASSERT_EQ(schedules.size(), c.p) << c.Name();
    const int last_stage = c.p * c.v - 1;
    for (int r = 0; r < c.p; ++r) {
      const std::vector<Action>& list = schedules[r];
      const std::string where = absl::StrCat(c.Name(), " rank ", r);
      const int next = (r + 1) % c.p, previous = (r + c.p - 1) % c.p;
      std::map<std::pair<int, int>, std::vector<size_t>> forwards, backwards;
      size_t transfers = 0, expected_transfers = 0;
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        if (!a.is_compute()) {
          ++transfers;
          continue;
        }
        ASSERT_GE(a.micro_batch, 0) << where;
        ASSERT_LT(a.micro_batch, c.m) << where;
        ASSERT_GE(a.model_chunk, 0) << where;
        ASSERT_LT(a.model_chunk, c.v) << where;
        EXPECT_EQ(a.peer, -1) << where << " action " << i;
        const int stage = a.model_chunk * c.p + r;
        const bool forward = a.kind == Action::kForward;
        (forward ? forwards : backwards)[{a.micro_batch, a.model_chunk}].push_back(i);
        // What must come just before and just after, if anything.
        const bool has_before = forward ? stage > 0 : stage < last_stage;
        const bool has_after = forward ? stage < last_stage : stage > 0;
        expected_transfers += has_before + has_after;
        if (has_before) {
          ASSERT_GT(i, 0u) << where;
          EXPECT_EQ(list[i - 1], Make(forward ? Action::kRecvActivation : Action::kRecvGrad,
                                      a.micro_batch, a.model_chunk, forward ? previous : next))
              << where << " action " << i << " (" << a.ToString() << ")";
        }
        if (has_after) {
          ASSERT_LT(i + 1, list.size()) << where;
          EXPECT_EQ(list[i + 1], Make(forward ? Action::kSendActivation : Action::kSendGrad,
                                      a.micro_batch, a.model_chunk, forward ? next : previous))
              << where << " action " << i << " (" << a.ToString() << ")";
        }
      }
      // No transfers beyond those: together with the adjacency above, every transfer belongs
      // to one computation.
      EXPECT_EQ(transfers, expected_transfers) << where;
      for (int mb = 0; mb < c.m; ++mb) {
        for (int chunk = 0; chunk < c.v; ++chunk) {
          const auto& f = forwards[{mb, chunk}];
          const auto& b = backwards[{mb, chunk}];
          ASSERT_EQ(f.size(), 1u) << where << " mb " << mb << " chunk " << chunk;
          ASSERT_EQ(b.size(), 1u) << where << " mb " << mb << " chunk " << chunk;
          EXPECT_LT(f[0], b[0]) << where << " mb " << mb << " chunk " << chunk;
        }
      }
      EXPECT_EQ(forwards.size() + backwards.size(), 2u * c.m * c.v) << where;
    }
  }
}

// Every send has exactly one receive on its peer, of the same message (kind, micro-batch and
// the chunk of the stage at the other end), in the same order among all messages of that pair
// of ranks; and the whole set runs to completion with blocking receives.
TEST(PipelineScheduleTest, ListsPairUpAndNeverDeadlock) {
  for (const Config& c : AllConfigs()) {
    if (!Valid(c)) continue;
    const std::vector<std::vector<Action>> schedules = BuildAll(c);
    NF_EXPECT_OK(CheckSchedulePairing(schedules)) << c.Name();
    for (int64_t backward_time : {1, 2}) {
      auto run = SimulateSchedules(schedules, {.forward_time = 1, .backward_time = backward_time});
      NF_EXPECT_OK(run) << c.Name();
    }
  }
}

// The most micro-batches whose forward is done and backward not yet, over a rank's list (per
// chunk when interleaved): the activations it must hold at once.
int PeakInFlight(const std::vector<Action>& list) {
  int in_flight = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == Action::kForward) peak = std::max(peak, ++in_flight);
    if (a.kind == Action::kBackward) --in_flight;
  }
  return peak;
}

// GPipe holds all m micro-batches; 1F1B holds at most the p - r it needs to keep the stages
// after it busy (its warm-up plus one), which is what makes its memory independent of m.
// Interleaving holds its warm-up steps plus one, min((p - r - 1) 2 + (v - 1) p + 1, m v)
// (micro-batch, chunk) activations, each a v-th of a stage.
TEST(PipelineScheduleTest, PeakInFlightMicroBatches) {
  for (const Config& c : AllConfigs()) {
    if (!Valid(c)) continue;
    const std::vector<std::vector<Action>> schedules = BuildAll(c);
    for (int r = 0; r < c.p; ++r) {
      int expected = 0;
      switch (c.kind) {
        case ScheduleKind::kGPipe:
          expected = c.m;
          break;
        case ScheduleKind::kOneFOneB:
          expected = std::min(c.p - r, c.m);
          break;
        case ScheduleKind::kInterleavedOneFOneB:
          expected = std::min((c.p - r - 1) * 2 + (c.v - 1) * c.p + 1, c.m * c.v);
          break;
      }
      EXPECT_EQ(PeakInFlight(schedules[r]), expected) << c.Name() << " rank " << r;
    }
  }
}

// The bubble. Every rank computes m v forwards and m v backwards of f = b = 1 unit each, busy
// 2 m v. The simulated makespan is exactly 2 (m v + p - 1): the p - 1 forward steps micro-batch
// 0 needs to reach the last rank, and the p - 1 backward steps its last gradient needs to come
// back, are the only time a rank waits (GPipe and 1F1B differ in memory, not in this), so
//   idle fraction = 1 - p 2 m v / (p 2 (m v + p - 1)) = (p - 1) / (v m + p - 1),
// with v = 1 for GPipe and 1F1B: (p - 1) / (m + p - 1). Interleaving keeps the same p - 1
// steps of filling and draining but makes each step a v-th of a stage, hence the factor v.
// With b = 2 the same holds for GPipe and 1F1B: makespan (m + p - 1)(f + b).
TEST(PipelineScheduleTest, BubbleIsTheTextbookFraction) {
  for (const Config& c : AllConfigs()) {
    if (!Valid(c)) continue;
    const std::vector<std::vector<Action>> schedules = BuildAll(c);
    auto run = SimulateSchedules(schedules, {.forward_time = 1, .backward_time = 1});
    NF_ASSERT_OK(run) << c.Name();
    const int steps = c.m * c.v;
    EXPECT_EQ(run->makespan, 2 * (steps + c.p - 1)) << c.Name();
    for (int r = 0; r < c.p; ++r) EXPECT_EQ(run->busy[r], 2 * steps) << c.Name() << " rank " << r;
    // Exact: both sides are the same ratio of small integers, rounded once.
    EXPECT_EQ(run->idle_fraction, static_cast<double>(c.p - 1) / (c.v * c.m + c.p - 1)) << c.Name();
    if (c.kind != ScheduleKind::kInterleavedOneFOneB) {
      auto slow = SimulateSchedules(schedules, {.forward_time = 1, .backward_time = 2});
      NF_ASSERT_OK(slow) << c.Name();
      EXPECT_EQ(slow->makespan, 3 * (c.m + c.p - 1)) << c.Name();
      EXPECT_EQ(slow->idle_fraction, static_cast<double>(c.p - 1) / (c.m + c.p - 1)) << c.Name();
    }
  }
}

// Exact lists for small cases, written out from the definitions (Megatron's order).
TEST(PipelineScheduleTest, SmallCasesInFull) {
  auto order = [](ScheduleKind kind, int p, int r, int m, int v) {
    auto list = BuildSchedule(kind, p, r, m, v);
    NF_EXPECT_OK(list);
    return list.ok() ? ComputeOrder(*list, v > 1) : "";
  };
  EXPECT_EQ(order(ScheduleKind::kGPipe, 2, 1, 3, 1), "F0 F1 F2 B2 B1 B0");
  // Rank 0 of 4 warms up with 3 forwards and cools down with 3 backwards; the last rank
  // alternates from the start.
  EXPECT_EQ(order(ScheduleKind::kOneFOneB, 4, 0, 6, 1), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(order(ScheduleKind::kOneFOneB, 4, 2, 6, 1), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(order(ScheduleKind::kOneFOneB, 4, 3, 6, 1), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(order(ScheduleKind::kOneFOneB, 4, 0, 2, 1), "F0 F1 B0 B1");  // warm-up capped at m
  // Interleaved, p = 2, v = 2, m = 4: micro-batches in rounds of 2 through chunk 0 then chunk
  // 1 forward, chunk 1 then chunk 0 backward; warm-up 4 steps on rank 0, 2 on rank 1.
  EXPECT_EQ(order(ScheduleKind::kInterleavedOneFOneB, 2, 0, 4, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(ScheduleKind::kInterleavedOneFOneB, 2, 1, 4, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");

  // With the transfers: 1F1B, p = 2, m = 2.
  using A = Action;
  auto rank0 = BuildSchedule(ScheduleKind::kOneFOneB, 2, 0, 2);
  NF_ASSERT_OK(rank0);
  EXPECT_THAT(*rank0, ElementsAre(Make(A::kForward, 0), Make(A::kSendActivation, 0, 0, 1),
                                  Make(A::kForward, 1), Make(A::kSendActivation, 1, 0, 1),
                                  Make(A::kRecvGrad, 0, 0, 1), Make(A::kBackward, 0),
                                  Make(A::kRecvGrad, 1, 0, 1), Make(A::kBackward, 1)));
  auto rank1 = BuildSchedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  NF_ASSERT_OK(rank1);
  EXPECT_THAT(*rank1, ElementsAre(Make(A::kRecvActivation, 0, 0, 0), Make(A::kForward, 0),
                                  Make(A::kBackward, 0), Make(A::kSendGrad, 0, 0, 0),
                                  Make(A::kRecvActivation, 1, 0, 0), Make(A::kForward, 1),
                                  Make(A::kBackward, 1), Make(A::kSendGrad, 1, 0, 0)));
  // Interleaved wraps from the last rank to the first: rank 1's chunk 0 (stage 1) feeds rank
  // 0's chunk 1 (stage 2), whose gradient goes back to it; rank 1's chunk 1 is the last stage.
  auto wrap0 = BuildSchedule(ScheduleKind::kInterleavedOneFOneB, 2, 0, 2, 2);
  NF_ASSERT_OK(wrap0);
  EXPECT_THAT(*wrap0, Contains(Make(A::kRecvActivation, 0, 1, 1)));
  EXPECT_THAT(*wrap0, Contains(Make(A::kSendGrad, 0, 1, 1)));
  auto wrap1 = BuildSchedule(ScheduleKind::kInterleavedOneFOneB, 2, 1, 2, 2);
  NF_ASSERT_OK(wrap1);
  EXPECT_THAT(*wrap1, Contains(Make(A::kSendActivation, 0, 0, 0)));
  EXPECT_THAT(*wrap1, Contains(Make(A::kRecvGrad, 0, 0, 0)));
  EXPECT_THAT(*wrap1, Not(Contains(Make(A::kSendActivation, 0, 1, 0))));
  EXPECT_THAT(*wrap1, Not(Contains(Make(A::kRecvGrad, 0, 1, 0))));
  EXPECT_EQ(Make(A::kRecvGrad, 3, 1, 2).ToString(), "recv_grad mb 3 chunk 1 from rank 2");
  EXPECT_EQ(Make(A::kSendActivation, 0, 0, 1).ToString(), "send_activation mb 0 chunk 0 to rank 1");
  EXPECT_EQ(Make(A::kForward, 2, 1).ToString(), "forward mb 2 chunk 1");
}

// Lists that pair up can still deadlock: here rank 0 waits for a gradient before sending the
// activation it derives from. Only the simulator sees that.
TEST(PipelineScheduleTest, SimulatorReportsDeadlock) {
  using A = Action;
  const std::vector<std::vector<Action>> lists = {
      {Make(A::kRecvGrad, 0, 0, 1), Make(A::kForward, 0), Make(A::kSendActivation, 0, 0, 1),
       Make(A::kBackward, 0)},
      {Make(A::kRecvActivation, 0, 0, 0), Make(A::kForward, 0), Make(A::kBackward, 0),
       Make(A::kSendGrad, 0, 0, 0)}};
  NF_EXPECT_OK(CheckSchedulePairing(lists));
  auto run = SimulateSchedules(lists);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(run.status().message(),
            "deadlock: rank 0 at action 0 (recv_grad mb 0 chunk 0 from rank 1), rank 1 at action "
            "0 (recv_activation mb 0 chunk 0 from rank 0) wait for messages never sent");
}

// Sends out of order: a blocking receive would take the wrong micro-batch's tensor.
TEST(PipelineScheduleTest, CheckerAndSimulatorReportMismatchedOrder) {
  auto lists = BuildAllSchedules(ScheduleKind::kOneFOneB, 2, 2);
  NF_ASSERT_OK(lists);
  std::vector<Action>& rank0 = (*lists)[0];
  ASSERT_EQ(rank0[1].kind, Action::kSendActivation);
  ASSERT_EQ(rank0[3].kind, Action::kSendActivation);
  std::swap(rank0[1].micro_batch, rank0[3].micro_batch);
  EXPECT_EQ(CheckSchedulePairing(*lists).message(),
            "message 0 from rank 0 to rank 1 is the activation of mb 1 from stage 0 to stage 1 "
            "(rank 0 action 1), but rank 1 action 0 receives it as the activation of mb 0 from "
            "stage 0 to stage 1");
  auto run = SimulateSchedules(*lists);
  EXPECT_THAT(std::string(run.status().message()),
              HasSubstr("rank 1 action 0 (recv_activation mb 0 chunk 0 from rank 0) expects the "
                        "activation of mb 0 from stage 0 to stage 1, but the next message from "
                        "rank 0 is the activation of mb 1"));

  // A dropped receive: the send is left over.
  auto dropped = BuildAllSchedules(ScheduleKind::kOneFOneB, 2, 1);
  NF_ASSERT_OK(dropped);
  ASSERT_EQ((*dropped)[0][2].kind, Action::kRecvGrad);
  (*dropped)[0].erase((*dropped)[0].begin() + 2);
  EXPECT_EQ(CheckSchedulePairing(*dropped).message(),
            "rank 1 action 3 sends the gradient of mb 0 from stage 1 to stage 0, which rank 0 "
            "never receives");
  EXPECT_EQ(SimulateSchedules(*dropped).status().message(),
            "rank 1 sends the gradient of mb 0 from stage 1 to stage 0 to rank 0, which never "
            "receives it");

  // A wrong peer.
  auto misrouted = BuildAllSchedules(ScheduleKind::kGPipe, 3, 1);
  NF_ASSERT_OK(misrouted);
  (*misrouted)[0][1].peer = 2;
  EXPECT_EQ(CheckSchedulePairing(*misrouted).message(),
            "rank 0 action 1 (send_activation mb 0 chunk 0 to rank 2) transfers the activation "
            "of mb 0 from stage 0 to stage 1, which is rank 1's, not rank 2's");
}

// The executor's bounded waiting for its sends (SendWindow): under rendezvous transfers, where a
// send completes only once its receiver has received it, every small (kind, p, m, v) runs to
// completion, every rank finishes exactly when it does without waiting (the waits never hold it
// up), and no rank has more sends pending than its window, whatever m.
TEST(PipelineScheduleTest, BoundedSendWaitsNeverDeadlockNorDelay) {
  for (const Config& c : AllConfigs()) {
    if (!Valid(c)) continue;
    const std::vector<std::vector<Action>> schedules = BuildAll(c);
    const std::vector<int> windows = SendWindows(c.kind, c.p, c.v);
    ASSERT_EQ(windows.size(), c.p) << c.Name();
    for (int64_t backward_time : {1, 2, 3}) {
      const SimulationOptions unwaited = {.forward_time = 1, .backward_time = backward_time};
      SimulationOptions waited = unwaited;
      waited.send_windows = windows;
      const auto free_run = SimulateSchedules(schedules, unwaited);
      const auto run = SimulateSchedules(schedules, waited);
      NF_ASSERT_OK(free_run) << c.Name();
      NF_ASSERT_OK(run) << c.Name() << " b=" << backward_time;
      EXPECT_EQ(run->finish, free_run->finish) << c.Name() << " b=" << backward_time;
      for (int r = 0; r < c.p; ++r) {
        EXPECT_GE(windows[r], 1) << c.Name();
        EXPECT_LE(run->peak_pending_sends[r], windows[r]) << c.Name() << " rank " << r;
      }
    }
  }
  // The windows themselves: 1F1B's (and GPipe's) p - r, interleaving's activations in flight.
  EXPECT_THAT(SendWindows(ScheduleKind::kOneFOneB, 4), ElementsAre(4, 3, 2, 1));
  EXPECT_THAT(SendWindows(ScheduleKind::kGPipe, 2), ElementsAre(2, 1));
  EXPECT_THAT(SendWindows(ScheduleKind::kInterleavedOneFOneB, 2, 2), ElementsAre(5, 3));
  // Without waits a rank keeps all its sends until the end: 2 m on a middle rank of 1F1B.
  auto long_run = BuildAllSchedules(ScheduleKind::kOneFOneB, 4, 64);
  NF_ASSERT_OK(long_run);
  auto unbounded = SimulateSchedules(*long_run);
  NF_ASSERT_OK(unbounded);
  EXPECT_THAT(unbounded->peak_pending_sends, ElementsAre(64, 128, 128, 64));
  auto bounded =
      SimulateSchedules(*long_run, {.send_windows = SendWindows(ScheduleKind::kOneFOneB, 4)});
  NF_ASSERT_OK(bounded);
  EXPECT_THAT(bounded->peak_pending_sends, ElementsAre(4, 3, 2, 1));
}

// Waiting too early deadlocks, and the simulator says who waits for what: with a window of 1,
// interleaved 1F1B's ranks each wait for a send whose receiver waits for the other's.
TEST(PipelineScheduleTest, SimulatorReportsDeadlockedSendWaits) {
  auto schedules = BuildAllSchedules(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2);
  NF_ASSERT_OK(schedules);
  const auto run = SimulateSchedules(*schedules, {.send_windows = {1, 1}});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
  EXPECT_THAT(
      std::string(run.status().message()),
      ::testing::AllOf(::testing::StartsWith("deadlock: rank 0 "), HasSubstr(" to be received"),
                       ::testing::EndsWith("; each waits for a message never sent or received")));
  EXPECT_EQ(SimulateSchedules(*schedules, {.send_windows = {1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SimulateSchedules(*schedules, {.send_windows = {0, 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Evaluation's forward-only lists: every (micro-batch, chunk) forwarded once, in rounds of p
// micro-batches through chunk after chunk, with the receive of its input before and the send
// of its output after (except at the model's ends), no backward; the lists pair up, never
// deadlock, also with the executor's window of one pending send per rank, and their bubble is
// the filling only when p divides m (a short last round idles rank 0 at its chunk changes).
TEST(PipelineScheduleTest, ForwardOnlyListsPairUpAndNeverDeadlock) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      for (int v = 1; v <= 3; ++v) {
        const std::string name = absl::StrCat("forward-only p=", p, " m=", m, " v=", v);
        auto schedules = BuildAllForwardOnlySchedules(p, m, v);
        if (v > 1 && p == 1) {
          EXPECT_EQ(schedules.status().code(), absl::StatusCode::kInvalidArgument) << name;
          continue;
        }
        NF_ASSERT_OK(schedules) << name;
        ASSERT_EQ(schedules->size(), p) << name;
        const int last_stage = p * v - 1;
        for (int r = 0; r < p; ++r) {
          std::vector<Action> expected;
          for (int round = 0; round * p < m; ++round) {
            for (int chunk = 0; chunk < v; ++chunk) {
              for (int mb = round * p; mb < std::min(m, round * p + p); ++mb) {
                const int stage = chunk * p + r;
                if (stage > 0) {
                  expected.push_back(Make(Action::kRecvActivation, mb, chunk, (r + p - 1) % p));
                }
                expected.push_back(Make(Action::kForward, mb, chunk));
                if (stage < last_stage) {
                  expected.push_back(Make(Action::kSendActivation, mb, chunk, (r + 1) % p));
                }
              }
            }
          }
          EXPECT_EQ((*schedules)[r], expected) << name << " rank " << r;
          auto one = BuildForwardOnlySchedule(p, r, m, v);
          NF_ASSERT_OK(one) << name;
          EXPECT_EQ(*one, (*schedules)[r]) << name;
        }
        NF_EXPECT_OK(CheckSchedulePairing(*schedules)) << name;
        const auto free_run = SimulateSchedules(*schedules);
        NF_ASSERT_OK(free_run) << name;
        // Micro-batch i's last chunk leaves the last stage at p + i (+ (v - 1) m): the filling,
        // then one forward a step on every rank. A short last round (p not dividing m) has to
        // wait for its first micro-batch at each chunk change.
        if (v == 1 || m % p == 0) {
          EXPECT_EQ(free_run->makespan, m * v + p - 1) << name;
        } else {
          EXPECT_GT(free_run->makespan, m * v + p - 1) << name;
        }
        const auto waited = SimulateSchedules(
            *schedules, {.send_windows = std::vector<int>(p, kForwardOnlySendWindow)});
        NF_ASSERT_OK(waited) << name;
        EXPECT_EQ(waited->finish, free_run->finish) << name;
        for (int r = 0; r < p; ++r) {
          EXPECT_LE(waited->peak_pending_sends[r], kForwardOnlySendWindow) << name;
        }
      }
    }
  }
  ExpectInvalidArgument(BuildForwardOnlySchedule(2, 2, 4).status(),
                        "pipeline rank 2 is out of range for pipeline_parallel 2; use 0 to 1");
  ExpectInvalidArgument(BuildForwardOnlySchedule(2, 0, 0).status(),
                        "micro-batches must be at least 1, got 0");
  ExpectInvalidArgument(BuildAllForwardOnlySchedules(1, 4, 2).status(),
                        "virtual_stages 2 needs pipeline_parallel of at least 2, got 1; use "
                        "virtual_stages 1");
}

TEST(PipelineScheduleTest, RefusalsSayWhatWouldWork) {
  using K = ScheduleKind;
  ExpectInvalidArgument(BuildSchedule(K::kOneFOneB, 0, 0, 4).status(),
                        "pipeline_parallel must be at least 1, got 0");
  ExpectInvalidArgument(BuildSchedule(K::kOneFOneB, 4, 4, 8).status(),
                        "pipeline rank 4 is out of range for pipeline_parallel 4; use 0 to 3");
  ExpectInvalidArgument(BuildSchedule(K::kGPipe, 1, -1, 8).status(),
                        "pipeline rank -1 is out of range for pipeline_parallel 1; use 0");
  ExpectInvalidArgument(BuildSchedule(K::kGPipe, 2, 0, 0).status(),
                        "micro-batches must be at least 1, got 0");
  ExpectInvalidArgument(BuildSchedule(K::kInterleavedOneFOneB, 2, 0, 4, 0).status(),
                        "virtual_stages must be at least 1, got 0");
  ExpectInvalidArgument(BuildSchedule(K::kGPipe, 2, 0, 4, 2).status(),
                        "GPIPE runs one stage per rank, got virtual_stages 2; use virtual_stages "
                        "1, or INTERLEAVED_ONE_F_ONE_B");
  ExpectInvalidArgument(BuildSchedule(K::kInterleavedOneFOneB, 4, 0, 8, 1).status(),
                        "interleaved 1F1B needs virtual_stages of at least 2, got 1; use "
                        "ONE_F_ONE_B for one stage per rank");
  ExpectInvalidArgument(BuildSchedule(K::kInterleavedOneFOneB, 1, 0, 8, 2).status(),
                        "interleaved 1F1B needs pipeline_parallel of at least 2, got 1; use "
                        "ONE_F_ONE_B with virtual_stages 1");
  ExpectInvalidArgument(BuildSchedule(K::kInterleavedOneFOneB, 4, 0, 6, 2).status(),
                        "interleaved 1F1B needs micro-batches (6) to be a multiple of "
                        "pipeline_parallel (4); use 4, 8 or 12 micro-batches");
  ExpectInvalidArgument(BuildAllSchedules(K::kInterleavedOneFOneB, 4, 2, 2).status(),
                        "interleaved 1F1B needs micro-batches (2) to be a multiple of "
                        "pipeline_parallel (4); use 4, 8 or 12 micro-batches");
  // The whole message is one line.
  EXPECT_THAT(std::string(BuildSchedule(K::kInterleavedOneFOneB, 3, 0, 7, 2).status().message()),
              ::testing::EndsWith("use 6, 9 or 12 micro-batches"));
}

TEST(PipelineScheduleTest, LayerSplit) {
  NF_EXPECT_OK(CheckLayerSplit(12, 2, 3));
  NF_EXPECT_OK(CheckLayerSplit(6, 1));
  ExpectInvalidArgument(CheckLayerSplit(6, 4, 1),
                        "model.num_layers (6) does not split into pipeline_parallel 4 x "
                        "virtual_stages 1 = 4 equal stages; use 2, 3 or 6 stages");
  ExpectInvalidArgument(CheckLayerSplit(7, 2), "= 2 equal stages; use 7 stages");
  ExpectInvalidArgument(CheckLayerSplit(1, 2), "= 2 equal stages; use 1 stage");
  ExpectInvalidArgument(CheckLayerSplit(0, 2), "model.num_layers must be at least 1, got 0");

  // Stage s = chunk * p + rank: with p = 2, v = 3, rank 1 holds stages 1, 3, 5.
  EXPECT_THAT(StageLayers(12, 2, 3), ElementsAre(Pair(0, 2), Pair(2, 4), Pair(4, 6), Pair(6, 8),
                                                 Pair(8, 10), Pair(10, 12)));
  EXPECT_THAT(StageLayers(7, 2), ElementsAre(Pair(0, 4), Pair(4, 7)));
  const int split[] = {1, 3, 2};
  auto explicit_split = StageLayers(6, 3, 1, split);
  NF_ASSERT_OK(explicit_split);
  EXPECT_THAT(*explicit_split, ElementsAre(Pair(0, 1), Pair(1, 4), Pair(4, 6)));
  const int too_few[] = {3, 3};
  ExpectInvalidArgument(StageLayers(6, 3, 1, too_few).status(),
                        "the layer split [3, 3] has 2 entries; pipeline_parallel 3 x "
                        "virtual_stages 1 needs 3");
  const int empty_stage[] = {0, 3, 3};
  ExpectInvalidArgument(StageLayers(6, 3, 1, empty_stage).status(),
                        "the layer split [0, 3, 3] gives a stage no layers");
  const int wrong_sum[] = {2, 2, 3};
  ExpectInvalidArgument(StageLayers(6, 3, 1, wrong_sum).status(),
                        "the layer split [2, 2, 3] sums to 7 layers; model.num_layers is 6");
}

}  // namespace
}  // namespace nf::parallel
