// nf-plan's command line (launcher/plan_main.cc) and the ranges its cluster figures must lie in.
//
// Every numeric option is range-checked here, before anything is computed, and refused with one
// line naming the flag and the accepted range: a figure outside it would either make the model
// meaningless (an efficiency above 1, an infinite peak) or make the search itself unbounded (a
// world of 10^8 GPUs). The same ranges guard PlanLayouts and ModelStepTime (ValidateCluster), so
// a program that fills a ClusterSpec itself meets them too.
//
// The bound on nf-plan's time: the search (PlanLayouts) visits tensor-parallel sizes dividing
// both --gpus-per-node (at most kMaxGpusPerNode) and the heads, pipeline sizes dividing the
// layers (at most 4096, model_config_check.cc), and for each pair at most 3 x 2 x 2 x 3 x 5 =
// 360 settings of the rest. A layout reaches the memory estimate only when its data-parallel
// size dp x micro-batch divides the global batch (so dp <= kMaxGlobalBatch) and its stages run
// at most kMaxStepPasses micro-batch passes a step; the estimate's cost is linear in those two
// and in the layers, so none costs more than O(2^20 + 2^16 + layers), whatever --nodes is. The
// node limit keeps the world within an int (1024 x 2^20 = 2^30 ranks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launcher/plan.h"

namespace nf::launcher {

inline constexpr int kMaxGpusPerNode = 1024;  // NVLink domains today: 8 (DGX), 72 (NVL72)
inline constexpr int kMaxNodes = 1 << 20;     // some 100 x the largest clusters announced
inline constexpr int kMaxTop = 100000;
// The search's limits on the configuration (PlanLayouts). The global batch: the largest published
// LM batches are a few thousand sequences (GPT-3: 1536; Megatron-LM's 1T: 3072), and a layout's
// memory estimate builds its data-parallel group, so the batch bounds that group's size. The
// micro-batch passes of one step over a layout's stages (pp x virtual stages x micro-batches per
// rank): the memory estimate walks each stage's schedule; 2^16 allows pp 64 with 1024
// micro-batches a rank, beyond any published layout, and a layout over it is skipped (a
// larger micro-batch of the same split stays in).
inline constexpr int kMaxGlobalBatch = 1 << 20;
inline constexpr int64_t kMaxStepPasses = int64_t{1} << 16;

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set, in order
  ClusterSpec cluster;                 // the --gpu preset with the figures given applied
  int top = 5;
  bool cpu = false;    // --cpu: the peak is measured when the plan runs (plan_main.cc)
  bool score = false;  // --score
  bool help = false;   // --help: nothing else is checked
};

// Parses argv[1..argc). InvalidArgument with one line ("--gemm-efficiency: '5' is out of range:
// a number in (0, 1]") for a missing value, an unknown flag, a value that does not parse, is not
// finite or lies outside its range, an unknown --gpu or --attention, or no --config.
absl::StatusOr<PlanOptions> ParsePlanOptions(int argc, const char* const* argv);

// InvalidArgument naming the flag that sets the first field of `cluster` outside its range.
absl::Status ValidateCluster(const ClusterSpec& cluster);

// The --help text, with the ranges.
const std::string& PlanUsage();

}  // namespace nf::launcher
