// One NormFormer decoder layer in float64, forward and backward, written from docs/design.md
// section 4 independently of the layer code, with OpenBLAS's dgemm for the products so that the
// 2.7B's full shape (seq 2048, d 2560, ffn 10240) runs in seconds. No dropout (the full-shape
// test compares without it; tests/model/reference_model.h checks the masks at small shapes).
//
//   h1 = LN_attn_in(x);  q, k, v = h1 W^T + b;  o_h = softmax(q_h k_h^T / sqrt(dh) + causal) v_h
//   o_h *= c_h (before out_proj) ;  a = o W_o^T + b_o ;  a *= c_h (after out_proj)
//   a2 = LN_post_attn(a) (scale_attn) ;  x1 = x + a2
//   f = LN_ffn_in(x1) W_1^T + b_1 ;  g = act(f) ;  g2 = LN_ffn_mid(g) (scale_fc)
//   y = lambda x1 + g2 W_2^T + b_2   (lambda: w_resid under scale_resids, else 1)
//
// Matrices are row-major std::vector<double>, token-major: [T = batch * seq, features].
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/model_config.pb.h"
#include "reference_activation.h"

namespace nf::testing {

class ReferenceLayer {
 public:
  using Matrix = std::vector<double>;

  // `params`: the layer's parameters by their name after the layer prefix ("fc1.weight",
  // "self_attn.q_proj.bias", "c_attn", ...), global shapes.
  ReferenceLayer(const model::ModelConfig& config, std::map<std::string, Matrix> params,
                 int64_t batch, int64_t seq)
      : c_(config), p_(std::move(params)), batch_(batch), seq_(seq) {}

  // x [T, d] -> y [T, d]; keeps what Backward needs.
  Matrix Forward(const Matrix& x) {
    const int64_t d = c_.d_model(), f = c_.ffn_dim(), t = batch_ * seq_;
    const model::NormFormerConfig& nf = c_.normformer();
    x_ = x;
    h1_ = LayerNorm(x, d, "self_attn_layer_norm", attn_in_);
    q_ = Linear(h1_, "self_attn.q_proj", d, d);
    k_ = Linear(h1_, "self_attn.k_proj", d, d);
    v_ = Linear(h1_, "self_attn.v_proj", d, d);
    AttentionForward();  // -> probs_, o_
    o_scaled_ = o_;
    if (HeadsBefore()) ScaleHeads(o_scaled_);
    a_ = Linear(o_scaled_, "self_attn.out_proj", d, d);
    a_unscaled_ = a_;
    if (HeadsAfter()) ScaleHeads(a_);
    Matrix a2 = nf.scale_attn() ? LayerNorm(a_, d, "attn_ln", post_attn_) : a_;
    x1_.resize(t * d);
    for (int64_t i = 0; i < t * d; ++i) x1_[i] = x[i] + a2[i];
    h2_ = LayerNorm(x1_, d, "final_layer_norm", ffn_in_);
    f_ = Linear(h2_, "fc1", d, f);
    g_ = f_;
    for (double& v : g_) v = ReferenceActivation(c_.activation(), v);
    g2_ = nf.scale_fc() ? LayerNorm(g_, f, "ffn_layernorm", mid_) : g_;
    Matrix y = Linear(g2_, "fc2", f, d);
    for (int64_t i = 0; i < t * d; ++i) y[i] += Lambda(i % d) * x1_[i];
    return y;
  }

  // dy [T, d] -> dx [T, d]; fills grads (the parameters' names) with d(sum dy * y)/dparam.
  Matrix Backward(const Matrix& dy) {
    const int64_t d = c_.d_model(), f = c_.ffn_dim(), t = batch_ * seq_;
    const model::NormFormerConfig& nf = c_.normformer();
    grads.clear();
    Matrix dx1(t * d);
    for (int64_t i = 0; i < t * d; ++i) dx1[i] = Lambda(i % d) * dy[i];
    if (nf.scale_resids()) {
      Matrix& dl = grads["w_resid"] = Matrix(d, 0.0);
      for (int64_t i = 0; i < t * d; ++i) dl[i % d] += dy[i] * x1_[i];
    }
    Matrix dg2 = LinearBackward(dy, g2_, "fc2", f, d);
    Matrix dg = nf.scale_fc() ? LayerNormBackward(dg2, f, "ffn_layernorm", mid_) : dg2;
    for (int64_t i = 0; i < t * f; ++i) dg[i] *= ReferenceActivationGrad(c_.activation(), f_[i]);
    const Matrix dh2 = LinearBackward(dg, h2_, "fc1", d, f);
    const Matrix dx1_ln = LayerNormBackward(dh2, d, "final_layer_norm", ffn_in_);
    for (int64_t i = 0; i < t * d; ++i) dx1[i] += dx1_ln[i];
    // x1 = x + a2
    Matrix da = nf.scale_attn() ? LayerNormBackward(dx1, d, "attn_ln", post_attn_) : dx1;
    if (HeadsAfter()) ScaleHeadsBackward(da, a_unscaled_);
    Matrix do_scaled = LinearBackward(da, o_scaled_, "self_attn.out_proj", d, d);
    if (HeadsBefore()) ScaleHeadsBackward(do_scaled, o_);
    Matrix dq, dk, dv;
    AttentionBackward(do_scaled, dq, dk, dv);
    Matrix dh1 = LinearBackward(dq, h1_, "self_attn.q_proj", d, d);
    const Matrix dh1_k = LinearBackward(dk, h1_, "self_attn.k_proj", d, d);
    const Matrix dh1_v = LinearBackward(dv, h1_, "self_attn.v_proj", d, d);
    for (int64_t i = 0; i < t * d; ++i) dh1[i] += dh1_k[i] + dh1_v[i];
    Matrix dx = LayerNormBackward(dh1, d, "self_attn_layer_norm", attn_in_);
    for (int64_t i = 0; i < t * d; ++i) dx[i] += dx1[i];
    return dx;
  }

