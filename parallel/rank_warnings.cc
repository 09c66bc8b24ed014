#include "parallel/rank_warnings.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "parallel/watchdog.h"

namespace nf::parallel {

std::string RankWarning(absl::string_view message) {
  return absl::StrCat("normformer: warning: ", RankLabel(), ": ", message, "\n");
}

void WarnFromRank(absl::string_view message) {
  const std::string line = RankWarning(message);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace nf::parallel
