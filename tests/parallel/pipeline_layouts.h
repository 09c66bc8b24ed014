// The pipeline layouts the NCCL-rules tests sweep (tests/parallel/transfer_plan_test.cc in the
// unit-time model, tests/launcher/pipeline_nccl_rules_test.cc with real chunks): GPipe and 1F1B
// with v 1 and every m in p..4p; interleaved 1F1B with v 2..4 and m p, 2p, 3p, 4p; every p from 2
// to a maximum that NF_TEST_MAX_PIPELINE_STAGES lowers (the sanitizer pass sets it).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "parallel/pipeline_schedule.h"

namespace nf::testing {

struct PipelineLayout {
  parallel::ScheduleKind kind;
  int p, v, m;
  std::string Name() const {
    return absl::StrCat(parallel::ScheduleKindName(kind), " p=", p, " v=", v, " m=", m);
  }
};

// `fallback`, or NF_TEST_MAX_PIPELINE_STAGES when set.
inline int MaxPipelineStages(int fallback) {
  const char* value = std::getenv("NF_TEST_MAX_PIPELINE_STAGES");
  return value != nullptr ? std::atoi(value) : fallback;
}

inline std::vector<PipelineLayout> PipelineLayouts(int max_p) {
  using parallel::ScheduleKind;
  std::vector<PipelineLayout> layouts;
  for (int p = 2; p <= max_p; ++p) {
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      for (int m = p; m <= 4 * p; ++m) layouts.push_back({kind, p, 1, m});
    }
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        layouts.push_back({ScheduleKind::kInterleavedOneFOneB, p, v, m});
      }
    }
  }
  return layouts;
}

}  // namespace nf::testing
