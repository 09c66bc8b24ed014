#include "launcher/straggler_report.h"

#include <algorithm>
#include <limits>

namespace nf::launcher {

double RankTimes::compute() const { return std::max(0.0, step - comm_wait - data_wait); }

StragglerReport FindStragglers(const std::vector<RankTimes>& ranks, const std::vector<int>& stage,
                               double threshold) {
  StragglerReport best;
  const int num_stages = ranks.empty() ? 0 : *std::max_element(stage.begin(), stage.end()) + 1;
  for (int s = 0; s < num_stages; ++s) {
    StragglerReport report;
    for (int rank = 0; rank < static_cast<int>(ranks.size()); ++rank) {
      if (stage[rank] != s) continue;
      const double compute = ranks[rank].compute();
      if (report.slowest < 0 || compute > ranks[report.slowest].compute()) report.slowest = rank;
      if (report.fastest < 0 || compute < ranks[report.fastest].compute()) report.fastest = rank;
    }
    if (report.slowest < 0) continue;
    const double slowest = ranks[report.slowest].compute();
    const double fastest = ranks[report.fastest].compute();
    if (fastest > 0) {
      report.ratio = slowest / fastest;
    } else {
      report.ratio = slowest > 0 ? std::numeric_limits<double>::infinity() : 1.0;
    }
    if (best.slowest < 0 || report.ratio > best.ratio) best = report;
  }
  best.flagged = best.ratio > threshold;
  return best;
}

}  // namespace nf::launcher