  std::map<std::string, Matrix> grads;

 private:
  struct NormStats {
    Matrix xhat;
    std::vector<double> rstd;
  };

  bool HeadsBefore() const {
    return c_.normformer().scale_heads() &&
           c_.normformer().head_scale_placement() == model::NormFormerConfig::BEFORE_OUT_PROJ;
  }
  bool HeadsAfter() const { return c_.normformer().scale_heads() && !HeadsBefore(); }
  double Lambda(int64_t col) const {
    return c_.normformer().scale_resids() ? p_.at("w_resid")[col] : 1.0;
  }
  int64_t HeadDim() const { return c_.d_model() / c_.num_heads(); }

  // out = op(a) [m, k] x op(b) [k, n], row-major.
  static void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                   int64_t lda, const double* b, int64_t ldb, double* out, int64_t ldc,
                   double beta = 0.0) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                out, static_cast<int>(ldc));
  }

  Matrix LayerNorm(const Matrix& x, int64_t width, const std::string& name, NormStats& stats) {
    const Matrix& w = p_.at(name + ".weight");
    const Matrix& b = p_.at(name + ".bias");
    const int64_t rows = static_cast<int64_t>(x.size()) / width;
    stats.xhat.resize(x.size());
    stats.rstd.resize(rows);
    Matrix y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const double* row = &x[r * width];
      double mean = 0.0, var = 0.0;
      for (int64_t c = 0; c < width; ++c) mean += row[c];
      mean /= width;
      for (int64_t c = 0; c < width; ++c) var += (row[c] - mean) * (row[c] - mean);
      var /= width;
      const double rstd = 1.0 / std::sqrt(var + double(c_.layer_norm_eps()));
      stats.rstd[r] = rstd;
      for (int64_t c = 0; c < width; ++c) {
        const double xhat = (row[c] - mean) * rstd;
        stats.xhat[r * width + c] = xhat;
        y[r * width + c] = xhat * w[c] + b[c];
      }
    }
    return y;
  }

  Matrix LayerNormBackward(const Matrix& dy, int64_t width, const std::string& name,
                           const NormStats& stats) {
    const Matrix& w = p_.at(name + ".weight");
    Matrix& dw = grads[name + ".weight"] = Matrix(width, 0.0);
    Matrix& db = grads[name + ".bias"] = Matrix(width, 0.0);
    const int64_t rows = static_cast<int64_t>(dy.size()) / width;
    Matrix dx(dy.size());
    for (int64_t r = 0; r < rows; ++r) {
      double mean_g = 0.0, mean_gx = 0.0;
      for (int64_t c = 0; c < width; ++c) {
        const double g = dy[r * width + c] * w[c], xhat = stats.xhat[r * width + c];
        dw[c] += dy[r * width + c] * xhat;
        db[c] += dy[r * width + c];
        mean_g += g;
        mean_gx += g * xhat;
      }
      mean_g /= width;
      mean_gx /= width;
      for (int64_t c = 0; c < width; ++c) {
        const double g = dy[r * width + c] * w[c], xhat = stats.xhat[r * width + c];
        dx[r * width + c] = stats.rstd[r] * (g - mean_g - xhat * mean_gx);
      }
    }
    return dx;
  }

  // x [T, in] W^T + b, W [out, in].
  Matrix Linear(const Matrix& x, const std::string& name, int64_t in, int64_t out) const {
    const int64_t t = batch_ * seq_;
    Matrix y(t * out);
    Gemm(false, true, t, out, in, x.data(), in, p_.at(name + ".weight").data(), in, y.data(), out);
    const Matrix& b = p_.at(name + ".bias");
    for (int64_t i = 0; i < t * out; ++i) y[i] += b[i % out];
    return y;
  }

  // dy [T, out], x [T, in] -> dW = dy^T x, db = sum dy, returns dx = dy W.
  Matrix LinearBackward(const Matrix& dy, const Matrix& x, const std::string& name, int64_t in,
                        int64_t out) {
    const int64_t t = batch_ * seq_;
    Matrix& dw = grads[name + ".weight"] = Matrix(out * in);
    Gemm(true, false, out, in, t, dy.data(), out, x.data(), in, dw.data(), in);
    Matrix& db = grads[name + ".bias"] = Matrix(out, 0.0);
    for (int64_t i = 0; i < t * out; ++i) db[i % out] += dy[i];
    Matrix dx(t * in);
    Gemm(false, false, t, in, out, dy.data(), out, p_.at(name + ".weight").data(), in, dx.data(),
         in);
    return dx;
  }

  // Per (sample, head): scores [S, S] = q_h k_h^T / sqrt(dh), causal softmax -> probs_, and
  // o_h = P v_h.
  void AttentionForward() {
    const int64_t d = c_.d_model(), heads = c_.num_heads(), dh = HeadDim();
    const double scale = 1.0 / std::sqrt(double(dh));
    probs_.assign(batch_ * heads, Matrix());
    o_.assign(batch_ * seq_ * d, 0.0);
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        Matrix& p = probs_[b * heads + h];
        p.assign(seq_ * seq_, 0.0);
        const int64_t base = b * seq_ * d + h * dh;
        Gemm(false, true, seq_, seq_, dh, &q_[base], d, &k_[base], d, p.data(), seq_);
        for (int64_t i = 0; i < seq_; ++i) {
          double* row = &p[i * seq_];
          double max = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) max = std::max(max, row[j] *= scale);
          double sum = 0.0;
          for (int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - max));
          for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
          for (int64_t j = i + 1; j < seq_; ++j) row[j] = 0.0;
        }
        Gemm(false, false, seq_, dh, seq_, p.data(), seq_, &v_[base], d, &o_[base], d);
      }
    }
  }

  void AttentionBackward(const Matrix& d_o, Matrix& dq, Matrix& dk, Matrix& dv) const {
    const int64_t d = c_.d_model(), heads = c_.num_heads(), dh = HeadDim();
    const double scale = 1.0 / std::sqrt(double(dh));
    dq.assign(batch_ * seq_ * d, 0.0);
    dk.assign(batch_ * seq_ * d, 0.0);
    dv.assign(batch_ * seq_ * d, 0.0);
    Matrix dp(seq_ * seq_);
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const Matrix& p = probs_[b * heads + h];
        const int64_t base = b * seq_ * d + h * dh;
        // dP = dO V^T, dV = P^T dO
        Gemm(false, true, seq_, seq_, dh, &d_o[base], d, &v_[base], d, dp.data(), seq_);
        Gemm(true, false, seq_, dh, seq_, p.data(), seq_, &d_o[base], d, &dv[base], d);
        // dS = P (dP - rowsum(dP P)), times the score scale
        for (int64_t i = 0; i < seq_; ++i) {
          double dot = 0.0;
          for (int64_t j = 0; j <= i; ++j) dot += dp[i * seq_ + j] * p[i * seq_ + j];
          for (int64_t j = 0; j < seq_; ++j) {
            dp[i * seq_ + j] = j <= i ? p[i * seq_ + j] * (dp[i * seq_ + j] - dot) * scale : 0.0;
          }
        }
        Gemm(false, false, seq_, dh, seq_, dp.data(), seq_, &k_[base], d, &dq[base], d);
        Gemm(true, false, seq_, dh, seq_, dp.data(), seq_, &q_[base], d, &dk[base], d);
      }
    }
  }

  // x [T, d] with column j in head j / dh: x *= c[head].
  void ScaleHeads(Matrix& x) const {
    const int64_t d = c_.d_model(), dh = HeadDim();
    const Matrix& c = p_.at("c_attn");
    for (size_t i = 0; i < x.size(); ++i) x[i] *= c[(static_cast<int64_t>(i) % d) / dh];
  }
  // d(x * c) -> dx in place, and dc from the unscaled x.
  void ScaleHeadsBackward(Matrix& dx, const Matrix& unscaled) {
    const int64_t d = c_.d_model(), dh = HeadDim();
    const Matrix& c = p_.at("c_attn");
    Matrix& dc = grads["c_attn"] = Matrix(c.size(), 0.0);
    for (size_t i = 0; i < dx.size(); ++i) {
      const int64_t h = (static_cast<int64_t>(i) % d) / dh;
      dc[h] += dx[i] * unscaled[i];
      dx[i] *= c[h];
    }
  }

  model::ModelConfig c_;
  std::map<std::string, Matrix> p_;
  int64_t batch_, seq_;
  Matrix x_, h1_, q_, k_, v_, o_, o_scaled_, a_, a_unscaled_, x1_, h2_, f_, g_, g2_;
  std::vector<Matrix> probs_;  // [S, S] per (sample, head)
  NormStats attn_in_, post_attn_, ffn_in_, mid_;
};

}  // namespace nf::testing
