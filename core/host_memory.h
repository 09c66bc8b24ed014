// How much host memory this process may still allocate, and how much it holds: what
// nf-launch's memory check compares its estimate with, and what the step metrics report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf {

struct AvailableMemory {
  int64_t bytes = 0;
  std::string source;  // where the figure comes from, for messages: "MemAvailable in ..."
};

// The smallest of the kernel's MemAvailable (/proc/meminfo: free memory plus the page cache it
// can reclaim); inside a cgroup v2 with a memory limit (a container, a Slurm job with cgroup
// enforcement), the room left below the tightest limit on the way up to the root; and under
// `ulimit -v` (RLIMIT_AS), the address space left below it.
absl::StatusOr<AvailableMemory> AvailableHostMemory();

// This process's resident set now and at its peak (VmRSS and VmHWM of /proc/self/status);
// 0 where they cannot be read.
int64_t ResidentBytes();
int64_t PeakResidentBytes();

// The parsers behind them, for tests: the MemAvailable line of a /proc/meminfo text, a
// cgroup v2 memory.max or memory.current (nullopt for "max": no limit) and the cgroup path
// of a /proc/self/cgroup text (the "0::/path" line of the unified hierarchy).
std::optional<int64_t> ParseMemAvailable(absl::string_view meminfo);
std::optional<int64_t> ParseCgroupBytes(absl::string_view memory_max);
std::optional<std::string> ParseCgroupPath(absl::string_view proc_self_cgroup);

}  // namespace nf
