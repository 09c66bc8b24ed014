#include "checkpoint/checkpoint_names.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace nf::checkpoint {
namespace fs = std::filesystem;

std::string IterationDirName(int64_t step) { return absl::StrFormat("iter_%07d", step); }

bool ParseIterationDirName(const std::string& name, int64_t& step) {
  constexpr size_t kPrefix = 5;  // "iter_"
  return name.size() >= kPrefix + 7 && name.rfind("iter_", 0) == 0 &&
         name.find_first_not_of("0123456789", kPrefix) == std::string::npos &&
         absl::SimpleAtoi(name.substr(kPrefix), &step) && IterationDirName(step) == name;
}

std::vector<int64_t> IterationDirSteps(const fs::path& checkpoints_dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  // increment(error) rather than a range-for, whose ++ throws on a failing readdir.
  for (fs::directory_iterator it(checkpoints_dir, error), end; !error && it != end;
       it.increment(error)) {
    int64_t step = 0;
    std::error_code ignored;  // an entry that cannot be stat'ed is not a checkpoint to count
    if (it->is_directory(ignored) && ParseIterationDirName(it->path().filename().string(), step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace nf::checkpoint
