#include "parallel/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "parallel/mpi_runtime.h"

namespace nf::parallel {
namespace {

std::atomic<int64_t> current_step{-1};

struct Label {
  std::mutex mu;
  std::string text;
  std::vector<std::string> hosts;  // by world rank; empty until SetRankHosts
};

Label& GetLabel() {
  static Label* label = new Label();  // never destroyed: read while aborting
  return *label;
}

std::string FormatSeconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), "s"); }

}  // namespace

void SetCurrentStep(int64_t step) { current_step.store(step, std::memory_order_relaxed); }
int64_t CurrentStep() { return current_step.load(std::memory_order_relaxed); }

void SetRankLabel(std::string label) {
  Label& l = GetLabel();
  std::lock_guard<std::mutex> lock(l.mu);
  l.text = std::move(label);
}

void SetRankHosts(std::vector<std::string> hosts) {
  Label& l = GetLabel();
  std::lock_guard<std::mutex> lock(l.mu);
  l.hosts = std::move(hosts);
}

std::vector<std::string> RankHosts() {
  Label& l = GetLabel();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.hosts;
}

std::string RankLabel() {
  Label& l = GetLabel();
  {
    std::lock_guard<std::mutex> lock(l.mu);
    if (!l.text.empty()) return l.text;
  }
  // A process without MPI (MpiWorldRank -1) is a job's only rank.
  return absl::StrCat("rank ", std::max(0, MpiWorldRank()));
}

std::string WatchdogReport(absl::string_view rank_label, const WaitTarget& target,
                           absl::Duration timeout, int64_t step,
                           absl::Span<const std::string> hosts) {
  const bool one_host =
      std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
  const auto peer = [&](std::string* out, int rank) {
    absl::StrAppend(out, rank);
    if (!one_host && rank >= 0 && rank < static_cast<int>(hosts.size())) {
      absl::StrAppend(out, " on ", hosts[rank]);
    }
  };
  return absl::StrCat(
      rank_label, ": ", target.operation, " on group ", target.group, " (ranks [",
      absl::StrJoin(target.group_ranks, ", "), "]) did not complete within ",
      FormatSeconds(timeout), step < 0 ? " before the first step" : absl::StrCat(" at step ", step),
      "; waiting for peers [", absl::StrJoin(target.peers, ", ", peer), "]; aborting the job");
}

namespace {
std::atomic<void (*)(const std::string&)> expiry_hook{nullptr};
}  // namespace

void SetWatchdogExpiryHook(void (*hook)(const std::string& report)) { expiry_hook.store(hook); }

void RunWatchdogExpiryHook(const std::string& report) {
  if (auto* hook = expiry_hook.load()) hook(report);
}

void WriteReportLine(const std::string& report) {
  const std::string line = absl::StrCat(report, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

absl::Status WaitUnderWatchdog(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                               const WaitTarget& target, const WatchdogOptions& options) {
  return WaitUnderWatchdog(poll, target, options, [] {});
}

absl::Status WaitUnderWatchdog(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                               const WaitTarget& target, const WatchdogOptions& options,
                               absl::FunctionRef<void()> before_abort) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + absl::ToChronoNanoseconds(options.timeout);
  // Most operations complete within a few polls; only then start sleeping, doubling the nap
  // up to 1 ms, which bounds the latency added to a long wait at about 1 ms.
  constexpr int kSpins = 32;
  constexpr std::chrono::microseconds kMaxNap(1000);
  std::chrono::microseconds nap(8);
  for (int polls = 0;; ++polls) {
    NF_ASSIGN_OR_RETURN(const bool done, poll());
    if (done) return absl::OkStatus();
    if (Clock::now() >= deadline) {
      const std::string report =
          WatchdogReport(RankLabel(), target, options.timeout, CurrentStep(), RankHosts());
      WriteReportLine(report);
      RunWatchdogExpiryHook(report);
      before_abort();
      AbortJob(options.exit_code);
    }
    if (polls >= kSpins) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, kMaxNap);
    }
  }
}

}  // namespace nf::parallel
