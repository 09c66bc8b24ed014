// What one GPU's share of a micro-batch costs, for nf-plan's step-time model (plan.h): each
// matrix product at a rate that depends on its shape, the attention core, and the memory-bound
// operations at HBM bandwidth. Calibrated against published runs in docs/parallelism.md
// (bench/plan_anchors.sh).
//
//   GEMM m x n x k (batch b)   max(2 b m n k / (peak x gemm_efficiency x waves),
//                                  bytes of A, B and C / streaming bandwidth)
//                              waves: the share of the SMs the last wave of 128 x 256 output
//                              tiles keeps busy (a product of 1.1 waves runs at 1.1 / 2)
//   attention, blockwise       the core's FLOPs (causal: half the S x S products; the backward
//                              2.5 x the forward) at peak x attention_efficiency, the S x S
//                              scores never in memory (this project's kernels, cuDNN's SDPA)
//   attention, materialized    QK^T and PV as batched GEMMs over the full S x S, and the scores'
//                              scale-mask-softmax and dropout as passes over S x S in memory
//                              (Megatron-LM as of 2021; for the published runs of that time)
//   memory-bound operations    LayerNorms, activations, dropouts and residual adds, the heads'
//                              split and merge: the bytes each reads and writes, the backward
//                              twice the forward's, at hbm x memory_efficiency
//   the LM head and loss       its GEMMs, and four fp32 passes over the [T, V / tp] logits
//   the optimizer step         per local parameter its fp32 gradient, master weight and moments
//                              read and written and the parameter written, once a step
#pragma once

#include <cstdint>

#include "launcher/train_config.pb.h"

namespace nf::launcher {

struct ClusterSpec;

// Seconds one GPU spends on one micro-batch of `config` (its tensor-parallel shard of it).
struct MicroBatchWork {
  double layer_forward = 0;       // one decoder layer's forward
  double layer_backward = 0;      // its backward
  double layer_weight_grads = 0;  // the weight-gradient GEMMs within layer_backward
  double attention_forward = 0;   // the attention core's forward (selective recompute's repeat)
  double head_forward = 0;        // the LM head and loss (the last stage's)
  double head_backward = 0;
};
MicroBatchWork EstimateMicroBatchWork(const TrainConfig& config, const ClusterSpec& cluster);

// Seconds of `batch` products of [m, k] x [k, n] with `element_bytes`-byte operands.
double GemmSeconds(double m, double n, double k, double batch, double element_bytes,
                   const ClusterSpec& cluster);

// Seconds of one optimizer step over `local_parameters` (this rank's share) of a model stored in
// `element_bytes`-byte parameters.
double OptimizerSeconds(double local_parameters, double element_bytes, const ClusterSpec& cluster);

}  // namespace nf::launcher
