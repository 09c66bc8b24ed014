// nf-plan's search (launcher/plan_main.cc): every layout of a model on a cluster that fits in
// GPU memory, ranked by a modelled step time. A layout is tensor x pipeline (x virtual stages) x
// data parallelism, ZeRO-1 or not, sequence parallelism or not, a recompute mode and a
// micro-batch size; its memory is the dry run's estimate (launcher/memory_estimate.h, checked
// against the allocator in docs/memory.md), its step time the sum of
//
//   compute     model FLOPs per GPU (ModelFlopsPerToken, + the recomputed forward: a third more
//               under FULL, attention's forward under SELECTIVE) at gemm_efficiency x peak
//   bubble      compute x (pp - 1) / (virtual stages x micro-batches per data-parallel rank)
//   tp          the tensor-parallel collectives on NVLink (tp never leaves a node), each
//               a latency plus its ring traffic over the bandwidth: the
//               forward's all exposed, the backward's input-gradient reductions (and, with
//               sequence parallelism, input gathers) hidden behind the weight-gradient GEMMs up
//               to those GEMMs' time (model/tensor_parallel.h)
//   dp          the gradient reduction (ring all-reduce, or ZeRO-1's reduce-scatter and
//               all-gather) by buckets, on NVLink inside a node and InfiniBand across; they
//               overlap the last micro-batch's backward, the ZeRO-1 all-gathers nothing. The
//               step counts what is exposed; dp_hidden is the part behind that backward, so a
//               dp of 0 says the reduction hid, not that it is free
//   pp          the stage-boundary sends of activations and gradients, all exposed
//
// A model with stated assumptions (the efficiency, the link figures), not a measurement: it
// ranks layouts; docs/parallelism.md shows its answers for the 2.7B.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/memory_estimate.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

struct ClusterSpec {
  int gpus_per_node = 8;
  int nodes = 1;
  double gpu_memory_bytes = 141e9;         // H200 (H100: 80e9)
  double memory_headroom = 0.9;            // the share of it a layout may plan to use
  double peak_flops = 989e12;              // H100/H200 SXM dense bf16/fp16 (datasheet)
  double gemm_efficiency = 0.6;            // of peak, what the matrix products reach
  double nvlink_bytes_per_second = 450e9;  // per GPU and direction (NVLink 4: 900 GB/s both)
  double network_bytes_per_second = 50e9;  // per GPU (one 400 Gb/s InfiniBand NDR port each)
  // What every collective and send costs beside its bytes (NCCL's small-message time).
  double collective_latency_seconds = 20e-6;

  int world_size() const { return gpus_per_node * nodes; }
};

// Seconds of one training step, by part (the comment above).
struct StepTime {
  double compute = 0, bubble = 0, tp = 0, dp = 0, pp = 0;
  double dp_hidden = 0;  // data-parallel communication behind the backward: not in total()
  double total() const { return compute + bubble + tp + dp + pp; }
};

struct PlannedLayout {
  TrainConfig config;  // the base config with the layout set
  std::vector<std::string>
      overrides;                 // the --set flags that make it, e.g. "parallel.tensor_parallel=8"
  double peak_device_bytes = 0;  // the fullest pipeline rank's
  StepTime time;
  double mfu = 0;  // model FLOPs per second / (world x peak): what the model predicts
};

// The step time of `config` (a valid layout) on `cluster`.
absl::StatusOr<StepTime> ModelStepTime(const TrainConfig& config, const ClusterSpec& cluster);

// Every layout of `base` (its model, batch and precision) on `cluster` that fits, fastest
// first. NotFound naming the smallest estimate when none fits.
absl::StatusOr<std::vector<PlannedLayout>> PlanLayouts(const TrainConfig& base,
                                                       const ClusterSpec& cluster);

}  // namespace nf::launcher
