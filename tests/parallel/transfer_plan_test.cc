// Tests of parallel/transfer_plan.h: for GPipe, 1F1B and interleaved 1F1B at every p 2-16,
// v 1-4 and m p..4p (interleaving: the multiples of p), and evaluation's forward-only lists,
// every rank's plan holds its computations in order and each transfer once, both ends of a
// message share a round, rounds only grow along a rank, and the plans run to completion under
// NCCL's rules in exactly the ideal step time (sends buffered). The old policy of the NCCL
// communicator (a send deferred to the next receive, wait or collective) deadlocks interleaved
// 1F1B and holds the first stage's warm-up sends back; the model shows both.
#include "parallel/transfer_plan.h"

#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/pipeline_layouts.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::testing::HasSubstr;

using Layout = testing::PipelineLayout;

// Up to 16 stages (the sanitizer pass: 8).
int MaxStages() { return testing::MaxPipelineStages(16); }
std::vector<Layout> Layouts(int max_p) { return testing::PipelineLayouts(max_p); }

std::vector<std::vector<Action>> Schedules(const Layout& l) {
  auto schedules = BuildAllSchedules(l.kind, l.p, l.m, l.v);
  NF_EXPECT_OK(schedules) << l.Name();
  return schedules.ok() ? *std::move(schedules) : std::vector<std::vector<Action>>();
}

// Checks the plan's shape against the lists it was built from; returns the ideal makespan.
void ExpectWellFormed(const std::vector<std::vector<Action>>& schedules,
                      const std::vector<std::vector<PlanStep>>& plans, const std::string& name) {
  const int p = static_cast<int>(schedules.size());
  ASSERT_EQ(plans.size(), schedules.size()) << name;
  // Per channel, the rounds of its sends and of its receives, in order.
  std::map<std::pair<int, int>, std::vector<int64_t>> send_rounds, recv_rounds;
  for (int r = 0; r < p; ++r) {
    std::vector<Action> computes_in_list, computes_in_plan;
    int transfers_in_list = 0, transfers_in_plan = 0;
    for (const Action& a : schedules[r]) {
      if (a.is_compute()) {
        computes_in_list.push_back(a);
      } else {
        ++transfers_in_list;
      }
    }
    int64_t last_round = -1;
    for (const PlanStep& step : plans[r]) {
      if (step.is_compute()) {
        computes_in_plan.push_back(step.actions[0]);
        continue;
      }
      ASSERT_FALSE(step.actions.empty()) << name;
      EXPECT_GT(step.round, last_round) << name << " rank " << r << ": rounds must grow";
      last_round = step.round;
      int sends = 0;
      for (const Action& a : step.actions) {
        ASSERT_FALSE(a.is_compute()) << name;
        ++transfers_in_plan;
        if (a.is_send()) {
          ++sends;
          send_rounds[{r, a.peer}].push_back(step.round);
        } else {
          recv_rounds[{a.peer, r}].push_back(step.round);
        }
      }
      EXPECT_LE(sends, 1) << name << " rank " << r << ": " << PlanStepToString(step);
    }
    EXPECT_EQ(computes_in_plan, computes_in_list) << name << " rank " << r;
    EXPECT_EQ(transfers_in_plan, transfers_in_list) << name << " rank " << r;
  }
  EXPECT_EQ(send_rounds, recv_rounds) << name << ": both ends of a message share its round";
}

TEST(TransferPlanTest, EveryTrainingLayoutRunsUnderNcclRulesInTheIdealTime) {
  int layouts = 0;
  for (const Layout& l : Layouts(MaxStages())) {
    const auto schedules = Schedules(l);
    auto plans = BuildTransferPlans(schedules);
    NF_ASSERT_OK(plans) << l.Name();
    ExpectWellFormed(schedules, *plans, l.Name());
    auto ideal = SimulateSchedules(
        schedules, {.forward_time = kPlanForwardTime, .backward_time = kPlanBackwardTime});
    NF_ASSERT_OK(ideal) << l.Name();
    auto nccl = SimulateUnderNcclRules(*plans, {.send_windows = SendWindows(l.kind, l.p, l.v)});
    NF_ASSERT_OK(nccl) << l.Name();
    EXPECT_EQ(nccl->makespan, ideal->makespan) << l.Name();
    EXPECT_EQ(nccl->busy, ideal->busy) << l.Name();
    ++layouts;
  }
  EXPECT_GT(layouts, MaxStages() == 16 ? 1000 : 100);
}

