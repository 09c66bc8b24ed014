#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nf::parallel {
namespace {

// "1", "1 or 3", "1, 2, 3 or 6".
std::string JoinOr(const std::vector<int>& values) {
  if (values.size() <= 1) return absl::StrJoin(values, "");
  return absl::StrCat(absl::StrJoin(values.begin(), values.end() - 1, ", "), " or ", values.back());
}

absl::string_view KindName(Action::Kind kind) {
  switch (kind) {
    case Action::kForward:
      return "forward";
    case Action::kBackward:
      return "backward";
    case Action::kSendActivation:
      return "send_activation";
    case Action::kRecvActivation:
      return "recv_activation";
    case Action::kSendGrad:
      return "send_grad";
    case Action::kRecvGrad:
      return "recv_grad";
  }
  return "unknown";
}

absl::Status CheckArguments(ScheduleKind kind, int p, int m, int v) {
  if (p < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_parallel must be at least 1, got ", p));
  }
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batches must be at least 1, got ", m));
  }
  if (v < 1) {
    return absl::InvalidArgumentError(absl::StrCat("virtual_stages must be at least 1, got ", v));
  }
  if (kind != ScheduleKind::kInterleavedOneFOneB) {
    if (v != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          ScheduleKindName(kind), " runs one stage per rank, got virtual_stages ", v,
          "; use virtual_stages 1, or ", ScheduleKindName(ScheduleKind::kInterleavedOneFOneB)));
    }
    return absl::OkStatus();
  }
  if (v == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved 1F1B needs virtual_stages of at least 2, got 1; use ",
                     ScheduleKindName(ScheduleKind::kOneFOneB), " for one stage per rank"));
  }
  if (p == 1) {
    // One rank would send every activation to itself: the chunks are simply one deeper stage.
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved 1F1B needs pipeline_parallel of at least 2, got 1; use ",
                     ScheduleKindName(ScheduleKind::kOneFOneB), " with virtual_stages 1"));
  }
  if (m % p != 0) {
    // Micro-batches go through the chunks in rounds of p; a partial round would leave ranks
    // waiting for a micro-batch that never comes. Advise the multiple at or below m (at least
    // p) and the next two.
    const int first = std::max(p, m / p * p);
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved 1F1B needs micro-batches (", m, ") to be a multiple of pipeline_parallel (", p,
        "); use ", JoinOr({first, first + p, first + 2 * p}), " micro-batches"));
  }
  return absl::OkStatus();
}

absl::Status CheckForwardOnlyArguments(int p, int m, int v) {
  if (absl::Status s = CheckArguments(ScheduleKind::kOneFOneB, p, m, 1); !s.ok()) return s;
  if (v < 1) {
    return absl::InvalidArgumentError(absl::StrCat("virtual_stages must be at least 1, got ", v));
  }
  if (v > 1 && p == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_stages ", v,
                     " needs pipeline_parallel of at least 2, got 1; use "
                     "virtual_stages 1"));
  }
  return absl::OkStatus();
}

// One computation in a rank's order, before the transfers around it are added.
struct Step {
  bool forward;
  int micro_batch;
  int chunk;
};

// The compute order of rank r (see BuildSchedule).
std::vector<Step> ComputeOrder(ScheduleKind kind, int p, int r, int m, int v) {
  std::vector<Step> steps;
  steps.reserve(2 * static_cast<size_t>(m) * v);
  if (kind == ScheduleKind::kGPipe) {
    for (int i = 0; i < m; ++i) steps.push_back({.forward = true, .micro_batch = i, .chunk = 0});
    for (int i = m - 1; i >= 0; --i) {
      steps.push_back({.forward = false, .micro_batch = i, .chunk = 0});
    }
    return steps;
  }
  // 1F1B is interleaved 1F1B with one chunk (step k is then micro-batch k on chunk 0); only
  // the warm-up differs. 1F1B's p - r - 1 forwards keep the later stages supplied until the
  // first gradient returns. Interleaving's first backward step is on chunk v - 1, so the
  // warm-up also covers a round of p micro-batches through the other v - 1 chunks, and twice
  // the distance to the last rank, there and back (Megatron's count).
  const int group = p * v;
  auto forward_step = [&](int k) {
    return Step{.forward = true, .micro_batch = k / group * p + k % p, .chunk = k % group / p};
  };
  auto backward_step = [&](int k) {
    return Step{
        .forward = false, .micro_batch = k / group * p + k % p, .chunk = v - 1 - k % group / p};
  };
  const int total = m * v;
  const int warmup =
      std::min(kind == ScheduleKind::kOneFOneB ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) steps.push_back(forward_step(k));
  for (int k = 0; k < total - warmup; ++k) {
    steps.push_back(forward_step(k + warmup));
    steps.push_back(backward_step(k));
  }
  for (int k = total - warmup; k < total; ++k) steps.push_back(backward_step(k));
  return steps;
}

