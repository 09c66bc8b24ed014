// Softmax and scaled-dot-product attention (causal or bidirectional) on the CPU. Attention runs
// one (batch, head) pair per task: the [seq, seq] score matrix through sgemm, then a masked row
// softmax, Philox dropout and a second sgemm. The backward recomputes the probabilities from
// the saved log-sum-exp, as flash attention does, so only O(seq) floats per row are kept between
// passes. The score rows are fp32 whatever the dtype, so every row softmax (and its backward)
// runs the vectorised kernels of core/cpu/isa/softmax_kernels.h; only the visible part of a row
// (the causal prefix, or the whole row without the mask) is computed, the rest is zeroed for
// the following sgemm.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/blas.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/elementwise_kernels.h"
#include "core/cpu/isa/softmax_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/philox.h"

namespace nf::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// C[m, n] = alpha * op(A) op(B) on fp32 row-major matrices (beta = 0).
void MatMul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float* c) {
  Sgemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, 0.0f, c, n);
}

// Per (batch, head): the dropout multipliers keep / (1 - p) of row i's visible columns.
struct DropoutRow {
  const ops::DropoutSpec& spec;
  uint64_t sample, head;
  uint32_t threshold;
  float keep_scale;

  DropoutRow(const ops::DropoutSpec& s, int64_t b, int64_t h)
      : spec(s),
        sample(s.first_sample + b),
        head(s.head_offset + h),
        threshold(DropoutThreshold(s.p)),
        keep_scale(1.0f / (1.0f - s.p)) {}

  // row[j] *= multiplier(i, j) for j < length, through the vectorised row kernel (key
  // positions are the columns, from 0).
  void Apply(int64_t i, float* row, int64_t length) const {
    if (spec.p == 0.0f) return;
    const DropoutRowArgs args{.seed = spec.seed,
                              .site = spec.site,
                              .sample = sample,
                              .head = head,
                              .row = static_cast<uint64_t>(i),
                              .first_col = 0,
                              .threshold = threshold,
                              .keep_scale = keep_scale};
    Elementwise().dropout_row(args, row, row, length);
  }
};

// The [seq, head_dim] slice of (batch, head) pair `bh` of t as fp32 (staged in buf if needed).
template <typename T>
const float* LoadHead(const Tensor& t, int64_t bh, int64_t n, std::vector<float>& buf) {
  return AsFloat(t.data<T>() + bh * n, n, buf);
}

// The keys query i attends: 0 .. i with the causal mask, all seq without.
int64_t VisibleKeys(bool causal, int64_t i, int64_t seq) { return causal ? i + 1 : seq; }

template <typename T>
void AttentionForwardTyped(const ops::AttentionArgs& args) {
  const int64_t batch = args.q.dim(0), heads = args.q.dim(1);
  const int64_t seq = args.q.dim(2), dim = args.q.dim(3), n = seq * dim;
  const SoftmaxKernels& kernels = Softmax();
  ParallelFor(batch * heads, 4 * seq * seq * dim, [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf, k_buf, v_buf, scores(seq * seq), out(n);
    for (int64_t bh = begin; bh < end; ++bh) {
      const DropoutRow dropout(args.dropout, bh / heads, bh % heads);
      const float* q = LoadHead<T>(args.q, bh, n, q_buf);
      const float* k = LoadHead<T>(args.k, bh, n, k_buf);
      const float* v = LoadHead<T>(args.v, bh, n, v_buf);
      float* lse = args.lse.data<float>() + bh * seq;
      MatMul(false, true, seq, seq, dim, args.scale, q, k, scores.data());
      for (int64_t i = 0; i < seq; ++i) {
        float* row = scores.data() + i * seq;
        const int64_t visible = VisibleKeys(args.causal, i, seq);
        lse[i] = kernels.softmax(row, visible, row);
        std::fill(row + visible, row + seq, 0.0f);
        dropout.Apply(i, row, visible);
      }
      MatMul(false, false, seq, dim, seq, 1.0f, scores.data(), v, out.data());
      StoreFloats(out.data(), n, args.out.data<T>() + bh * n);
    }
  });
}

