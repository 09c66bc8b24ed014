#include "parallel/transfer_plan.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nf::parallel {
namespace {

size_t ChannelOf(int from, int to, int p) { return static_cast<size_t>(from) * p + to; }

int64_t ComputeTime(const Action& a, const NcclRulesOptions& options) {
  return a.kind == Action::kForward ? options.forward_time : options.backward_time;
}

// The receive a computation reads, as (activation?, micro-batch, chunk); a forward reads an
// activation, a backward a gradient.
using InputKey = std::tuple<bool, int, int>;
InputKey InputOf(const Action& a) {
  if (a.is_recv()) return {a.kind == Action::kRecvActivation, a.micro_batch, a.model_chunk};
  return {a.kind == Action::kForward, a.micro_batch, a.model_chunk};
}

}  // namespace

std::string PlanStepToString(const PlanStep& step) {
  if (step.is_compute()) return step.actions[0].ToString();
  return absl::StrCat(
      "group [",
      absl::StrJoin(step.actions, ", ",
                    [](std::string* out, const Action& a) { absl::StrAppend(out, a.ToString()); }),
      "] (round ", step.round, ")");
}

absl::StatusOr<std::vector<std::vector<PlanStep>>> BuildTransferPlans(
    absl::Span<const std::vector<Action>> schedules) {
  if (absl::Status s = CheckSchedulePairing(schedules); !s.ok()) return s;
  const int p = static_cast<int>(schedules.size());
  auto ideal = SimulateSchedules(
      schedules, {.forward_time = kPlanForwardTime, .backward_time = kPlanBackwardTime});
  if (!ideal.ok()) return ideal.status();

  // The ideal send time of every message, per channel in send order.
  std::vector<std::vector<int64_t>> sent_at(static_cast<size_t>(p) * p);
  for (int rank = 0; rank < p; ++rank) {
    for (size_t i = 0; i < schedules[rank].size(); ++i) {
      const Action& a = schedules[rank][i];
      if (a.is_send()) sent_at[ChannelOf(rank, a.peer, p)].push_back(ideal->done_at[rank][i]);
    }
  }

  std::vector<std::vector<PlanStep>> plans(p);
  for (int rank = 0; rank < p; ++rank) {
    const std::vector<Action>& list = schedules[rank];
    // boundary_time[k]: when the rank's k-th computation ended in the ideal run (0 for k = 0),
    // where the transfers between computations k - 1 and k are issued.
    std::vector<int64_t> boundary_time = {0};
    std::vector<Action> computes;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_compute()) continue;
      computes.push_back(list[i]);
      boundary_time.push_back(ideal->done_at[rank][i]);
    }
    struct Placed {
      int64_t round;
      bool receive;
      Action action;
    };
    std::vector<std::vector<Placed>> at_boundary(computes.size() + 1);
    std::vector<size_t> received(p, 0);
    size_t boundary = 0;  // the computations before the action in the list
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.is_compute()) {
        ++boundary;
      } else if (a.is_send()) {
        at_boundary[boundary].push_back(
            {.round = ideal->done_at[rank][i], .receive = false, .action = a});
      } else {
        const int64_t round = sent_at[ChannelOf(a.peer, rank, p)][received[a.peer]++];
        // The last boundary at or before the ideal send time; times grow along the rank.
        size_t k = boundary;
        while (k > 0 && boundary_time[k] > round) --k;
        at_boundary[k].push_back({.round = round, .receive = true, .action = a});
      }
    }
    for (size_t k = 0; k < at_boundary.size(); ++k) {
      std::vector<Placed>& placed = at_boundary[k];
      std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
        return std::tie(a.round, a.receive) < std::tie(b.round, b.receive);
      });
      for (size_t j = 0; j < placed.size(); ++j) {
        if (j == 0 || placed[j].round != placed[j - 1].round) {
          plans[rank].push_back({.actions = {}, .round = placed[j].round});
        }
        plans[rank].back().actions.push_back(placed[j].action);
      }
      if (k < computes.size()) plans[rank].push_back({.actions = {computes[k]}, .round = -1});
    }
  }
  return plans;
}

