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

absl::StatusOr<InjectedDesync> InjectedDesyncOf() {
  const char* value = std::getenv("NF_INJECT_DESYNC");
  if (value == nullptr || *value == '\0') return InjectedDesync{};
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  InjectedDesync desync;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &desync.world_rank) ||
      !absl::SimpleAtoi(parts[1], &desync.step) || desync.world_rank < 0 || desync.step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NF_INJECT_DESYNC='", value, "' must be RANK:STEP (world rank >= 0, step >= 1)"));
  }
  return desync;
}

absl::StatusOr<InjectedSlowRank> InjectedSlowRankOf() {
  const char* value = std::getenv("NF_INJECT_SLOW_RANK");
  if (value == nullptr || *value == '\0') return InjectedSlowRank{};
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  InjectedSlowRank slow;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &slow.world_rank) ||
      !absl::SimpleAtoi(parts[1], &slow.milliseconds) || slow.world_rank < 0 ||
      slow.milliseconds <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NF_INJECT_SLOW_RANK='", value, "' must be RANK:MILLISECONDS (rank >= 0, delay >= 1)"));
  }
  return slow;
}

absl::StatusOr<InjectedNan> InjectedNanOf() {
  const char* value = std::getenv("NF_INJECT_NAN");
  if (value == nullptr || *value == '\0') return InjectedNan{};
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  InjectedNan nan;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &nan.step) ||
      !absl::SimpleAtoi(parts[1], &nan.layer) || !absl::SimpleAtoi(parts[2], &nan.tp_rank) ||
      nan.step <= 0 || nan.layer < 0 || nan.tp_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NF_INJECT_NAN='", value,
                     "' must be STEP:LAYER:TP_RANK (step >= 1, layer >= 0, tp rank >= 0)"));
  }
  return nan;
}

}  // namespace nf::launcher
