#include "core/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace nf {
namespace {

constexpr char kCgroupRoot[] = "/sys/fs/cgroup";

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value in kB of the "Name:   123 kB" line of a /proc status-like text, in bytes.
std::optional<int64_t> KilobyteField(absl::string_view text, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return std::nullopt;
    int64_t kilobytes = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kilobytes)) return std::nullopt;
    return kilobytes * 1024;
  }
  return std::nullopt;
}

int64_t StatusField(absl::string_view name) {
  const std::optional<std::string> status = ReadSmallFile("/proc/self/status");
  if (!status) return 0;
  return KilobyteField(*status, name).value_or(0);
}

int64_t CgroupValue(const std::filesystem::path& file) {
  const std::optional<std::string> text = ReadSmallFile(file);
  if (!text) return -1;
  return ParseCgroupBytes(*text).value_or(-1);
}

std::string Gib(int64_t bytes) {
  return absl::StrCat(static_cast<double>(bytes * 100 / (int64_t{1} << 30)) / 100, " GiB");
}

}  // namespace

std::optional<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  return KilobyteField(meminfo, "MemAvailable");
}

std::optional<int64_t> ParseCgroupBytes(absl::string_view memory_max) {
  int64_t limit = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(memory_max), &limit)) return std::nullopt;
  return limit;
}

std::optional<std::string> ParseCgroupPath(absl::string_view proc_self_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) return std::string(line);
  }
  return std::nullopt;
}

absl::StatusOr<AvailableMemory> AvailableHostMemory() {
  const std::optional<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  if (!meminfo) {
    return absl::UnavailableError(
        absl::StrCat("cannot read /proc/meminfo: ", std::strerror(errno)));
  }
  const std::optional<int64_t> mem_available = ParseMemAvailable(*meminfo);
  if (!mem_available) {
    return absl::UnavailableError("/proc/meminfo has no MemAvailable line (Linux 3.14 or later)");
  }
  AvailableMemory available{.bytes = *mem_available, .source = "MemAvailable in /proc/meminfo"};
  // A limit may sit on any ancestor of the process's cgroup (a Slurm job's, a container's).
  const std::optional<std::string> cgroup_file = ReadSmallFile("/proc/self/cgroup");
  const std::optional<std::string> cgroup =
      cgroup_file ? ParseCgroupPath(*cgroup_file) : std::nullopt;
  // cgroup v1 or none: no cgroup limit to read.
  for (std::filesystem::path dir = cgroup ? std::filesystem::path(kCgroupRoot) /
                                                std::filesystem::path(*cgroup).relative_path()
                                          : std::filesystem::path(kCgroupRoot);
       dir.string().size() > std::strlen(kCgroupRoot); dir = dir.parent_path()) {
    // -1: no limit here ("max"), or no memory controller on this level.
    const int64_t limit = CgroupValue(dir / "memory.max");
    const int64_t usage = CgroupValue(dir / "memory.current");
    if (limit < 0 || usage < 0) continue;
    if (limit - usage < available.bytes) {
      available.bytes = std::max<int64_t>(limit - usage, 0);
      available.source = absl::StrCat("the limit of cgroup ", dir.string(), " (memory.max ",
                                      Gib(limit), ", of which ", Gib(usage), " in use)");
    }
  }
  // `ulimit -v` (RLIMIT_AS) caps the address space, mapped or not: what may still be mapped is
  // the limit less this process's virtual size (an allocation beyond it fails however much
  // memory is free).
  rlimit address_space{};
  if (getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
    const int64_t limit = static_cast<int64_t>(address_space.rlim_cur);
    const int64_t mapped = StatusField("VmSize");
    if (limit - mapped < available.bytes) {
      available.bytes = std::max<int64_t>(limit - mapped, 0);
      available.source = absl::StrCat("ulimit -v (the address-space limit, ", Gib(limit),
                                      ", of which ", Gib(mapped), " mapped)");
    }
  }
  return available;
}

int64_t ResidentBytes() { return StatusField("VmRSS"); }
int64_t PeakResidentBytes() { return StatusField("VmHWM"); }

}  // namespace nf
