#include "launcher/fault_injection.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace nf::launcher {

absl::StatusOr<std::vector<int64_t>> InjectedGradSpikeSteps() {
  const char* value = std::getenv("NF_INJECT_GRAD_SPIKE");
  std::vector<int64_t> steps;
  if (value == nullptr || *value == '\0') return steps;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(part, &step) || step <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("NF_INJECT_GRAD_SPIKE='", value,
                       "' must be a comma-separated list of step numbers (>= 1)"));
    }
    steps.push_back(step);
  }
  return steps;
}

}  // namespace nf::launcher