// The plan is built for a backward of twice a forward; under other costs it must still never
// deadlock (the argument does not depend on times), and stays close to that cost's ideal.
TEST(TransferPlanTest, OtherComputeCostsNeverDeadlock) {
  for (const Layout& l : Layouts(8)) {
    const auto schedules = Schedules(l);
    auto plans = BuildTransferPlans(schedules);
    NF_ASSERT_OK(plans) << l.Name();
    for (auto [f, b] : {std::pair<int64_t, int64_t>{1, 1}, {1, 3}, {2, 5}}) {
      auto ideal = SimulateSchedules(schedules, {.forward_time = f, .backward_time = b});
      NF_ASSERT_OK(ideal);
      auto nccl = SimulateUnderNcclRules(
          *plans,
          {.forward_time = f, .backward_time = b, .send_windows = SendWindows(l.kind, l.p, l.v)});
      NF_ASSERT_OK(nccl) << l.Name() << " f=" << f << " b=" << b;
      EXPECT_LE(nccl->makespan, ideal->makespan * 11 / 10) << l.Name() << " f=" << f << " b=" << b;
    }
  }
}

TEST(TransferPlanTest, ForwardOnlyRunsUnderNcclRulesInTheIdealTime) {
  for (int p = 2; p <= MaxStages(); ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = 1; m <= 4 * p; m += (m < 4 ? 1 : p)) {
        const std::string name = absl::StrCat("forward-only p=", p, " v=", v, " m=", m);
        auto schedules = BuildAllForwardOnlySchedules(p, m, v);
        NF_ASSERT_OK(schedules) << name;
        auto plans = BuildTransferPlans(*schedules);
        NF_ASSERT_OK(plans) << name;
        ExpectWellFormed(*schedules, *plans, name);
        auto ideal = SimulateSchedules(*schedules, {.forward_time = kPlanForwardTime});
        NF_ASSERT_OK(ideal);
        auto nccl = SimulateUnderNcclRules(
            *plans, {.send_windows = std::vector<int>(p, kForwardOnlySendWindow)});
        NF_ASSERT_OK(nccl) << name;
        EXPECT_EQ(nccl->makespan, ideal->makespan) << name;
      }
    }
  }
}

// The policy the NCCL communicator had before the plans: every send waits in a queue, which
// goes to NCCL with the next receive as one group, or alone when the executor waits for a
// queued send (its send window is full, or a backward needs its activation send done) and at
// the end. The executor's waits depend on counts only, so the groups follow from the lists.
std::vector<std::vector<PlanStep>> DeferredSendPlans(const std::vector<std::vector<Action>>& lists,
                                                     const std::vector<int>& windows) {
  std::vector<std::vector<PlanStep>> plans;
  for (size_t r = 0; r < lists.size(); ++r) {
    std::vector<PlanStep> plan;
    std::vector<Action> queued;
    std::deque<Action> pending;  // sends not yet waited for, oldest first
    auto flush = [&] {
      if (queued.empty()) return;
      plan.push_back({.actions = queued, .round = 0});
      queued.clear();
    };
    auto wait_for = [&](const Action& send) {
      if (std::find(queued.begin(), queued.end(), send) != queued.end()) flush();
    };
    for (const Action& a : lists[r]) {
      if (a.is_send()) {
        if (static_cast<int>(pending.size()) >= windows[r]) {
          wait_for(pending.front());
          pending.pop_front();
        }
        queued.push_back(a);
        pending.push_back(a);
      } else if (a.is_recv()) {
        queued.push_back(a);
        flush();
      } else {
        if (a.kind == Action::kBackward) {
          for (auto it = pending.begin(); it != pending.end(); ++it) {
            if (it->kind == Action::kSendActivation && it->micro_batch == a.micro_batch &&
                it->model_chunk == a.model_chunk) {
              wait_for(*it);
              pending.erase(it);
              break;
            }
          }
        }
        plan.push_back({.actions = {a}, .round = -1});
      }
    }
    flush();
    plans.push_back(std::move(plan));
  }
  return plans;
}

TEST(TransferPlanTest, DeferredSendsDeadlockInterleavedOneFOneB) {
  const Layout l{ScheduleKind::kInterleavedOneFOneB, 2, 2, 4};
  const auto schedules = Schedules(l);
  const std::vector<int> windows = SendWindows(l.kind, l.p, l.v);
  auto deferred =
      SimulateUnderNcclRules(DeferredSendPlans(schedules, windows), {.send_windows = windows});
  ASSERT_FALSE(deferred.ok());
  // The groups of the example: each waits for a receive the other posts only later.
  EXPECT_THAT(deferred.status().message(),
              HasSubstr("deadlock under NCCL's rules: rank 0 waits for the input of backward mb 1 "
                        "chunk 1; its communicator runs group [send_grad mb 0 chunk 1 to rank 1, "
                        "send_activation mb 3 chunk 0 to rank 1, recv_grad mb 1 chunk 1 from rank "
                        "1]"));
  EXPECT_THAT(deferred.status().message(),
              HasSubstr("its communicator runs group [send_activation mb 2 chunk 0 to rank 0, "
                        "recv_grad mb 0 chunk 0 from rank 0]"));
  // And every interleaved layout from m = 2p deadlocks that way.
  for (const Layout& layout : Layouts(8)) {
    if (layout.kind != ScheduleKind::kInterleavedOneFOneB || layout.m < 2 * layout.p) continue;
    const auto lists = Schedules(layout);
    const std::vector<int> w = SendWindows(layout.kind, layout.p, layout.v);
    EXPECT_FALSE(SimulateUnderNcclRules(DeferredSendPlans(lists, w), {.send_windows = w}).ok())
        << layout.Name();
  }
}

