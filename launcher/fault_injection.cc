#include "launcher/fault_injection.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"

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

namespace {

// `variable`'s colon-separated integers, each at least its entry of `minimums` and at most
// INT32_MAX (ranks and layers are ints; a larger value must not wrap into a small one): none when
// unset, InvalidArgument quoting the value and `form` when malformed.
absl::StatusOr<std::optional<std::vector<int64_t>>> ColonSeparated(
    const char* variable, const std::vector<int64_t>& minimums, absl::string_view form) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  std::vector<int64_t> fields(parts.size());
  bool valid = parts.size() == minimums.size();
  for (size_t i = 0; valid && i < parts.size(); ++i) {
    valid = absl::SimpleAtoi(parts[i], &fields[i]) && fields[i] >= minimums[i] &&
            fields[i] <= std::numeric_limits<int32_t>::max();
  }
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(variable, "='", value, "' must be ", form));
  }
  return fields;
}

}  // namespace

absl::StatusOr<InjectedDesync> InjectedDesyncOf() {
  NF_ASSIGN_OR_RETURN(const auto fields, ColonSeparated("NF_INJECT_DESYNC", {0, 1},
                                                        "RANK:STEP (world rank >= 0, step >= 1)"));
  if (!fields) return InjectedDesync{};
  return InjectedDesync{.world_rank = static_cast<int>((*fields)[0]), .step = (*fields)[1]};
}

absl::StatusOr<InjectedSlowRank> InjectedSlowRankOf() {
  NF_ASSIGN_OR_RETURN(
      const auto fields,
      ColonSeparated("NF_INJECT_SLOW_RANK", {0, 1}, "RANK:MILLISECONDS (rank >= 0, delay >= 1)"));
  if (!fields) return InjectedSlowRank{};
  return InjectedSlowRank{.world_rank = static_cast<int>((*fields)[0]),
                          .milliseconds = (*fields)[1]};
}

absl::StatusOr<InjectedNan> InjectedNanOf() {
  NF_ASSIGN_OR_RETURN(const auto fields,
                      ColonSeparated("NF_INJECT_NAN", {1, 0, 0},
                                     "STEP:LAYER:TP_RANK (step >= 1, layer >= 0, tp rank >= 0)"));
  if (!fields) return InjectedNan{};
  return InjectedNan{.step = (*fields)[0],
                     .layer = static_cast<int>((*fields)[1]),
                     .tp_rank = static_cast<int>((*fields)[2])};
}

absl::StatusOr<int> InjectedAbsentRankOf() {
  NF_ASSIGN_OR_RETURN(const auto fields,
                      ColonSeparated("NF_INJECT_ABSENT_RANK", {0}, "RANK (world rank >= 0)"));
  if (!fields) return -1;
  return static_cast<int>((*fields)[0]);
}

absl::Status CheckFaultInjection(const TrainConfig& config, int world_size) {
  NF_RETURN_IF_ERROR(InjectedGradSpikeSteps().status());
  NF_ASSIGN_OR_RETURN(const InjectedDesync desync, InjectedDesyncOf());
  NF_ASSIGN_OR_RETURN(const InjectedSlowRank slow, InjectedSlowRankOf());
  NF_ASSIGN_OR_RETURN(const InjectedNan nan, InjectedNanOf());
  NF_ASSIGN_OR_RETURN(const int absent, InjectedAbsentRankOf());
  const auto beyond = [](absl::string_view variable, absl::string_view what, int64_t value,
                         int64_t count, absl::string_view source) {
    return absl::InvalidArgumentError(absl::StrCat(variable, " names ", what, " ", value, " but ",
                                                   source, " is ", count, " (", what, "s 0 to ",
                                                   count - 1, "): it would inject nothing"));
  };
  if (desync.world_rank >= world_size) {
    return beyond("NF_INJECT_DESYNC", "world rank", desync.world_rank, world_size,
                  "the job's world size");
  }
  if (slow.world_rank >= world_size) {
    return beyond("NF_INJECT_SLOW_RANK", "world rank", slow.world_rank, world_size,
                  "the job's world size");
  }
  if (absent >= world_size) {
    return beyond("NF_INJECT_ABSENT_RANK", "world rank", absent, world_size,
                  "the job's world size");
  }
  if (nan.step > 0 && nan.layer >= config.model().num_layers()) {
    return beyond("NF_INJECT_NAN", "layer", nan.layer, config.model().num_layers(),
                  "model.num_layers");
  }
  const int tp = std::max(1, config.parallel().tensor_parallel());
  if (nan.step > 0 && nan.tp_rank >= tp) {
    return beyond("NF_INJECT_NAN", "tensor-parallel rank", nan.tp_rank, tp,
                  "parallel.tensor_parallel");
  }
  return absl::OkStatus();
}

}  // namespace nf::launcher