template <typename T>
void AttentionBackwardTyped(const ops::AttentionBackwardArgs& args) {
  const int64_t batch = args.q.dim(0), heads = args.q.dim(1);
  const int64_t seq = args.q.dim(2), dim = args.q.dim(3), n = seq * dim;
  const SoftmaxKernels& kernels = Softmax();
  // Without dropout P' is P: dV reads the probabilities themselves, nothing is copied.
  const bool dropout_on = args.dropout.p != 0.0f;
  ParallelFor(batch * heads, 10 * seq * seq * dim, [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf, k_buf, v_buf, o_buf, do_buf;
    std::vector<float> probs(seq * seq), dropped_buf(dropout_on ? seq * seq : 0),
        grad_buf(seq * seq);
    std::vector<float> result(n), row_dot(seq);
    for (int64_t bh = begin; bh < end; ++bh) {
      const DropoutRow dropout(args.dropout, bh / heads, bh % heads);
      const float* q = LoadHead<T>(args.q, bh, n, q_buf);
      const float* k = LoadHead<T>(args.k, bh, n, k_buf);
      const float* v = LoadHead<T>(args.v, bh, n, v_buf);
      const float* o = LoadHead<T>(args.out, bh, n, o_buf);
      const float* d_o = LoadHead<T>(args.dout, bh, n, do_buf);
      const float* lse = args.lse.data<float>() + bh * seq;
      // P (probabilities) and P' = dropout(P), both [seq, seq], zero above the diagonal when
      // causal.
      float* p = probs.data();
      float* dropped = dropout_on ? dropped_buf.data() : p;
      MatMul(false, true, seq, seq, dim, args.scale, q, k, p);
      for (int64_t i = 0; i < seq; ++i) {
        float* p_row = p + i * seq;
        const int64_t visible = VisibleKeys(args.causal, i, seq);
        kernels.exp_shifted(p_row, visible, lse[i], p_row);
        std::fill(p_row + visible, p_row + seq, 0.0f);
        if (dropout_on) {
          std::copy(p_row, p_row + seq, dropped + i * seq);
          dropout.Apply(i, dropped + i * seq, visible);
        }
        // sum_j P'_ij dP'_ij = sum_d dO_id O_id: the softmax backward's row term.
        row_dot[i] = static_cast<float>(kernels.dot(d_o + i * dim, o + i * dim, dim));
      }
      // dV = P'^T dO.
      MatMul(true, false, seq, dim, seq, 1.0f, dropped, d_o, result.data());
      StoreFloats(result.data(), n, args.dv.data<T>() + bh * n);
      // dP' = dO V^T; dP = dropout(dP'); dS = P * (dP - row_dot).
      float* grad = grad_buf.data();
      MatMul(false, true, seq, seq, dim, 1.0f, d_o, v, grad);
      for (int64_t i = 0; i < seq; ++i) {
        float* g = grad + i * seq;
        const int64_t visible = VisibleKeys(args.causal, i, seq);
        dropout.Apply(i, g, visible);
        kernels.softmax_grad(p + i * seq, g, visible, row_dot[i], g);
        std::fill(g + visible, g + seq, 0.0f);
      }
      // dQ = scale * dS K; dK = scale * dS^T Q.
      MatMul(false, false, seq, dim, seq, args.scale, grad, k, result.data());
      StoreFloats(result.data(), n, args.dq.data<T>() + bh * n);
      MatMul(true, false, seq, dim, seq, args.scale, grad, q, result.data());
      StoreFloats(result.data(), n, args.dk.data<T>() + bh * n);
    }
  });
}

