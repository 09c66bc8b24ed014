// The collective watchdog: every blocking communication waits under a deadline. A rank whose
// peers never arrive (a crashed or hung rank, a mismatched schedule) would otherwise block
// forever while holding the whole job's resources; instead it prints one line naming itself,
// the operation, the group, the step and the ranks it waited for, and aborts the job
// (MPI_Abort), which ends every rank.
//
//   rank 3 (tp=1, dp=1, pp=0): all_reduce on group dp (ranks [1, 3]) did not complete within
//   300s at step 1200; waiting for peers [1]; aborting the job
//
// (one line in reality). Point-to-point operations know their peer; a collective cannot tell
// which ranks are missing, so it names every other rank of the group. In a job across nodes
// each peer comes with its host ("waiting for peers [1 on node7]"): a lost node shows as the
// ranks of one host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace nf::parallel {

// The exit code of a job the watchdog aborted (128 + SIGABRT, what a crashed rank would give).
inline constexpr int kWatchdogExitCode = 134;

struct WatchdogOptions {
  // How long one blocking operation may take before the job is aborted. Generous by default:
  // the first collectives of a run also wait for every rank to start and load its data.
  absl::Duration timeout = absl::Seconds(300);
  int exit_code = kWatchdogExitCode;
};

// The training step, set by the training loop at the start of each step so that reports say
// where the job stopped; -1 (reported as "before the first step") until set. Any thread.
void SetCurrentStep(int64_t step);
int64_t CurrentStep();

// Who this process is in reports, e.g. "rank 5 (tp=1, dp=0, pp=1)"; set once the topology is
// known (CreateProcessGroups does). Until then "rank <world rank>" ("rank 0" without MPI).
void SetRankLabel(std::string label);
std::string RankLabel();

// The host of every world rank (parallel/placement.h gathers them), for the reports; empty
// (the default) names no hosts.
void SetRankHosts(std::vector<std::string> hosts);
std::vector<std::string> RankHosts();

// What a blocked operation waits for. Ranks are world ranks.
struct WaitTarget {
  absl::string_view operation;  // CommOpName(op), or e.g. "split" for group creation
  absl::string_view group;
  absl::Span<const int> group_ranks;  // the group's members, in group-rank order
  absl::Span<const int> peers;        // the ranks whose part is missing (or may be)
};

// The report line (no newline): "<rank label>: <op> on group <group> (ranks [...]) did not
// complete within <timeout> at step <step>; waiting for peers [...]; aborting the job". With
// `hosts` (by world rank) naming more than one host, each peer is "<rank> on <host>".
std::string WatchdogReport(absl::string_view rank_label, const WaitTarget& target,
                           absl::Duration timeout, int64_t step,
                           absl::Span<const std::string> hosts = {});

// Writes `report` and a newline to stderr in one write, so the line stays whole among the other
// ranks' output.
void WriteReportLine(const std::string& report);

// Called with the report line when a watchdog gives up on an operation, before the job ends:
// the flight recorder's dumps (flight_dumps.h). None until set; set once at start-up.
void SetWatchdogExpiryHook(void (*hook)(const std::string& report));
void RunWatchdogExpiryHook(const std::string& report);

// Calls `poll` until it returns true (the operation completed) or an error (returned as is),
// sleeping between calls with a backoff from microseconds up to a millisecond, so a waiting
// rank yields its core to the peers it waits for (ranks oversubscribe cores in tests). When
// options.timeout passes first, writes the report to stderr and calls AbortJob.
absl::Status WaitUnderWatchdog(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                               const WaitTarget& target, const WatchdogOptions& options);
// The same, calling `before_abort` between the report and AbortJob: the NCCL communicator
// aborts its NCCL communicator there (ncclCommAbort), which stops the kernels still waiting for
// absent peers and NCCL's proxy threads before the job goes down (docs/design.md section 5).
absl::Status WaitUnderWatchdog(absl::FunctionRef<absl::StatusOr<bool>()> poll,
                               const WaitTarget& target, const WatchdogOptions& options,
                               absl::FunctionRef<void()> before_abort);

}  // namespace nf::parallel