absl::StatusOr<SimulationResult> SimulateUnderNcclRules(
    absl::Span<const std::vector<PlanStep>> plans, const NcclRulesOptions& options) {
  const int p = static_cast<int>(plans.size());
  if (static_cast<int>(options.send_windows.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("send_windows has ", options.send_windows.size(),
                                                   " entries for ", p, " ranks"));
  }
  for (int w : options.send_windows) {
    if (w < 1) return absl::InvalidArgumentError(absl::StrCat("a send window of ", w, " < 1"));
  }
  // A group issued to a rank's communicator.
  struct Group {
    const PlanStep* step;
    std::vector<size_t> index;  // per transfer, its place in its channel's order
    int64_t issued_at;
    std::optional<int64_t> started_at = std::nullopt, done_at = std::nullopt;
  };
  // The two ends of a message: (rank, index in its groups), in channel order.
  struct End {
    int rank;
    size_t group;
  };
  std::vector<std::vector<End>> send_ends(static_cast<size_t>(p) * p),
      recv_ends(static_cast<size_t>(p) * p);
  struct PendingSend {
    Action action;
    size_t group;
  };
  struct Rank {
    size_t next = 0;  // the next step of its plan
    int64_t clock = 0;
    std::vector<Group> groups;
    size_t head = 0;  // the first group not done: the one its communicator runs
    std::deque<PendingSend> sends;
    std::map<InputKey, size_t> inputs;  // receive -> its group
    std::set<InputKey> planned_inputs;  // every receive of the plan
    // What the host waits for, for the deadlock report.
    std::string waiting_for;
  };
  std::vector<Rank> ranks(p);
  SimulationResult result;
  result.busy.assign(p, 0);
  result.peak_pending_sends.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    for (const PlanStep& step : plans[r]) {
      for (const Action& a : step.actions) {
        if (a.is_recv()) ranks[r].planned_inputs.insert(InputOf(a));
      }
    }
  }

  // The host of `r` waits for group `g` of its own communicator: returns whether it may go on.
  auto waited = [&](int r, size_t g, std::string what) {
    Rank& rank = ranks[r];
    if (!rank.groups[g].done_at) {
      rank.waiting_for = std::move(what);
      return false;
    }
    rank.clock = std::max(rank.clock, *rank.groups[g].done_at);
    return true;
  };

  // Runs the host of `r` until it blocks or ends; returns whether it moved.
  auto advance_host = [&](int r) -> absl::StatusOr<bool> {
    Rank& rank = ranks[r];
    bool moved = false;
    while (true) {
      if (rank.next == plans[r].size()) {
        while (!rank.sends.empty()) {
          const PendingSend& send = rank.sends.front();
          if (!waited(r, send.group, absl::StrCat("at the end, its ", send.action.ToString())))
            return moved;
          rank.sends.pop_front();
          moved = true;
        }
        rank.waiting_for.clear();
        return moved;
      }
      const PlanStep& step = plans[r][rank.next];
      if (!step.is_compute()) {
        const bool sends = std::any_of(step.actions.begin(), step.actions.end(),
                                       [](const Action& a) { return a.is_send(); });
        if (sends && static_cast<int>(rank.sends.size()) >= options.send_windows[r]) {
          const PendingSend& oldest = rank.sends.front();
          if (!waited(r, oldest.group, absl::StrCat("its send window: ", oldest.action.ToString())))
            return moved;
          rank.sends.pop_front();
          moved = true;
          continue;
        }
        const size_t g = rank.groups.size();
        Group group{.step = &step,
                    .index = {},
                    .issued_at = rank.clock,
                    .started_at = std::nullopt,
                    .done_at = std::nullopt};
        for (const Action& a : step.actions) {
          if (a.is_send()) {
            std::vector<End>& ends = send_ends[ChannelOf(r, a.peer, p)];
            group.index.push_back(ends.size());
            ends.push_back({r, g});
            rank.sends.push_back({a, g});
          } else {
            std::vector<End>& ends = recv_ends[ChannelOf(a.peer, r, p)];
            group.index.push_back(ends.size());
            ends.push_back({r, g});
            rank.inputs[InputOf(a)] = g;
          }
        }
        rank.groups.push_back(std::move(group));
        result.peak_pending_sends[r] =
            std::max(result.peak_pending_sends[r], static_cast<int>(rank.sends.size()));
      } else {
        const Action& a = step.actions[0];
        if (a.kind == Action::kBackward) {
          // Its activation send read what the backward releases.
          const auto sent = std::find_if(rank.sends.begin(), rank.sends.end(), [&](const auto& s) {
            return s.action.kind == Action::kSendActivation &&
                   s.action.micro_batch == a.micro_batch && s.action.model_chunk == a.model_chunk;
          });
          if (sent != rank.sends.end()) {
            if (!waited(r, sent->group,
                        absl::StrCat("before ", a.ToString(), ", its ", sent->action.ToString())))
              return moved;
            rank.sends.erase(sent);
            moved = true;
            continue;
          }
        }
        const InputKey key = InputOf(a);
        if (rank.planned_inputs.contains(key)) {
          const auto input = rank.inputs.find(key);
          if (input == rank.inputs.end()) {
            return absl::StatusOr<bool>(absl::FailedPreconditionError(
                absl::StrCat("rank ", r, " reaches ", a.ToString(),
                             " before issuing the receive of its input")));
          }
          if (!waited(r, input->second, absl::StrCat("the input of ", a.ToString()))) return moved;
          rank.inputs.erase(input);
          rank.planned_inputs.erase(key);
        }
        const int64_t t = ComputeTime(a, options);
        rank.clock += t;
        result.busy[r] += t;
      }
      ++rank.next;
      moved = true;
    }
  };

  // The other end of `a`, the transfer at `index` in its channel's order on `r`, if issued.
  auto other_end = [&](int r, const Action& a, size_t index) -> std::optional<End> {
    const size_t channel = a.is_send() ? ChannelOf(r, a.peer, p) : ChannelOf(a.peer, r, p);
    const std::vector<End>& theirs = a.is_send() ? recv_ends[channel] : send_ends[channel];
    if (index >= theirs.size()) return std::nullopt;
    return theirs[index];
  };

  // Runs the communicator of `r` until its head group cannot complete; returns whether it moved.
  auto advance_comm = [&](int r) {
    Rank& rank = ranks[r];
    bool moved = false;
    while (rank.head < rank.groups.size()) {
      Group& group = rank.groups[rank.head];
      if (!group.started_at) {
        group.started_at = std::max(
            group.issued_at, rank.head == 0 ? int64_t{0} : *rank.groups[rank.head - 1].done_at);
        moved = true;
      }
      int64_t done = *group.started_at;
      for (size_t i = 0; i < group.step->actions.size(); ++i) {
        const std::optional<End> other = other_end(r, group.step->actions[i], group.index[i]);
        if (!other) return moved;
        const std::optional<int64_t> other_start =
            ranks[other->rank].groups[other->group].started_at;
        if (!other_start) return moved;
        done = std::max(done, *other_start);
      }
      group.done_at = done;
      ++rank.head;
      moved = true;
    }
    return moved;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      absl::StatusOr<bool> moved = advance_host(r);
      if (!moved.ok()) return moved.status();
      progress |= *moved;
    }
    for (int r = 0; r < p; ++r) progress |= advance_comm(r);
  }

  std::vector<std::string> stuck;
  for (int r = 0; r < p; ++r) {
    const Rank& rank = ranks[r];
    if (rank.next == plans[r].size() && rank.sends.empty()) continue;
    std::string line = absl::StrCat("rank ", r, " waits for ", rank.waiting_for);
    if (rank.head < rank.groups.size()) {
      absl::StrAppend(&line, "; its communicator runs ",
                      PlanStepToString(*rank.groups[rank.head].step));
    }
    stuck.push_back(std::move(line));
  }
  if (!stuck.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("deadlock under NCCL's rules: ", absl::StrJoin(stuck, "; "),
                     " (a group completes only when every transfer in it has its other end "
                     "started)"));
  }
  for (int r = 0; r < p; ++r) result.finish.push_back(ranks[r].clock);
  result.makespan = p == 0 ? 0 : *std::max_element(result.finish.begin(), result.finish.end());
  const int64_t busy = std::accumulate(result.busy.begin(), result.busy.end(), int64_t{0});
  const int64_t capacity = p * result.makespan;
  result.idle_fraction =
      capacity == 0 ? 0.0 : static_cast<double>(capacity - busy) / static_cast<double>(capacity);
  return result;
}

}  // namespace nf::parallel