// Per (batch, head): the new rows appended to the caches, then the new queries' [new, past +
// new] scores through sgemm and the masked row softmax of AttentionForwardTyped.
template <typename T>
void KvCacheAttentionTyped(const ops::KvCacheAttentionArgs& args) {
  const int64_t batch = args.q.dim(0), heads = args.q.dim(1);
  const int64_t fresh = args.q.dim(2), dim = args.q.dim(3), n = fresh * dim;
  const int64_t capacity = args.k_cache.dim(2), keys = args.past + fresh;
  const SoftmaxKernels& kernels = Softmax();
  ParallelFor(batch * heads, 4 * fresh * keys * dim, [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf, k_buf, v_buf, scores(fresh * keys), out(n);
    for (int64_t bh = begin; bh < end; ++bh) {
      T* k_cache = args.k_cache.data<T>() + bh * capacity * dim;
      T* v_cache = args.v_cache.data<T>() + bh * capacity * dim;
      std::copy_n(args.k.data<T>() + bh * n, n, k_cache + args.past * dim);
      std::copy_n(args.v.data<T>() + bh * n, n, v_cache + args.past * dim);
      const float* q = LoadHead<T>(args.q, bh, n, q_buf);
      const float* k = AsFloat(k_cache, keys * dim, k_buf);
      const float* v = AsFloat(v_cache, keys * dim, v_buf);
      MatMul(false, true, fresh, keys, dim, args.scale, q, k, scores.data());
      for (int64_t i = 0; i < fresh; ++i) {
        float* row = scores.data() + i * keys;
        const int64_t visible = args.past + i + 1;
        kernels.softmax(row, visible, row);
        std::fill(row + visible, row + keys, 0.0f);
      }
      MatMul(false, false, fresh, dim, keys, 1.0f, scores.data(), v, out.data());
      StoreFloats(out.data(), n, args.out.data<T>() + bh * n);
    }
  });
}

}  // namespace

absl::Status CpuBackend::SoftmaxForward(const Tensor& x, const Tensor& y) {
  const int64_t cols = ops::Cols(x);
  if (x.dtype() == DType::kF32) {
    ParallelFor(ops::Rows(x), 20 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        Softmax().softmax(x.data<float>() + r * cols, cols, y.data<float>() + r * cols);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    ParallelFor(ops::Rows(x), 20 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* in = px + r * cols;
        T* out = py + r * cols;
        float max = kNegInf;
        for (int64_t c = 0; c < cols; ++c) max = std::max(max, ToFloat(in[c]));
        if (max == kNegInf) {  // fully masked row: no probability mass anywhere
          for (int64_t c = 0; c < cols; ++c) out[c] = FromFloat<T>(0.0f);
          continue;
        }
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c)
          sum += std::exp(static_cast<double>(ToFloat(in[c]) - max));
        const double inv = 1.0 / sum;
        for (int64_t c = 0; c < cols; ++c) {
          out[c] = FromFloat<T>(
              static_cast<float>(std::exp(static_cast<double>(ToFloat(in[c]) - max)) * inv));
        }
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t cols = ops::Cols(y);
  if (y.dtype() == DType::kF32) {
    ParallelFor(ops::Rows(y), 4 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* py = y.data<float>() + r * cols;
        const float* pdy = dy.data<float>() + r * cols;
        const float dot = static_cast<float>(Softmax().dot(py, pdy, cols));
        Softmax().softmax_grad(py, pdy, cols, dot, dx.data<float>() + r * cols);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(y.dtype(), [&]<typename T>() {
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    ParallelFor(ops::Rows(y), 4 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = r * cols;
        double dot = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          dot += static_cast<double>(ToFloat(py[base + c])) * ToFloat(pdy[base + c]);
        }
        for (int64_t c = 0; c < cols; ++c) {
          const float yc = ToFloat(py[base + c]);
          pdx[base + c] = FromFloat<T>(yc * (ToFloat(pdy[base + c]) - static_cast<float>(dot)));
        }
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::AttentionForward(const ops::AttentionArgs& args) {
  if (args.q.numel() == 0) return absl::OkStatus();
  DispatchFloat(args.q.dtype(), [&]<typename T>() { AttentionForwardTyped<T>(args); });
  return absl::OkStatus();
}

absl::Status CpuBackend::AttentionBackward(const ops::AttentionBackwardArgs& args) {
  if (args.q.numel() == 0) return absl::OkStatus();
  DispatchFloat(args.q.dtype(), [&]<typename T>() { AttentionBackwardTyped<T>(args); });
  return absl::OkStatus();
}

absl::Status CpuBackend::KvCacheAttention(const ops::KvCacheAttentionArgs& args) {
  if (args.q.numel() == 0) return absl::OkStatus();
  DispatchFloat(args.q.dtype(), [&]<typename T>() { KvCacheAttentionTyped<T>(args); });
  return absl::OkStatus();
}

}  // namespace nf::cpu