// A message between model stages, as both ends see it.
struct Message {
  bool activation;
  int micro_batch;
  int from_stage;
  int to_stage;

  bool operator==(const Message&) const = default;
  std::string ToString() const {
    return absl::StrCat(activation ? "activation" : "gradient", " of mb ", micro_batch,
                        " from stage ", from_stage, " to stage ", to_stage);
  }
};

// The message a send or receive on `rank` of `p` transfers.
Message MessageOf(const Action& action, int rank, int p) {
  const int stage = action.model_chunk * p + rank;
  switch (action.kind) {
    case Action::kSendActivation:
      return {.activation = true,
              .micro_batch = action.micro_batch,
              .from_stage = stage,
              .to_stage = stage + 1};
    case Action::kRecvActivation:
      return {.activation = true,
              .micro_batch = action.micro_batch,
              .from_stage = stage - 1,
              .to_stage = stage};
    case Action::kSendGrad:
      return {.activation = false,
              .micro_batch = action.micro_batch,
              .from_stage = stage,
              .to_stage = stage - 1};
    default:  // kRecvGrad
      return {.activation = false,
              .micro_batch = action.micro_batch,
              .from_stage = stage + 1,
              .to_stage = stage};
  }
}

// The rank a transfer must name as its peer: the rank of the stage at the other end.
int ExpectedPeer(const Action& action, int rank, int p) {
  const Message message = MessageOf(action, rank, p);
  const int other = action.is_send() ? message.to_stage : message.from_stage;
  return ((other % p) + p) % p;
}

// Checks each transfer's peer, and that no transfer leaves the model's stages.
absl::Status CheckPeers(absl::Span<const std::vector<Action>> schedules) {
  const int p = static_cast<int>(schedules.size());
  int stages = 0;  // p * v, from the largest chunk seen
  for (const auto& list : schedules) {
    for (const Action& a : list) stages = std::max(stages, (a.model_chunk + 1) * p);
  }
  for (int rank = 0; rank < p; ++rank) {
    for (size_t i = 0; i < schedules[rank].size(); ++i) {
      const Action& a = schedules[rank][i];
      if (a.is_compute()) continue;
      const Message message = MessageOf(a, rank, p);
      if (message.from_stage < 0 || message.to_stage >= stages || a.model_chunk < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", rank, " action ", i, " (", a.ToString(), ") transfers the ",
                         message.ToString(), ", outside the model's ", stages, " stages"));
      }
      const int expected = ExpectedPeer(a, rank, p);
      if (a.peer != expected) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank, " action ", i, " (", a.ToString(), ") transfers the ",
            message.ToString(), ", which is rank ", expected, "'s, not rank ", a.peer, "'s"));
      }
    }
  }
  return absl::OkStatus();
}

// The actions of one forward of `chunk` (model stage `stage`) on micro-batch `mb`: its input
// received from the previous rank unless it is the first stage, its output sent to the next
// unless it is the last.
void AppendForward(int stage, int last_stage, int mb, int chunk, int previous, int next,
                   std::vector<Action>& actions) {
  if (stage > 0) {
    actions.push_back({.kind = Action::kRecvActivation,
                       .micro_batch = mb,
                       .model_chunk = chunk,
                       .peer = previous});
  }
  actions.push_back(
      {.kind = Action::kForward, .micro_batch = mb, .model_chunk = chunk, .peer = -1});
  if (stage < last_stage) {
    actions.push_back(
        {.kind = Action::kSendActivation, .micro_batch = mb, .model_chunk = chunk, .peer = next});
  }
}

}  // namespace

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "GPIPE";
    case ScheduleKind::kOneFOneB:
      return "ONE_F_ONE_B";
    case ScheduleKind::kInterleavedOneFOneB:
      return "INTERLEAVED_ONE_F_ONE_B";
  }
  return "UNKNOWN";
}

