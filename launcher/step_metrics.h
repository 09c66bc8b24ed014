// What the training loop records into this rank's Prometheus metrics
// (monitoring/rank_metrics.h): the run's configuration once at start, and after each step the
// step's figures, its per-block gradient norms when it measured them (log steps),
// communication totals by group, data-loader and pipeline waits, and memory in use. Here, so
// the loop and the metrics-cost benchmark (bench/metrics_bench.cc) record exactly the same.
#pragma once

#include "launcher/trainer.h"
#include "monitoring/rank_metrics.h"

namespace nf::launcher {

// normformer_run_info's labels: layers, d_model, heads, ffn_dim, vocab_size, parameters, the
// NormFormer operations on ("none" for Pre-LN), tp, pp, dp, schedule, virtual_stages, zero1,
// seq_len, micro_batch, global_batch, precision, device.
void RecordRunInfo(const TrainConfig& config, const Trainer& trainer,
                   monitoring::RankMetrics& metrics);

// `mfu` is the step's model FLOPs utilisation, 0..1 (the loop's GEMM ceiling, gemm_ceiling.h).
void RecordStepMetrics(const StepStats& stats, const Trainer& trainer, double mfu,
                       monitoring::RankMetrics& metrics);

}  // namespace nf::launcher
