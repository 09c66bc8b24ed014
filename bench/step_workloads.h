// The model shapes the step benchmarks train (nf-bench-step, and nf-bench-step-peer which
// bench/pytorch_compare.sh drives against PyTorch), and the training config of each.
#pragma once

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "launcher/config.h"

namespace nf::bench {

// A model shape and its batch. Dropout as in deploy/configs: tiny.pbtxt sets dropout 0.1 only,
// normformer-125m.pbtxt dropout and attention_dropout 0.1.
struct Workload {
  const char* name;
  int num_layers, d_model, num_heads, ffn_dim, vocab_size;
  int seq_len, micro_batch, global_batch;
  float dropout, attention_dropout;
  int default_steps;  // timed steps unless --steps says otherwise
};

inline constexpr Workload kWorkloads[] = {
    {.name = "tiny",
     .num_layers = 4,
     .d_model = 128,
     .num_heads = 4,
     .ffn_dim = 512,
     .vocab_size = 512,
     .seq_len = 64,
     .micro_batch = 4,
     .global_batch = 16,
     .dropout = 0.1f,
     .attention_dropout = 0.0f,
     .default_steps = 20},
    {.name = "125m",
     .num_layers = 12,
     .d_model = 768,
     .num_heads = 12,
     .ffn_dim = 3072,
     .vocab_size = 50257,
     .seq_len = 64,
     .micro_batch = 2,
     .global_batch = 2,
     .dropout = 0.1f,
     .attention_dropout = 0.1f,
     .default_steps = 9},
};

// `w` as an fp32 training config: NormFormer (scale_attn, scale_heads before the output
// projection, scale_fc) or the Pre-LN baseline (every switch off).
launcher::TrainConfig MakeConfig(const Workload& w, bool normformer);

// Model FLOPs of one step as llm.c counts them: per token 6 x params + 6 x layers x d_model x
// seq_len, params being the model's global parameter count (padded vocabulary rows included).
double StepGflops(const Workload& w, int64_t params);

// One micro-batch of `config`'s synthetic corpus, fixed for timing forward and backward on their
// own: inputs and targets [micro_batch, seq_len] i32.
struct FixedBatch {
  Tensor inputs, targets;
};
absl::StatusOr<FixedBatch> MakeFixedBatch(const launcher::TrainConfig& config);

}  // namespace nf::bench