std::string Action::ToString() const {
  std::string out = absl::StrCat(KindName(kind), " mb ", micro_batch, " chunk ", model_chunk);
  if (is_send()) absl::StrAppend(&out, " to rank ", peer);
  if (is_recv()) absl::StrAppend(&out, " from rank ", peer);
  return out;
}

absl::StatusOr<std::vector<Action>> BuildSchedule(ScheduleKind kind, int pipeline_size,
                                                  int pipeline_rank, int micro_batches,
                                                  int virtual_stages) {
  const int p = pipeline_size, r = pipeline_rank, m = micro_batches, v = virtual_stages;
  if (p >= 1 && (r < 0 || r >= p)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline rank ", r, " is out of range for pipeline_parallel ", p,
                     p == 1 ? "; use 0" : absl::StrCat("; use 0 to ", p - 1)));
  }
  if (absl::Status s = CheckArguments(kind, p, m, v); !s.ok()) return s;

  const int last_stage = p * v - 1;
  const int next = (r + 1) % p, previous = (r + p - 1) % p;
  std::vector<Action> actions;
  actions.reserve(6 * static_cast<size_t>(m) * v);
  for (const Step& step : ComputeOrder(kind, p, r, m, v)) {
    const int stage = step.chunk * p + r;
    const int mb = step.micro_batch, chunk = step.chunk;
    if (step.forward) {
      AppendForward(stage, last_stage, mb, chunk, previous, next, actions);
    } else {
      if (stage < last_stage) {
        actions.push_back(
            {.kind = Action::kRecvGrad, .micro_batch = mb, .model_chunk = chunk, .peer = next});
      }
      actions.push_back(
          {.kind = Action::kBackward, .micro_batch = mb, .model_chunk = chunk, .peer = -1});
      if (stage > 0) {
        actions.push_back(
            {.kind = Action::kSendGrad, .micro_batch = mb, .model_chunk = chunk, .peer = previous});
      }
    }
  }
  return actions;
}

absl::StatusOr<std::vector<std::vector<Action>>> BuildAllSchedules(ScheduleKind kind,
                                                                   int pipeline_size,
                                                                   int micro_batches,
                                                                   int virtual_stages) {
  std::vector<std::vector<Action>> schedules;
  if (absl::Status s = CheckArguments(kind, pipeline_size, micro_batches, virtual_stages);
      !s.ok()) {
    return s;
  }
  for (int r = 0; r < pipeline_size; ++r) {
    auto list = BuildSchedule(kind, pipeline_size, r, micro_batches, virtual_stages);
    if (!list.ok()) return list.status();
    schedules.push_back(*std::move(list));
  }
  return schedules;
}

absl::StatusOr<std::vector<Action>> BuildForwardOnlySchedule(int pipeline_size, int pipeline_rank,
                                                             int micro_batches,
                                                             int virtual_stages) {
  const int p = pipeline_size, r = pipeline_rank, m = micro_batches, v = virtual_stages;
  if (absl::Status s = CheckForwardOnlyArguments(p, m, v); !s.ok()) return s;
  if (r < 0 || r >= p) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline rank ", r, " is out of range for pipeline_parallel ", p,
                     p == 1 ? "; use 0" : absl::StrCat("; use 0 to ", p - 1)));
  }
  const int last_stage = p * v - 1;
  const int next = (r + 1) % p, previous = (r + p - 1) % p;
  std::vector<Action> actions;
  actions.reserve(3 * static_cast<size_t>(m) * v);
  // Rounds of p micro-batches through one chunk after the other: stage p - 1 returns the round's
  // first micro-batch to rank 0 just as rank 0 has forwarded the round's last one through the
  // chunk before, so no rank idles after the filling (m v + p - 1 steps when p divides m).
  for (int round_begin = 0; round_begin < m; round_begin += p) {
    const int round_end = std::min(round_begin + p, m);
    for (int chunk = 0; chunk < v; ++chunk) {
      for (int mb = round_begin; mb < round_end; ++mb) {
        AppendForward(chunk * p + r, last_stage, mb, chunk, previous, next, actions);
      }
    }
  }
  return actions;
}

