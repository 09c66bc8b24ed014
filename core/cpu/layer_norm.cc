// LayerNorm on the CPU, local and tensor-parallel. Both paths share the per-row normalisation
// (from mean and rstd) and the per-row input gradient (from the two row sums); they differ only
// in where the row statistics come from: this rank's columns, or sums all-reduced by the caller.
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

// y[r] = (x[r] - mean[r]) * rstd[r] * w + b, for rows whose mean/rstd are already stored.
template <typename T, typename W>
void Normalize(const ops::LayerNormArgs& args, int64_t begin, int64_t end) {
  const int64_t cols = ops::Cols(args.x);
  const T* x = args.x.data<T>();
  const W* w = args.weight.data<W>();
  const W* b = args.bias.data<W>();
  T* y = args.y.data<T>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float xhat = (ToFloat(x[i]) - mean[r]) * rstd[r];
      y[i] = FromFloat<T>(xhat * ToFloat(w[c]) + ToFloat(b[c]));
    }
  }
}

template <typename F>
void DispatchLayerNorm(const Tensor& x, const Tensor& weight, F&& f) {
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(weight.dtype(), [&]<typename W>() { f.template operator()<T, W>(); });
  });
}

// Row sums of the backward, (sum g, sum g * xhat) with g = dy * w, over this rank's columns.
template <typename T, typename W>
std::pair<double, double> BackwardRowSums(const ops::LayerNormBackwardArgs& args, int64_t r) {
  const int64_t cols = ops::Cols(args.x);
  const T* x = args.x.data<T>() + r * cols;
  const T* dy = args.dy.data<T>() + r * cols;
  const W* w = args.weight.data<W>();
  const float mean = args.mean.data<float>()[r], rstd = args.rstd.data<float>()[r];
  double sum_g = 0.0, sum_g_xhat = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    const double g = static_cast<double>(ToFloat(dy[c])) * ToFloat(w[c]);
    sum_g += g;
    sum_g_xhat += g * ((ToFloat(x[c]) - mean) * rstd);
  }
  return {sum_g, sum_g_xhat};
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) for row r, given the means over the full
// (possibly tensor-parallel) feature dimension.
template <typename T, typename W>
void InputGradRow(const ops::LayerNormBackwardArgs& args, int64_t r, double mean_g,
                  double mean_g_xhat) {
  const int64_t cols = ops::Cols(args.x);
  const T* x = args.x.data<T>() + r * cols;
  const T* dy = args.dy.data<T>() + r * cols;
  T* dx = args.dx.data<T>() + r * cols;
  const W* w = args.weight.data<W>();
  const float mean = args.mean.data<float>()[r], rstd = args.rstd.data<float>()[r];
  for (int64_t c = 0; c < cols; ++c) {
    const double xhat = (ToFloat(x[c]) - mean) * rstd;
    const double g = static_cast<double>(ToFloat(dy[c])) * ToFloat(w[c]);
    dx[c] = FromFloat<T>(static_cast<float>(rstd * (g - mean_g - xhat * mean_g_xhat)));
  }
}

// dweight += sum_r dy * xhat, dbias += sum_r dy. Rows are read contiguously in fixed blocks,
// each block's per-column partial sums kept in double, then the blocks added in order: cache
// friendly, and the same result for any thread count.
template <typename T>
void ParamGrads(const ops::LayerNormBackwardArgs& args) {
  constexpr int64_t kRowsPerBlock = 64;
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const T* x = args.x.data<T>();
  const T* dy = args.dy.data<T>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  // [blocks, 2, cols]: per block, the dweight partials then the dbias partials.
  std::vector<double> partial(blocks * 2 * cols, 0.0);
  ParallelFor(blocks, 4 * kRowsPerBlock * cols, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      double* sum_w = partial.data() + block * 2 * cols;
      double* sum_b = sum_w + cols;
      for (int64_t r = block * kRowsPerBlock; r < std::min(rows, (block + 1) * kRowsPerBlock);
           ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const double g = ToFloat(dy[r * cols + c]);
          sum_w[c] += g * ((ToFloat(x[r * cols + c]) - mean[r]) * rstd[r]);
          sum_b[c] += g;
        }
      }
    }
  });
  float* dw = args.dweight.data<float>();
  float* db = args.dbias.data<float>();
  for (int64_t c = 0; c < cols; ++c) {
    double sum_w = 0.0, sum_b = 0.0;
    for (int64_t block = 0; block < blocks; ++block) {
      sum_w += partial[block * 2 * cols + c];
      sum_b += partial[block * 2 * cols + cols + c];
    }
    dw[c] += static_cast<float>(sum_w);
    db[c] += static_cast<float>(sum_b);
  }
}

}  // namespace

