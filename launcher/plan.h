// nf-plan's search (launcher/plan_main.cc): every layout of a model on a cluster that fits in
// GPU memory, ranked by a modelled step time. A layout is tensor x pipeline (x virtual stages) x
// data parallelism, ZeRO-1 or not, sequence parallelism or not, a recompute mode and a
// micro-batch size; its memory is the dry run's estimate (launcher/memory_estimate.h, checked
// against the allocator in docs/memory.md), its step time the sum of
//
//   compute     the micro-batches' GEMMs, attention and memory-bound operations on one GPU
//               (plan_compute.h: shape-dependent GEMM rates, HBM bandwidth), with the
//               recomputed forward (all of a layer's under FULL, the attention core's under
//               SELECTIVE), on the slowest stage: the last, which adds the LM head and loss to
//               its layers (a pipeline runs at its slowest stage's pace)
//   optimizer   the AdamW step over the rank's parameters (its ZeRO-1 shard), at HBM bandwidth
//   bubble      the micro-batches' compute x (pp - 1) / (virtual stages x micro-batches per
//               data-parallel rank)
//   tp          the tensor-parallel collectives on NVLink (tp never leaves a node), each
//               a latency plus its ring traffic over the bandwidth NCCL reaches: the
//               forward's all exposed, the backward's input-gradient reductions (and, with
//               sequence parallelism, input gathers) hidden behind the weight-gradient GEMMs up
//               to those GEMMs' time (model/tensor_parallel.h); all exposed without
//               overlap_communication
//   dp          the gradient reduction (ring all-reduce, or ZeRO-1's reduce-scatter and
//               all-gather) by buckets, on NVLink inside a node and InfiniBand across; they
//               overlap the last micro-batch's backward, the ZeRO-1 all-gathers nothing. The
//               step counts what is exposed; dp_hidden is the part behind that backward, so a
//               dp of 0 says the reduction hid, not that it is free; without
//               overlap_communication it all comes after the backward
//   pp          the stage-boundary sends of activations and gradients, all exposed
//
// A model with stated assumptions (the efficiencies, the bandwidths), not a measurement: it
// ranks layouts, and bench/plan_anchors.sh holds it to published runs (docs/parallelism.md).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launcher/memory_estimate.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

// A GPU's figures: dense fp16/bf16 peak, memory, HBM bandwidth, SMs, and the shares of the peak
// its libraries reach; the defaults are an H200's (GpuPreset).
struct ClusterSpec {
  int gpus_per_node = 8;
  int nodes = 1;
  double gpu_memory_bytes = 141e9;
  double memory_headroom = 0.9;  // the share of it a layout may plan to use
  double peak_flops = 989e12;    // dense bf16/fp16 (datasheet)
  // What cuBLAS reaches on large bf16 GEMMs, of the peak: about 0.8 on H100/H200 and 0.86 on
  // A100, as published measurements of the best achievable matmul rate show; small or oddly
  // shaped products lose more through their last wave of tiles (plan_compute.h).
  double gemm_efficiency = 0.8;
  // Blockwise attention kernels (FlashAttention-2, cuDNN SDPA), forward and backward together.
  double attention_efficiency = 0.5;
  // The S x S scores in memory (Megatron-LM of 2021) instead of blockwise kernels.
  bool materialized_attention = false;
  double hbm_bytes_per_second = 4.8e12;    // 0: memory-bound work not modelled (--cpu)
  double memory_efficiency = 0.8;          // of it, what streaming kernels reach
  int sm_count = 132;                      // 0: no wave quantisation
  double nvlink_bytes_per_second = 450e9;  // per GPU and direction (NVLink 4: 900 GB/s both)
  // The share of the NVLink line rate NCCL's ring collectives and sends reach: about 0.8, the
  // protocol's overhead (NCCL's maintainers: 370 of H100's 450 GB/s; nccl-tests on 8 A100 SXM
  // report 200-210 GB/s bus bandwidth of 300). Not applied to InfiniBand, where nccl-tests reach
  // 85-96% of HDR's line rate.
  double nvlink_efficiency = 0.8;
  double network_bytes_per_second = 50e9;  // per GPU (one 400 Gb/s InfiniBand NDR port each)
  // What every collective and send costs beside its bytes (NCCL's small-message time).
  double collective_latency_seconds = 20e-6;
  // Communication behind computation, as this project's runtime does it: the backward's
  // tensor-parallel input-gradient reductions behind the weight-gradient GEMMs, the data-parallel
  // gradient reduction behind the last micro-batch's backward. false: every collective in line,
  // as Megatron-LM of 2021 ran them (its tensor-parallel all-reduces blocked the stream, and its
  // local DDP reduced the gradients after the whole backward): for its published runs.
  bool overlap_communication = true;

  int world_size() const { return gpus_per_node * nodes; }
};

// The figures of a GPU by name: "h200", "h100" (SXM, 80 GB) or "a100" (SXM, 80 GB: 312 TFLOP/s,
// 2.04 TB/s, 108 SMs, NVLink 3 at 300 GB/s a direction, 25 GB/s HDR InfiniBand a GPU); the
// node and cluster sizes are kept. InvalidArgument for another name.
absl::Status ApplyGpuPreset(const std::string& name, ClusterSpec& cluster);

// Seconds of one training step, by part (the comment above).
struct StepTime {
  double compute = 0, optimizer = 0, bubble = 0, tp = 0, dp = 0, pp = 0;
  double dp_hidden = 0;  // data-parallel communication behind the backward: not in total()
  double total() const { return compute + optimizer + bubble + tp + dp + pp; }
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
