#include "core/ops/op_timing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/ops/backend.h"

namespace nf::ops {
namespace {

class WallClockSpan final : public TimedSpan {
 public:
  void End() override { end_ = Clock::now(); }
  double Seconds() override { return std::chrono::duration<double>(end_ - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_ = Clock::now(), end_ = start_;
};

// 0: not yet read from the environment; 1 off; 2 on.
std::atomic<int> enabled_state{0};

// Spans are kept until the report (reading a CUDA event's time waits for it); past this many,
// the oldest are read and folded into the totals, bounding memory (and the wait) in a long run.
constexpr size_t kMaxPendingSpans = 4096;

// The path the op running on this thread took (NoteOpPath), null until noted.
thread_local const char* noted_path = nullptr;
thread_local const char* noted_reason = nullptr;

struct PendingSpan {
  const char* op;
  const char* path;    // null: the op has one implementation
  const char* reason;  // null with path
  std::unique_ptr<TimedSpan> span;
};

struct Registry {
  std::mutex mutex;
  std::vector<PendingSpan> pending;
  std::map<std::tuple<std::string, std::string, std::string>, OpTime> totals;

  // Requires mutex held.
  void FoldPending() {
    for (PendingSpan& p : pending) {
      const std::string path = p.path != nullptr ? p.path : "";
      const std::string reason = p.reason != nullptr ? p.reason : "";
      OpTime& total = totals[{p.op, path, reason}];
      total.op = p.op;
      total.path = path;
      total.reason = reason;
      ++total.calls;
      total.seconds += p.span->Seconds();
    }
    pending.clear();
  }
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

std::unique_ptr<TimedSpan> StartWallClockSpan() { return std::make_unique<WallClockSpan>(); }

bool OpTimingEnabled() {
  int state = enabled_state.load(std::memory_order_relaxed);
  if (state == 0) {
    const char* value = std::getenv("NF_OP_TIMING");
    state = value != nullptr && std::strcmp(value, "1") == 0 ? 2 : 1;
    int expected = 0;
    if (!enabled_state.compare_exchange_strong(expected, state)) state = expected;
  }
  return state == 2;
}

void SetOpTimingEnabled(bool enabled) { enabled_state.store(enabled ? 2 : 1); }

absl::Status CheckOpTimingEnvironment() {
  const char* value = std::getenv("NF_OP_TIMING");
  if (value == nullptr || std::strcmp(value, "0") == 0 || std::strcmp(value, "1") == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "NF_OP_TIMING=%s is not a choice: 1 times every op, 0 or unset times none", value));
}

std::vector<OpTime> TakeOpTimes() {
  Registry& registry = TheRegistry();
  std::vector<OpTime> times;
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.FoldPending();
    for (auto& [op, time] : registry.totals) times.push_back(std::move(time));
    registry.totals.clear();
  }
  std::sort(times.begin(), times.end(), [](const OpTime& a, const OpTime& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds
                                  : std::tie(a.op, a.path) < std::tie(b.op, b.path);
  });
  return times;
}

void NoteOpPath(const char* path, const char* reason) {
  noted_path = path;
  noted_reason = reason;
}

std::string FormatOpTimes(const std::vector<OpTime>& times) {
  double total = 0.0;
  for (const OpTime& time : times) total += time.seconds;
  const auto name = [](const OpTime& time) {
    return time.path.empty() ? time.op : absl::StrCat(time.op, " (", time.path, ")");
  };
  std::string table =
      absl::StrFormat("%-32s %8s %12s %10s %7s\n", "op", "calls", "total ms", "mean us", "share");
  for (const OpTime& time : times) {
    absl::StrAppendFormat(&table, "%-32s %8d %12.3f %10.1f %6.1f%%\n", name(time), time.calls,
                          1e3 * time.seconds, 1e6 * time.seconds / std::max<int64_t>(1, time.calls),
                          total > 0.0 ? 100.0 * time.seconds / total : 0.0);
  }
  absl::StrAppendFormat(&table, "%-32s %8s %12.3f\n", "all ops", "", 1e3 * total);
  for (const OpTime& time : times) {
    if (!time.path.empty()) absl::StrAppend(&table, name(time), ": ", time.reason, "\n");
  }
  return table;
}

ScopedOpTiming::ScopedOpTiming(const char* op, Backend& backend)
    : op_(op), outer_path_(noted_path), outer_reason_(noted_reason) {
  NoteOpPath(nullptr, nullptr);
  if (OpTimingEnabled()) span_ = backend.StartTimedSpan();
}

ScopedOpTiming::~ScopedOpTiming() {
  const char* path = noted_path;
  const char* reason = noted_reason;
  NoteOpPath(outer_path_, outer_reason_);
  if (span_ == nullptr) return;
  span_->End();
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.pending.push_back({.op = op_, .path = path, .reason = reason, .span = std::move(span_)});
  if (registry.pending.size() >= kMaxPendingSpans) registry.FoldPending();
}

}  // namespace nf::ops