absl::StatusOr<std::vector<std::vector<Action>>> BuildAllForwardOnlySchedules(int pipeline_size,
                                                                              int micro_batches,
                                                                              int virtual_stages) {
  if (absl::Status s = CheckForwardOnlyArguments(pipeline_size, micro_batches, virtual_stages);
      !s.ok()) {
    return s;
  }
  std::vector<std::vector<Action>> schedules;
  for (int r = 0; r < pipeline_size; ++r) {
    auto list = BuildForwardOnlySchedule(pipeline_size, r, micro_batches, virtual_stages);
    if (!list.ok()) return list.status();
    schedules.push_back(*std::move(list));
  }
  return schedules;
}

int SendWindow(ScheduleKind kind, int pipeline_size, int pipeline_rank, int virtual_stages) {
  const int p = pipeline_size, r = pipeline_rank, v = virtual_stages;
  if (kind == ScheduleKind::kInterleavedOneFOneB) return (p - r - 1) * 2 + (v - 1) * p + 1;
  return p - r;  // GPipe and 1F1B
}

std::vector<int> SendWindows(ScheduleKind kind, int pipeline_size, int virtual_stages) {
  std::vector<int> windows;
  for (int r = 0; r < pipeline_size; ++r) {
    windows.push_back(SendWindow(kind, pipeline_size, r, virtual_stages));
  }
  return windows;
}