absl::Status CpuBackend::LayerNormForward(const ops::LayerNormArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    const T* x = args.x.data<T>();
    float* mean = args.mean.data<float>();
    float* rstd = args.rstd.data<float>();
    ParallelFor(ops::Rows(args.x), 6 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        // Two passes (mean, then centred squares): exact for rows with a large mean.
        const T* row = x + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) sum += ToFloat(row[c]);
        const double mu = cols > 0 ? sum / cols : 0.0;
        double squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          const double d = ToFloat(row[c]) - mu;
          squares += d * d;
        }
        const double var = cols > 0 ? squares / cols : 0.0;
        mean[r] = static_cast<float>(mu);
        rstd[r] = static_cast<float>(1.0 / std::sqrt(var + args.eps));
      }
      Normalize<T, W>(args, begin, end);
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormPartialStats(const Tensor& x, const Tensor& stats) {
  const int64_t cols = ops::Cols(x);
  double* out = stats.data<double>();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    ParallelFor(ops::Rows(x), 3 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        double sum = 0.0, squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          const double v = ToFloat(px[r * cols + c]);
          sum += v;
          squares += v * v;
        }
        out[2 * r] = sum;
        out[2 * r + 1] = squares;
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForwardFromStats(const ops::LayerNormArgs& args,
                                                   const Tensor& stats, int64_t total_cols) {
  const double* s = stats.data<double>();
  float* mean = args.mean.data<float>();
  float* rstd = args.rstd.data<float>();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    ParallelFor(ops::Rows(args.x), 4 * ops::Cols(args.x), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const double mu = s[2 * r] / total_cols;
        // E[x^2] - mean^2 can come out slightly negative from rounding: clamp at 0.
        const double var = std::max(0.0, s[2 * r + 1] / total_cols - mu * mu);
        mean[r] = static_cast<float>(mu);
        rstd[r] = static_cast<float>(1.0 / std::sqrt(var + args.eps));
      }
      Normalize<T, W>(args, begin, end);
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(const ops::LayerNormBackwardArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    ParallelFor(ops::Rows(args.x), 8 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto [sum_g, sum_g_xhat] = BackwardRowSums<T, W>(args, r);
        InputGradRow<T, W>(args, r, sum_g / cols, sum_g_xhat / cols);
      }
    });
    ParamGrads<T>(args);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackwardPartialSums(const ops::LayerNormBackwardArgs& args,
                                                      const Tensor& sums) {
  float* out = sums.data<float>();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    ParallelFor(ops::Rows(args.x), 4 * ops::Cols(args.x), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto [sum_g, sum_g_xhat] = BackwardRowSums<T, W>(args, r);
        out[2 * r] = static_cast<float>(sum_g);
        out[2 * r + 1] = static_cast<float>(sum_g_xhat);
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackwardFromSums(const ops::LayerNormBackwardArgs& args,
                                                   const Tensor& sums, int64_t total_cols) {
  const float* s = sums.data<float>();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    ParallelFor(ops::Rows(args.x), 4 * ops::Cols(args.x), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        InputGradRow<T, W>(args, r, static_cast<double>(s[2 * r]) / total_cols,
                           static_cast<double>(s[2 * r + 1]) / total_cols);
      }
    });
    ParamGrads<T>(args);
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
