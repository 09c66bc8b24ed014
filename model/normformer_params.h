// The NormFormer parameter set: the ParamSpec rows of a model config (fairseq names, shapes,
// tensor-parallel sharding, decay, fairseq initialisation) and typed views of them per layer.
#pragma once

#include <vector>

#include "model/linear.h"
#include "model/model_config.pb.h"
#include "model/param_table.h"

namespace nf::model {

// One decoder layer. Optional parameters (NormFormer switches, untied head) are undefined
// Params when their switch is off.
struct LayerParams {
  Param attn_norm_weight, attn_norm_bias;  // self_attn_layer_norm: the pre-attention LN
  Param q_weight, q_bias, k_weight, k_bias, v_weight, v_bias;  // [d_local, d], column-parallel
  Param out_weight, out_bias;                        // [d, d_local], row-parallel; bias replicated
  Param head_scale;                                  // c_attn [heads_local] (scale_heads)
  Param post_attn_norm_weight, post_attn_norm_bias;  // attn_ln (scale_attn)
  Param ffn_norm_weight, ffn_norm_bias;              // final_layer_norm: the pre-FFN LN
  Param fc1_weight, fc1_bias;                        // [ffn_local, d], column-parallel
  Param mid_ffn_norm_weight, mid_ffn_norm_bias;      // ffn_layernorm [ffn_local] (scale_fc)
  Param fc2_weight, fc2_bias;  // [d, ffn_local], row-parallel; bias replicated
  Param resid_scale;           // w_resid [d] (scale_resids)
};

struct ModelParams {
  Param embed_tokens;     // [vocab_padded / tp, d], vocab-parallel
  Param embed_positions;  // [max_seq_len, d] when positions are LEARNED
  std::vector<LayerParams> layers;
  Param final_norm_weight, final_norm_bias;
  Param output_projection;  // [vocab_padded / tp, d] when the head is untied
};

// Every parameter of the model for a vocabulary padded to `padded_vocab`, in a fixed order.
std::vector<ParamSpec> NormFormerParamSpecs(const ModelConfig& config, int64_t padded_vocab);

// Views of `table`'s parameters, which must come from NormFormerParamSpecs(config, ...).
ModelParams BindModelParams(const ParamTable& table, const ModelConfig& config);

}  // namespace nf::model