absl::Status CheckSchedulePairing(absl::Span<const std::vector<Action>> schedules) {
  const int p = static_cast<int>(schedules.size());
  if (absl::Status s = CheckPeers(schedules); !s.ok()) return s;
  // Per ordered pair (from, to): the messages in send order and in receive order, with the
  // index of the action for the error.
  using Entry = std::pair<Message, size_t>;
  std::map<std::pair<int, int>, std::vector<Entry>> sent, received;
  for (int rank = 0; rank < p; ++rank) {
    for (size_t i = 0; i < schedules[rank].size(); ++i) {
      const Action& a = schedules[rank][i];
      if (a.is_send()) sent[{rank, a.peer}].push_back({MessageOf(a, rank, p), i});
      if (a.is_recv()) received[{a.peer, rank}].push_back({MessageOf(a, rank, p), i});
    }
  }
  for (int from = 0; from < p; ++from) {
    for (int to = 0; to < p; ++to) {
      const std::vector<Entry>& s = sent[{from, to}];
      const std::vector<Entry>& r = received[{from, to}];
      for (size_t k = 0; k < std::max(s.size(), r.size()); ++k) {
        if (k >= r.size()) {
          return absl::FailedPreconditionError(
              absl::StrCat("rank ", from, " action ", s[k].second, " sends the ",
                           s[k].first.ToString(), ", which rank ", to, " never receives"));
        }
        if (k >= s.size()) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", to, " action ", r[k].second,
                                                            " receives the ", r[k].first.ToString(),
                                                            ", which rank ", from, " never sends"));
        }
        if (!(s[k].first == r[k].first)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "message ", k, " from rank ", from, " to rank ", to, " is the ",
              s[k].first.ToString(), " (rank ", from, " action ", s[k].second, "), but rank ", to,
              " action ", r[k].second, " receives it as the ", r[k].first.ToString()));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SimulationResult> SimulateSchedules(absl::Span<const std::vector<Action>> schedules,
                                                   SimulationOptions options) {
  const int p = static_cast<int>(schedules.size());
  if (absl::Status s = CheckPeers(schedules); !s.ok()) return s;
  const bool rendezvous = !options.send_windows.empty();
  if (rendezvous && static_cast<int>(options.send_windows.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("send_windows has ", options.send_windows.size(),
                                                   " entries for ", p, " ranks"));
  }
  for (int w : options.send_windows) {
    if (w < 1) return absl::InvalidArgumentError(absl::StrCat("a send window of ", w, " < 1"));
  }
  struct InFlight {
    Message message;
    int64_t sent_at;
    int64_t received_at = -1;  // -1 until received
  };
  // Every message sent, per ordered pair (from, to), in send order; the first `received` of
  // each have been received.
  std::vector<std::vector<InFlight>> channels(static_cast<size_t>(p) * p);
  std::vector<size_t> received(static_cast<size_t>(p) * p, 0);
  auto channel_of = [&](int from, int to) { return static_cast<size_t>(from) * p + to; };
  // A send its rank has not waited for yet: the message's channel and index in it.
  struct Pending {
    Action action;
    size_t channel;
    size_t index;
  };
  std::vector<std::deque<Pending>> pending(p);
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> clock(p, 0);
  SimulationResult result;
  result.busy.assign(p, 0);
  result.peak_pending_sends.assign(p, 0);
  result.done_at.resize(p);
  for (int rank = 0; rank < p; ++rank) result.done_at[rank].assign(schedules[rank].size(), 0);
  // The send `rank` must wait for before its next action (or, past its list, before it is
  // done), if any: an index into pending[rank].
  auto wait_before = [&](int rank) -> std::optional<size_t> {
    if (!rendezvous || pending[rank].empty()) return std::nullopt;
    const std::vector<Action>& list = schedules[rank];
    if (next[rank] == list.size()) return 0;
    const Action& a = list[next[rank]];
    if (a.is_send() && static_cast<int>(pending[rank].size()) >= options.send_windows[rank]) {
      return 0;
    }
    if (a.kind == Action::kBackward) {
      for (size_t k = 0; k < pending[rank].size(); ++k) {
        const Action& sent = pending[rank][k].action;
        if (sent.kind == Action::kSendActivation && sent.micro_batch == a.micro_batch &&
            sent.model_chunk == a.model_chunk) {
          return k;
        }
      }
    }
    return std::nullopt;
  };
  // Each pass runs every rank until it finishes or blocks on an empty channel or a send not yet
  // received. A message's time is fixed when it is sent, and a send's completion when it is
  // received, so the order in which ranks are advanced does not change any time; only whether
  // a pass makes progress matters.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int rank = 0; rank < p; ++rank) {
      const std::vector<Action>& list = schedules[rank];
      while (true) {
        if (const std::optional<size_t> wait = wait_before(rank)) {
          const Pending& send = pending[rank][*wait];
          if (received[send.channel] <= send.index) break;  // its receiver is not there yet
          clock[rank] = std::max(clock[rank], channels[send.channel][send.index].received_at);
          pending[rank].erase(pending[rank].begin() + static_cast<std::ptrdiff_t>(*wait));
          progress = true;
          continue;
        }
        if (next[rank] == list.size()) break;
        const Action& a = list[next[rank]];
        if (a.is_compute()) {
          const int64_t t =
              a.kind == Action::kForward ? options.forward_time : options.backward_time;
          clock[rank] += t;
          result.busy[rank] += t;
        } else if (a.is_send()) {
          const size_t c = channel_of(rank, a.peer);
          pending[rank].push_back({.action = a, .channel = c, .index = channels[c].size()});
          result.peak_pending_sends[rank] =
              std::max(result.peak_pending_sends[rank], static_cast<int>(pending[rank].size()));
          channels[c].push_back({.message = MessageOf(a, rank, p), .sent_at = clock[rank]});
        } else {
          const size_t c = channel_of(a.peer, rank);
          if (received[c] == channels[c].size()) break;
          InFlight& in = channels[c][received[c]];
          const Message expected = MessageOf(a, rank, p);
          if (!(in.message == expected)) {
            return absl::FailedPreconditionError(absl::StrCat(
                "rank ", rank, " action ", next[rank], " (", a.ToString(), ") expects the ",
                expected.ToString(), ", but the next message from rank ", a.peer, " is the ",
                in.message.ToString()));
          }
          clock[rank] = std::max(clock[rank], in.sent_at);
          in.received_at = clock[rank];
          ++received[c];
        }
        result.done_at[rank][next[rank]] = clock[rank];
        ++next[rank];
        progress = true;
      }
    }
  }
  std::vector<std::string> blocked;
  for (int rank = 0; rank < p; ++rank) {
    if (const std::optional<size_t> wait = wait_before(rank)) {
      const Pending& send = pending[rank][*wait];
      blocked.push_back(absl::StrCat("rank ", rank,
                                     next[rank] < schedules[rank].size()
                                         ? absl::StrCat(" before action ", next[rank], " (",
                                                        schedules[rank][next[rank]].ToString(), ")")
                                         : std::string(" at the end"),
                                     " waits for its ", send.action.ToString(), " to be received"));
    } else if (next[rank] < schedules[rank].size()) {
      blocked.push_back(absl::StrCat("rank ", rank, " at action ", next[rank], " (",
                                     schedules[rank][next[rank]].ToString(), ")"));
    }
  }
  if (!blocked.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("deadlock: ", absl::StrJoin(blocked, ", "),
                     rendezvous ? "; each waits for a message never sent or received"
                                : " wait for messages never sent"));
  }
  for (int from = 0; from < p; ++from) {
    for (int to = 0; to < p; ++to) {
      const size_t c = channel_of(from, to);
      if (received[c] < channels[c].size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", from, " sends the ", channels[c][received[c]].message.ToString(),
                         " to rank ", to, ", which never receives it"));
      }
    }
  }
  result.finish = clock;
  result.makespan = p == 0 ? 0 : *std::max_element(clock.begin(), clock.end());
  const int64_t busy = std::accumulate(result.busy.begin(), result.busy.end(), int64_t{0});
  // One division of exact integers: the correctly rounded ratio, so a test can compare it
  // exactly with a formula's.
  const int64_t capacity = p * result.makespan;
  result.idle_fraction =
      capacity == 0 ? 0.0 : static_cast<double>(capacity - busy) / static_cast<double>(capacity);
  return result;
}