// Issue 34's figure: 1F1B on 8 stages, 16 micro-batches, a backward twice a forward. The ideal
// step is (m + p - 1)(f + b) = 69; deferring sends kept stage 0's p - 1 warm-up sends until its
// first receive (76). The plan sends each at once.
TEST(TransferPlanTest, WarmUpSendsLeaveAtOnce) {
  for (int m : {16, 64}) {
    const Layout l{ScheduleKind::kOneFOneB, 8, 1, m};
    const auto schedules = Schedules(l);
    const std::vector<int> windows = SendWindows(l.kind, l.p, l.v);
    auto ideal = SimulateSchedules(
        schedules, {.forward_time = kPlanForwardTime, .backward_time = kPlanBackwardTime});
    NF_ASSERT_OK(ideal);
    EXPECT_EQ(ideal->makespan, (m + 8 - 1) * 3);
    auto plans = BuildTransferPlans(schedules);
    NF_ASSERT_OK(plans);
    auto planned = SimulateUnderNcclRules(*plans, {.send_windows = windows});
    NF_ASSERT_OK(planned);
    EXPECT_EQ(planned->makespan, ideal->makespan) << "m=" << m;
    auto deferred =
        SimulateUnderNcclRules(DeferredSendPlans(schedules, windows), {.send_windows = windows});
    NF_ASSERT_OK(deferred);
    if (m == 16) {
      EXPECT_EQ(deferred->makespan, 76);
    }
    EXPECT_GT(deferred->makespan, ideal->makespan) << "m=" << m;
  }
}

TEST(TransferPlanTest, StageZerosWarmUpSendsAreEachTheirOwnGroupRightAfterTheirForward) {
  auto schedules = BuildAllSchedules(ScheduleKind::kOneFOneB, 4, 8);
  NF_ASSERT_OK(schedules);
  auto plans = BuildTransferPlans(*schedules);
  NF_ASSERT_OK(plans);
  const std::vector<PlanStep>& stage0 = (*plans)[0];
  ASSERT_GE(stage0.size(), 4u);
  EXPECT_EQ(PlanStepToString(stage0[0]), "forward mb 0 chunk 0");
  EXPECT_EQ(PlanStepToString(stage0[1]),
            "group [send_activation mb 0 chunk 0 to rank 1] (round 1)");
  EXPECT_EQ(PlanStepToString(stage0[2]), "forward mb 1 chunk 0");
  EXPECT_EQ(PlanStepToString(stage0[3]),
            "group [send_activation mb 1 chunk 0 to rank 1] (round 2)");
}

TEST(TransferPlanTest, ASendAloneAgainstASendAloneDeadlocks) {
  // Two ranks that each send first: fine under MPI's buffered model, stuck under NCCL's.
  const Action send01{
      .kind = Action::kSendActivation, .micro_batch = 0, .model_chunk = 0, .peer = 1};
  const Action recv10{.kind = Action::kRecvGrad, .micro_batch = 0, .model_chunk = 0, .peer = 1};
  const Action send10{.kind = Action::kSendGrad, .micro_batch = 0, .model_chunk = 0, .peer = 0};
  const Action recv01{
      .kind = Action::kRecvActivation, .micro_batch = 0, .model_chunk = 0, .peer = 0};
  const std::vector<std::vector<PlanStep>> alone = {
      {{.actions = {send01}, .round = 0}, {.actions = {recv10}, .round = 1}},
      {{.actions = {send10}, .round = 0}, {.actions = {recv01}, .round = 1}}};
  auto stuck = SimulateUnderNcclRules(alone, {.send_windows = {1, 1}});
  ASSERT_FALSE(stuck.ok());
  EXPECT_THAT(stuck.status().message(),
              HasSubstr("rank 0 waits for at the end, its send_activation"));
  const std::vector<std::vector<PlanStep>> grouped = {{{.actions = {send01, recv10}, .round = 0}},
                                                      {{.actions = {send10, recv01}, .round = 0}}};
  NF_EXPECT_OK(SimulateUnderNcclRules(grouped, {.send_windows = {1, 1}}));
}

}  // namespace
}  // namespace nf::parallel
