// What the training loop records into this rank's Prometheus metrics after each step
// (monitoring/rank_metrics.h): the step's figures, its per-block gradient norms when it measured
// them (log steps), communication totals by group, data-loader and pipeline waits, and memory
// in use. One function, so the loop and the metrics-cost benchmark (bench/metrics_bench.cc)
// record exactly the same.
#pragma once

#include "launcher/trainer.h"
#include "monitoring/rank_metrics.h"

namespace nf::launcher {

// `mfu` is the step's model FLOPs utilisation, 0..1 (the loop's GEMM ceiling, gemm_ceiling.h).
void RecordStepMetrics(const StepStats& stats, const Trainer& trainer, double mfu,
                       monitoring::RankMetrics& metrics);

}  // namespace nf::launcher
