// LayerNorm on the CPU, local and tensor-parallel. Both paths share the per-row normalisation
// (from mean and rstd) and the per-row input gradient (from the two row sums); they differ only
// in where the row statistics come from: this rank's columns, or sums all-reduced by the caller.
// fp32 x and weight run the vectorised row kernels (core/cpu/isa/norm_kernels.h); fp16 / bf16
// keep the scalar templates below.
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/norm_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/cpu/layer_norm_blocks.h"

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

// dweight += sum_r dy * xhat, dbias += sum_r dy (the fp16 / bf16 path).
template <typename T>
void ParamGrads(const ops::LayerNormBackwardArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  const T* x = args.x.data<T>();
  const T* dy = args.dy.data<T>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  ForEachRowWithParamGrads<double>(ops::Rows(args.x), cols, 4 * cols, args.dweight, args.dbias,
                                   [&](int64_t r, double* sum_w, double* sum_b) {
                                     for (int64_t c = 0; c < cols; ++c) {
                                       const double g = ToFloat(dy[r * cols + c]);
                                       sum_w[c] +=
                                           g * ((ToFloat(x[r * cols + c]) - mean[r]) * rstd[r]);
                                       sum_b[c] += g;
                                     }
                                   });
}

// The fp32 backward in one pass over the rows: per row, while it is in cache, the input
// gradient from the row's means (mean g, mean g * xhat) = row_means(r), then the row's share of
// the parameter gradients into its block's partials.
template <typename RowMeans>
void BackwardF32(const ops::LayerNormBackwardArgs& args, RowMeans&& row_means) {
  const NormKernels& kernels = Norm();
  const int64_t cols = ops::Cols(args.x);
  const float* x = args.x.data<float>();
  const float* dy = args.dy.data<float>();
  const float* w = args.weight.data<float>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  float* dx = args.dx.data<float>();
  ForEachRowWithParamGrads<float>(ops::Rows(args.x), cols, 12 * cols, args.dweight, args.dbias,
                                  [&](int64_t r, float* sum_w, float* sum_b) {
                                    const int64_t at = r * cols;
                                    const auto [mean_g, mean_g_xhat] = row_means(r);
                                    kernels.input_and_param_grad_row(
                                        x + at, dy + at, w, mean[r], rstd[r],
                                        static_cast<float>(mean_g), static_cast<float>(mean_g_xhat),
                                        cols, dx + at, sum_w, sum_b);
                                  });
}

// (sum g, sum g * xhat) of fp32 row r over this rank's columns.
std::pair<double, double> RowSumsF32(const ops::LayerNormBackwardArgs& args, int64_t r) {
  const int64_t cols = ops::Cols(args.x);
  double sums[2];
  Norm().backward_row_sums(args.x.data<float>() + r * cols, args.dy.data<float>() + r * cols,
                           args.weight.data<float>(), args.mean.data<float>()[r],
                           args.rstd.data<float>()[r], cols, sums);
  return {sums[0], sums[1]};
}

// mean[r], rstd[r] from all-reduced (sum x, sum x^2) pairs over total_cols columns.
void StatsFromSums(const double* s, int64_t begin, int64_t end, int64_t total_cols, float eps,
                   float* mean, float* rstd) {
  for (int64_t r = begin; r < end; ++r) {
    const double mu = s[2 * r] / total_cols;
    // E[x^2] - mean^2 can come out slightly negative from rounding: clamp at 0.
    const double var = std::max(0.0, s[2 * r + 1] / total_cols - mu * mu);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(var + eps));
  }
}

}  // namespace

absl::Status CpuBackend::LayerNormForward(const ops::LayerNormArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  if (UsesF32Kernels(args.x, args.weight)) {
    ParallelFor(ops::Rows(args.x), 6 * cols, [&](int64_t begin, int64_t end) {
      Norm().forward(args.x.data<float>() + begin * cols, args.weight.data<float>(),
                     args.bias.data<float>(), end - begin, cols, args.eps,
                     args.y.data<float>() + begin * cols, args.mean.data<float>() + begin,
                     args.rstd.data<float>() + begin);
    });
    return absl::OkStatus();
  }
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
  if (x.dtype() == DType::kF32) {
    ParallelFor(ops::Rows(x), 3 * cols, [&](int64_t begin, int64_t end) {
      Norm().partial_stats(x.data<float>() + begin * cols, end - begin, cols, out + 2 * begin);
    });
    return absl::OkStatus();
  }
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
  const int64_t cols = ops::Cols(args.x);
  if (UsesF32Kernels(args.x, args.weight)) {
    ParallelFor(ops::Rows(args.x), 4 * cols, [&](int64_t begin, int64_t end) {
      StatsFromSums(s, begin, end, total_cols, args.eps, mean, rstd);
      Norm().normalize(args.x.data<float>() + begin * cols, args.weight.data<float>(),
                       args.bias.data<float>(), mean + begin, rstd + begin, end - begin, cols,
                       args.y.data<float>() + begin * cols);
    });
    return absl::OkStatus();
  }
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    ParallelFor(ops::Rows(args.x), 4 * cols, [&](int64_t begin, int64_t end) {
      StatsFromSums(s, begin, end, total_cols, args.eps, mean, rstd);
      Normalize<T, W>(args, begin, end);
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(const ops::LayerNormBackwardArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  if (UsesF32Kernels(args.x, args.weight)) {
    BackwardF32(args, [&](int64_t r) {
      const auto [sum_g, sum_g_xhat] = RowSumsF32(args, r);
      return std::pair{sum_g / cols, sum_g_xhat / cols};
    });
    return absl::OkStatus();
  }
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
  if (UsesF32Kernels(args.x, args.weight)) {
    ParallelFor(ops::Rows(args.x), 4 * ops::Cols(args.x), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto [sum_g, sum_g_xhat] = RowSumsF32(args, r);
        out[2 * r] = static_cast<float>(sum_g);
        out[2 * r + 1] = static_cast<float>(sum_g_xhat);
      }
    });
    return absl::OkStatus();
  }
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
  if (UsesF32Kernels(args.x, args.weight)) {
    BackwardF32(args, [&](int64_t r) {
      return std::pair{static_cast<double>(s[2 * r]) / total_cols,
                       static_cast<double>(s[2 * r + 1]) / total_cols};
    });
    return absl::OkStatus();
  }
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
