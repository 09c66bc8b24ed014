// core/host_memory: the parsers on texts as Linux writes them, and the live figures of this
// machine and process.
#include "core/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace nf {
namespace {

TEST(HostMemoryParseTest, MemAvailableInKilobytes) {
  constexpr char kMeminfo[] =
      "MemTotal:       24597484 kB\nMemFree:         1043276 kB\n"
      "MemAvailable:   20512344 kB\nBuffers:          301772 kB\n";
  EXPECT_EQ(ParseMemAvailable(kMeminfo), int64_t{20512344} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemTotal: 100 kB\nMemFree: 50 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots\n"), std::nullopt);
  // Only the whole field name matches.
  EXPECT_EQ(ParseMemAvailable("MemAvailableX: 5 kB\nMemAvailable: 7 kB\n"), 7 * 1024);
}

TEST(HostMemoryParseTest, CgroupValuesAndPath) {
  EXPECT_EQ(ParseCgroupBytes("8589934592\n"), int64_t{8589934592});
  EXPECT_EQ(ParseCgroupBytes("max\n"), std::nullopt);  // no limit
  EXPECT_EQ(ParseCgroupPath("0::/system.slice/slurmstepd.scope/job_42\n"),
            "/system.slice/slurmstepd.scope/job_42");
  // cgroup v1 lines (a controller list before the path) are not the unified hierarchy.
  EXPECT_EQ(ParseCgroupPath("12:memory:/user.slice\n11:cpu,cpuacct:/user.slice\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupPath("1:name=systemd:/x\n0::/\n"), "/");
}

TEST(HostMemoryLiveTest, AvailableIsPositiveAndBelowTotal) {
  const absl::StatusOr<AvailableMemory> available = AvailableHostMemory();
  NF_ASSERT_OK(available);
  EXPECT_GT(available->bytes, 0);
  EXPECT_LT(available->bytes, int64_t{1} << 50) << available->source;
  EXPECT_FALSE(available->source.empty());
}

// Under `ulimit -v` an allocation past the address-space limit fails whatever is free, so the
// room below the limit is what is available (the memory check used to ignore it).
TEST(HostMemoryLiveTest, AnAddressSpaceLimitBoundsWhatIsAvailable) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  std::ifstream status("/proc/self/status");
  int64_t mapped_kb = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) mapped_kb = std::stoll(line.substr(7));
  }
  ASSERT_GT(mapped_kb, 0);
  // 256 MiB beyond what is mapped now: well below any machine's free memory.
  rlimit limited = before;
  limited.rlim_cur = static_cast<rlim_t>(mapped_kb * 1024 + (int64_t{256} << 20));
  if (before.rlim_max != RLIM_INFINITY)
    limited.rlim_cur = std::min(limited.rlim_cur, before.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limited), 0);
  const absl::StatusOr<AvailableMemory> available = AvailableHostMemory();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);
  NF_ASSERT_OK(available);
  EXPECT_LE(available->bytes, int64_t{256} << 20);
  EXPECT_GT(available->bytes, int64_t{128} << 20);  // the test's own small mappings since
  EXPECT_NE(available->source.find("ulimit -v"), std::string::npos) << available->source;
}

TEST(HostMemoryLiveTest, ResidentAndPeakFollowAnAllocation) {
  const int64_t before = ResidentBytes();
  EXPECT_GT(before, 0);
  {
    // 64 MiB, every page touched: resident now, and in the peak from then on.
    std::vector<char> block(64 << 20, 1);
    EXPECT_GE(ResidentBytes(), before + (60 << 20));
    EXPECT_EQ(block[12345], 1);
  }
  EXPECT_GE(PeakResidentBytes(), before + (60 << 20));
}

}  // namespace
}  // namespace nf
