// Stragglers: one slow rank makes every step of a synchronous job slow, and the others show it
// as communication wait. Each rank splits its step time into compute, communication wait and
// data wait; every log interval the ranks gather their sums and rank 0 names the rank with the
// most compute time (the slowest) and the one with the least (the fastest) among ranks that do
// the same work: those of one pipeline stage (a stage's share of the layers, the embedding and
// the head differ, and so does its compute). Their ratio is about 1 on a healthy job and above
// train.straggler_ratio when one rank is slow; the stage with the largest ratio is reported: a
// "stragglers" event in log.jsonl, a console line, per-rank metrics and the NormformerStraggler
// alert (deploy/prometheus/alerts.yml).
#pragma once

#include <cstdint>
#include <vector>

namespace nf::launcher {

// One rank's seconds over a log interval.
struct RankTimes {
  double step = 0.0;       // wall time of its steps
  double comm_wait = 0.0;  // waiting for communication to complete (every group)
  double data_wait = 0.0;  // waiting for the data loader
  // The rest: its own work.
  double compute() const;
};

struct StragglerReport {
  int slowest = -1, fastest = -1;  // world ranks, by compute seconds
  double ratio = 1.0;    // slowest's compute / fastest's (1 when both are 0, inf when only it is)
  bool flagged = false;  // ratio > the threshold
};

// The report on every rank's times and pipeline stage (both indexed by world rank; at least
// one rank). A job whose stages have one rank each compares nothing: ratio 1.
StragglerReport FindStragglers(const std::vector<RankTimes>& ranks, const std::vector<int>& stage,
                               double threshold);

}  // namespace nf::launcher
