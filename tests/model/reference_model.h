// A float64 NormFormer written from docs/design.md section 4 with plain loops, independent of the
// layer code: the reference the model's fp32 forward and backward are checked against. It
// reads the model's initial parameters by name and draws the same dropout masks from the
// documented Philox coordinates (core/philox.h).
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/philox.h"
#include "model/model_config.pb.h"
#include "model/param_table.h"
#include "reference_activation.h"

namespace nf::testing {

class ReferenceModel {
 public:
  using Matrix = std::vector<double>;  // row-major

  // `first_sample` and `train` as in NormFormerModel::Forward; `seed` keys dropout.
  ReferenceModel(const model::ModelConfig& config, const model::ParamTable& table, int64_t batch,
                 int64_t seq, uint32_t seed, uint64_t first_sample, bool train)
      : config_(config),
        batch_(batch),
        seq_(seq),
        seed_(seed),
        first_sample_(first_sample),
        train_(train) {
    for (const model::ParamTable::Entry& e : table.entries()) {
      const std::vector<float> values = *ToFloatVector(e.value);
      params[e.spec.name] = Matrix(values.begin(), values.end());
    }
    padded_vocab_ = table.Get("decoder.embed_tokens.weight").local_shape[0];
  }

  // Mutable for finite differences: name -> values.
  std::map<std::string, Matrix> params;

