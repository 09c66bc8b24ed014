#include "core/ops/op_timing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

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

struct Registry {
  std::mutex mutex;
  std::vector<std::pair<const char*, std::unique_ptr<TimedSpan>>> pending;
  std::map<std::string, OpTime> totals;

  // Requires mutex held.
  void FoldPending() {
    for (auto& [op, span] : pending) {
      OpTime& total = totals[op];
      total.op = op;
      ++total.calls;
      total.seconds += span->Seconds();
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
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  return times;
}

std::string FormatOpTimes(const std::vector<OpTime>& times) {
  double total = 0.0;
  for (const OpTime& time : times) total += time.seconds;
  std::string table =
      absl::StrFormat("%-32s %8s %12s %10s %7s\n", "op", "calls", "total ms", "mean us", "share");
  for (const OpTime& time : times) {
    absl::StrAppendFormat(&table, "%-32s %8d %12.3f %10.1f %6.1f%%\n", time.op, time.calls,
                          1e3 * time.seconds, 1e6 * time.seconds / std::max<int64_t>(1, time.calls),
                          total > 0.0 ? 100.0 * time.seconds / total : 0.0);
  }
  absl::StrAppendFormat(&table, "%-32s %8s %12.3f\n", "all ops", "", 1e3 * total);
  return table;
}

ScopedOpTiming::ScopedOpTiming(const char* op, Backend& backend) : op_(op) {
  if (OpTimingEnabled()) span_ = backend.StartTimedSpan();
}

ScopedOpTiming::~ScopedOpTiming() {
  if (span_ == nullptr) return;
  span_->End();
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.pending.emplace_back(op_, std::move(span_));
  if (registry.pending.size() >= kMaxPendingSpans) registry.FoldPending();
}

}  // namespace nf::ops