absl::Status CheckLayerSplit(int num_layers, int pipeline_size, int virtual_stages) {
  if (num_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_layers must be at least 1, got ", num_layers));
  }
  if (pipeline_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_parallel must be at least 1, got ", pipeline_size));
  }
  if (virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_stages must be at least 1, got ", virtual_stages));
  }
  const int stages = pipeline_size * virtual_stages;
  if (num_layers % stages == 0) return absl::OkStatus();
  std::vector<int> working;
  for (int d = 2; d <= num_layers; ++d) {
    if (num_layers % d == 0) working.push_back(d);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model.num_layers (", num_layers, ") does not split into pipeline_parallel ", pipeline_size,
      " x virtual_stages ", virtual_stages, " = ", stages, " equal stages; use ",
      working.empty() ? "1 stage" : absl::StrCat(JoinOr(working), " stages")));
}

std::vector<std::pair<int, int>> StageLayers(int num_layers, int pipeline_size,
                                             int virtual_stages) {
  const int stages = std::max(1, pipeline_size * virtual_stages);
  const int base = num_layers / stages, extra = num_layers % stages;
  std::vector<std::pair<int, int>> ranges;
  ranges.reserve(stages);
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int end = begin + base + (s < extra ? 1 : 0);
    ranges.push_back({begin, end});
    begin = end;
  }
  return ranges;
}

absl::StatusOr<std::vector<std::pair<int, int>>> StageLayers(
    int num_layers, int pipeline_size, int virtual_stages, absl::Span<const int> layers_per_stage) {
  const int stages = pipeline_size * virtual_stages;
  if (static_cast<int>(layers_per_stage.size()) != stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layer split [", absl::StrJoin(layers_per_stage, ", "), "] has ",
                     layers_per_stage.size(), " entries; pipeline_parallel ", pipeline_size,
                     " x virtual_stages ", virtual_stages, " needs ", stages));
  }
  std::vector<std::pair<int, int>> ranges;
  int begin = 0;
  for (int count : layers_per_stage) {
    if (count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the layer split [", absl::StrJoin(layers_per_stage, ", "),
                       "] gives a stage no layers; every stage needs at least 1"));
    }
    ranges.push_back({begin, begin + count});
    begin += count;
  }
  if (begin != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layer split [", absl::StrJoin(layers_per_stage, ", "), "] sums to ",
                     begin, " layers; model.num_layers is ", num_layers));
  }
  return ranges;
}

}  // namespace nf::parallel