  // Sum of token losses (targets < 0 carry none); logits [T, padded_vocab] if requested.
  double Loss(const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
              Matrix* logits_out = nullptr) const {
    const int64_t d = config_.d_model(), t = batch_ * seq_;
    Matrix x(t * d);
    const Matrix& embed = params.at("decoder.embed_tokens.weight");
    const double embed_scale = config_.scale_embedding() ? std::sqrt(double(d)) : 1.0;
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t c = 0; c < d; ++c) {
        x[i * d + c] = embed[inputs[i] * d + c] * embed_scale + Position(i % seq_, c);
      }
    }
    Dropout(x, d, 0, config_.dropout(), 0);
    for (int layer = 0; layer < config_.num_layers(); ++layer) x = Layer(layer, x);
    Matrix h = LayerNorm(x, d, "decoder.layer_norm");
    if (masked_lm()) {
      // RoBERTa's lm_head: dense, activation, LayerNorm; the projection then adds its bias.
      h = Linear(h, "decoder.lm_head.dense", d, d);
      for (double& value : h) value = ReferenceActivation(config_.activation(), value);
      h = LayerNorm(h, d, "decoder.lm_head.layer_norm");
    }
    const Matrix& head =
        config_.tie_embeddings() ? embed : params.at("decoder.output_projection.weight");
    Matrix logits = MatMulT(h, head, t, d, padded_vocab_);
    if (masked_lm()) {
      const Matrix& bias = P("decoder.lm_head.bias");
      for (size_t i = 0; i < logits.size(); ++i) logits[i] += bias[i % padded_vocab_];
    }
    double loss = 0.0;
    const int64_t valid = config_.vocab_size();
    for (int64_t i = 0; i < t; ++i) {
      if (targets[i] < 0) continue;
      double max = -INFINITY;
      for (int64_t v = 0; v < valid; ++v) max = std::max(max, logits[i * padded_vocab_ + v]);
      double sum = 0.0;
      for (int64_t v = 0; v < valid; ++v) sum += std::exp(logits[i * padded_vocab_ + v] - max);
      loss += std::log(sum) + max - logits[i * padded_vocab_ + targets[i]];
    }
    if (logits_out != nullptr) *logits_out = std::move(logits);
    return loss;
  }

 private:
  const Matrix& P(const std::string& name) const { return params.at(name); }
  bool Has(const std::string& name) const { return params.count(name) > 0; }
  bool masked_lm() const { return config_.objective() == model::ModelConfig::MASKED_LM; }

  // Token t's position number is t + first_position.
  double Position(int64_t t, int64_t c) const {
    const int64_t d = config_.d_model(), pos = t + config_.first_position();
    if (config_.positions() == model::ModelConfig::LEARNED) {
      return P("decoder.embed_positions.weight")[pos * d + c];
    }
    const int64_t half = d / 2;
    if (c >= 2 * half) return 0.0;
    const int64_t i = c % half;
    const double w = std::exp(-std::log(10000.0) / double(half - 1) * double(i));
    return c < half ? std::sin(double(pos) * w) : std::cos(double(pos) * w);
  }

  // In place on x [T, width]: element (token, col) kept iff its Philox word clears p.
  void Dropout(Matrix& x, int64_t width, uint32_t site, float p, int64_t col_offset) const {
    if (!train_ || p == 0.0f) return;
    for (int64_t i = 0; i < batch_ * seq_; ++i) {
      for (int64_t c = 0; c < width; ++c) {
        const uint64_t col = col_offset + c;
        const bool keep = DropoutWords(seed_, site, first_sample_ + i / seq_, 0, i % seq_,
                                       col)[col & 3] >= DropoutThreshold(p);
        x[i * width + c] = keep ? x[i * width + c] / (1.0 - p) : 0.0;
      }
    }
  }

  Matrix LayerNorm(const Matrix& x, int64_t width, const std::string& prefix) const {
    const Matrix& w = P(prefix + ".weight");
    const Matrix& b = P(prefix + ".bias");
    Matrix y(x.size());
    for (size_t r = 0; r < x.size() / width; ++r) {
      double mean = 0.0, var = 0.0;
      for (int64_t c = 0; c < width; ++c) mean += x[r * width + c] / width;
      for (int64_t c = 0; c < width; ++c) var += std::pow(x[r * width + c] - mean, 2) / width;
      const double rstd = 1.0 / std::sqrt(var + double(config_.layer_norm_eps()));
      for (int64_t c = 0; c < width; ++c) {
        y[r * width + c] = (x[r * width + c] - mean) * rstd * w[c] + b[c];
      }
    }
    return y;
  }

  // x [rows, in] W^T, W [out, in].
  static Matrix MatMulT(const Matrix& x, const Matrix& w, int64_t rows, int64_t in, int64_t out) {
    Matrix y(rows * out, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double s = 0.0;
        for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
        y[r * out + o] = s;
      }
    }
    return y;
  }

  Matrix Linear(const Matrix& x, const std::string& prefix, int64_t in, int64_t out) const {
    Matrix y = MatMulT(x, P(prefix + ".weight"), batch_ * seq_, in, out);
    const Matrix& b = P(prefix + ".bias");
    for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % out];
    return y;
  }

  Matrix Layer(int layer, const Matrix& x_in) const {
    const std::string p = "decoder.layers." + std::to_string(layer);
    const model::NormFormerConfig& nf = config_.normformer();
    const int64_t d = config_.d_model(), heads = config_.num_heads(), dh = d / heads;
    const int64_t ffn = config_.ffn_dim(), t = batch_ * seq_;
    const uint32_t site = 1 + 4 * layer;  // + kind: probs 0, attention 1, activation 2, ffn 3
    const Matrix h = LayerNorm(x_in, d, p + ".self_attn_layer_norm");
    const Matrix q = Linear(h, p + ".self_attn.q_proj", d, d);
    const Matrix k = Linear(h, p + ".self_attn.k_proj", d, d);
    const Matrix v = Linear(h, p + ".self_attn.v_proj", d, d);
    const bool before =
        nf.scale_heads() && nf.head_scale_placement() == model::NormFormerConfig::BEFORE_OUT_PROJ;
    const bool after = nf.scale_heads() && !before;
    Matrix o(t * d, 0.0);
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        for (int64_t i = 0; i < seq_; ++i) {
          // Query i attends keys 0 .. i, or every key of its sample in a masked LM's encoder.
          const int64_t keys = masked_lm() ? seq_ : i + 1;
          std::vector<double> s(keys);
          double max = -INFINITY;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0.0;
            for (int64_t e = 0; e < dh; ++e) {
              dot += q[(b * seq_ + i) * d + hd * dh + e] * k[(b * seq_ + j) * d + hd * dh + e];
            }
            s[j] = dot / std::sqrt(double(dh));
            max = std::max(max, s[j]);
          }
          double sum = 0.0;
          for (double& sj : s) sum += (sj = std::exp(sj - max));
          const float pa = train_ ? config_.attention_dropout() : 0.0f;
          for (int64_t j = 0; j < keys; ++j) {
            double prob = s[j] / sum;
            if (pa > 0.0f) {
              const bool keep = DropoutWords(seed_, site, first_sample_ + b, hd, i, j)[j & 3] >=
                                DropoutThreshold(pa);
              prob = keep ? prob / (1.0 - pa) : 0.0;
            }
            for (int64_t e = 0; e < dh; ++e) {
              o[(b * seq_ + i) * d + hd * dh + e] += prob * v[(b * seq_ + j) * d + hd * dh + e];
            }
          }
        }
      }
    }
    if (before) {
      for (int64_t i = 0; i < t * d; ++i) o[i] *= P(p + ".c_attn")[(i % d) / dh];
    }
    Matrix a = Linear(o, p + ".self_attn.out_proj", d, d);
    if (after) {
      for (int64_t i = 0; i < t * d; ++i) a[i] *= P(p + ".c_attn")[(i % d) / dh];
    }
    if (nf.scale_attn()) a = LayerNorm(a, d, p + ".attn_ln");
    Dropout(a, d, site + 1, config_.dropout(), 0);
    Matrix x(t * d);
    for (int64_t i = 0; i < t * d; ++i) x[i] = x_in[i] + a[i];

    Matrix f = Linear(LayerNorm(x, d, p + ".final_layer_norm"), p + ".fc1", d, ffn);
    for (double& value : f) value = ReferenceActivation(config_.activation(), value);
    Dropout(f, ffn, site + 2, config_.activation_dropout(), 0);
    if (nf.scale_fc()) f = LayerNorm(f, ffn, p + ".ffn_layernorm");
    Matrix g = Linear(f, p + ".fc2", ffn, d);
    Dropout(g, d, site + 3, config_.dropout(), 0);
    Matrix y(t * d);
    for (int64_t i = 0; i < t * d; ++i) {
      const double lambda = nf.scale_resids() ? P(p + ".w_resid")[i % d] : 1.0;
      y[i] = lambda * x[i] + g[i];
    }
    return y;
  }

  model::ModelConfig config_;
  int64_t batch_, seq_;
  uint32_t seed_;
  uint64_t first_sample_;
  bool train_;
  int64_t padded_vocab_ = 0;
};

}  // namespace nf::testing
