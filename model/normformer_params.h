// The NormFormer parameter set: the ParamSpec rows of a model config (fairseq names, shapes,
// tensor-parallel sharding, decay, fairseq initialisation) and typed views of them per layer,
// for the whole model or for one pipeline stage of it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/linear.h"
#include "model/model_config.pb.h"
#include "model/param_table.h"

namespace nf::model {

// One decoder layer. Optional parameters (NormFormer switches, untied head) are undefined
// Params when their switch is off.
struct LayerParams {
  Param attn_norm_weight, attn_norm_bias;  // self_attn_layer_norm: the pre-attention LN
  // q_proj, k_proj and v_proj as one column-parallel projection: [3 d_local, d] weights (q's
  // rows, then k's, then v's; adjacent in the flat buffers) and [3 d_local] biases.
  Param qkv_weight, qkv_bias;
  Param out_weight, out_bias;                        // [d, d_local], row-parallel; bias replicated
  Param head_scale;                                  // c_attn [heads_local] (scale_heads)
  Param post_attn_norm_weight, post_attn_norm_bias;  // attn_ln (scale_attn)
  Param ffn_norm_weight, ffn_norm_bias;              // final_layer_norm: the pre-FFN LN
  Param fc1_weight, fc1_bias;                        // [ffn_local, d], column-parallel
  Param mid_ffn_norm_weight, mid_ffn_norm_bias;      // ffn_layernorm [ffn_local] (scale_fc)
  Param fc2_weight, fc2_bias;  // [d, ffn_local], row-parallel; bias replicated
  Param resid_scale;           // w_resid [d] (scale_resids)
};

// The part of the model one pipeline stage holds: the layers [layer_begin, layer_end) (global
// indices, so parameter names and dropout sites are those of the whole model); the first stage
// also holds the embedding, the last the final LayerNorm, the LM head and the loss. With a tied
// head, a last stage that is not also the first holds its own copy of the embedding as the head
// (Megatron's scheme), under the same name and so with the same initial values.
struct PipelineStagePlacement {
  int stage = 0;
  int num_stages = 1;
  int layer_begin = 0;
  int layer_end = -1;  // -1: through the model's last layer

  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
};

// `placement` with layer_end resolved, after checking it describes a stage of a model of
// num_layers layers: 0 <= stage < num_stages, a non-empty layer range within the model, starting
// at layer 0 exactly on the first stage and ending at the last layer exactly on the last stage.
absl::StatusOr<PipelineStagePlacement> ResolvePlacement(const PipelineStagePlacement& placement,
                                                        int num_layers);

// "decoder.layers.<layer>": the name prefix of a layer's parameters.
std::string LayerPrefix(int layer);

// The blocks per-block gradient norms are reported for: the embedding (token and position
// tables), each decoder layer, and the head (final LayerNorm, the masked LM's lm_head and an
// untied output projection).
// kEmbeddingBlock, 0 .. num_layers - 1, kHeadBlock: num_layers + 2 blocks in model order.
inline constexpr int kEmbeddingBlock = -1;
int HeadBlock(int num_layers);  // = num_layers
// The block of a parameter by its name (decoder.layers.N.* is layer N).
int BlockOf(absl::string_view param_name, int num_layers);
// "embedding", "0", "1", ..., "head": the `layer` label of the per-block norm metric.
std::string BlockName(int block, int num_layers);

struct ModelParams {
  Param embed_tokens;     // [vocab_padded / tp, d], vocab-parallel (first stage; tied last stage)
  Param embed_positions;  // [max_seq_len + first_position, d] when LEARNED (first stage)
  int first_layer = 0;    // global index of layers[0]
  std::vector<LayerParams> layers;  // the stage's layers, in order
  Param final_norm_weight, final_norm_bias;
  Param output_projection;  // [vocab_padded / tp, d] when the head is untied
  // The masked LM's transform before the projection (RoBERTa's lm_head), replicated: dense
  // [d, d] and [d], LayerNorm [d]; and the output bias [vocab_padded / tp], vocab-parallel.
  Param lm_head_dense_weight, lm_head_dense_bias;
  Param lm_head_norm_weight, lm_head_norm_bias;
  Param lm_head_bias;
};

// Every parameter of the model (default) or of the pipeline stage `placement` (resolved by
// ResolvePlacement) for a vocabulary padded to `padded_vocab`, in a fixed order.
std::vector<ParamSpec> NormFormerParamSpecs(const ModelConfig& config, int64_t padded_vocab,
                                            const PipelineStagePlacement& placement = {});

// Views of `table`'s parameters, which must come from NormFormerParamSpecs(config, ...,
// placement).
ModelParams BindModelParams(const ParamTable& table, const ModelConfig& config,
                            const PipelineStagePlacement& placement = {});

// The parameters of stage `placement` whose gradients must be all-reduced over the embedding
// group (the first and last pipeline stages) before the optimizer step: the tied embedding when
// the first and last stages are different stages (each holds a copy). Empty otherwise.
std::vector<std::string> EmbeddingGroupParams(const ModelConfig& config,
                                              const PipelineStagePlacement& placement);

}  // namespace nf::model
