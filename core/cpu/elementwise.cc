// Elementwise and per-column CPU kernels: bias, activations, dropout, casts, fills, BLAS-1.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/cpu/activation_rows.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/elementwise_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/philox.h"

namespace nf::cpu {
namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

// The scalar activations of the fp16 / bf16 paths (fp32 runs the vectorised kernels).
float Activate(ops::Activation act, float x) {
  switch (act) {
    case ops::Activation::kGelu:
      return 0.5f * x * (1.0f + std::erf(x * kSqrtHalf));
    case ops::Activation::kGeluTanh:
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
    case ops::Activation::kReluSquared:
      return x > 0.0f ? x * x : 0.0f;
  }
  return 0.0f;
}

float ActivationDerivative(ops::Activation act, float x) {
  switch (act) {
    case ops::Activation::kGelu: {
      const float cdf = 0.5f * (1.0f + std::erf(x * kSqrtHalf));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case ops::Activation::kGeluTanh: {
      const float inner = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
      const float t = std::tanh(inner);
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
    }
    case ops::Activation::kReluSquared:
      return x > 0.0f ? 2.0f * x : 0.0f;
  }
  return 0.0f;
}

// Applies fn(i) for every element index, in parallel.
template <typename F>
void ForEachElement(int64_t n, int64_t flops_per_element, F&& fn) {
  ParallelFor(n, flops_per_element, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

}  // namespace

const ActivationKernels& ActivationKernelsOf(ops::Activation act) {
  switch (act) {
    case ops::Activation::kGelu:
      return Elementwise().gelu;
    case ops::Activation::kGeluTanh:
      return Elementwise().gelu_tanh;
    case ops::Activation::kReluSquared:
      break;
  }
  return Elementwise().relu_squared;
}

// A GELU's ~40 operations on 16 lanes take about as long as 8 scalar flops (~1 ns at AVX-512),
// ReLU^2 is as cheap as a bias add.
int64_t ActivationCost(ops::Activation act) { return act == ops::Activation::kReluSquared ? 1 : 8; }

DropoutRowArgs DropoutRowOf(const ops::DropoutSpec& spec, int64_t r) {
  return {.seed = spec.seed,
          .site = spec.site,
          .sample = spec.first_sample + (spec.token_offset + r) / spec.seq_len,
          .head = 0,
          .row = static_cast<uint64_t>((spec.token_offset + r) % spec.seq_len),
          .first_col = static_cast<uint64_t>(spec.col_offset),
          .threshold = DropoutThreshold(spec.p),
          .keep_scale = 1.0f / (1.0f - spec.p)};
}

absl::Status CpuBackend::AddBias(const Tensor& x, const Tensor& bias) {
  const int64_t rows = ops::Rows(x), cols = ops::Cols(x);
  if (x.dtype() == DType::kF32 && bias.dtype() == DType::kF32) {
    ParallelFor(rows, cols, [&](int64_t begin, int64_t end) {
      Elementwise().add_bias(x.data<float>() + begin * cols, bias.data<float>(), end - begin, cols);
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(bias.dtype(), [&]<typename B>() {
      T* px = x.data<T>();
      const B* pb = bias.data<B>();
      ForEachElement(x.numel(), 1, [&](int64_t i) {
        px[i] = FromFloat<T>(ToFloat(px[i]) + ToFloat(pb[i % cols]));
      });
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasBackward(const Tensor& dy, const Tensor& dbias) {
  const int64_t rows = ops::Rows(dy), cols = ops::Cols(dy);
  float* db = dbias.data<float>();
  if (dy.dtype() == DType::kF32) {
    // Parallel over blocks of 64 columns; each column sums its rows in order in double, so the
    // result is the scalar loop's, for any thread count.
    constexpr int64_t kBlock = 64;
    ParallelFor((cols + kBlock - 1) / kBlock, rows * kBlock, [&](int64_t begin, int64_t end) {
      double sums[kBlock];
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kBlock, width = std::min(kBlock, cols - first);
        std::fill_n(sums, width, 0.0);
        Elementwise().sum_rows(dy.data<float>() + first, rows, width, cols, sums);
        for (int64_t c = 0; c < width; ++c) db[first + c] += static_cast<float>(sums[c]);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(dy.dtype(), [&]<typename T>() {
    const T* g = dy.data<T>();
    // Parallel over columns; each column sums its rows in order (deterministic).
    ParallelFor(cols, rows, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double sum = 0.0;
        for (int64_t r = 0; r < rows; ++r) sum += ToFloat(g[r * cols + c]);
        db[c] += static_cast<float>(sum);
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ActivationForward(ops::Activation act, const Tensor& x, const Tensor& y) {
  if (x.dtype() == DType::kF32) {
    const ActivationKernels& kernels = ActivationKernelsOf(act);
    ParallelFor(x.numel(), ActivationCost(act), [&](int64_t begin, int64_t end) {
      kernels.forward(x.data<float>() + begin, y.data<float>() + begin, end - begin);
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    ForEachElement(x.numel(), 20,
                   [&](int64_t i) { py[i] = FromFloat<T>(Activate(act, ToFloat(px[i]))); });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ActivationBackward(ops::Activation act, const Tensor& x, const Tensor& dy,
                                            const Tensor& dx) {
  if (x.dtype() == DType::kF32) {
    const ActivationKernels& kernels = ActivationKernelsOf(act);
    ParallelFor(x.numel(), ActivationCost(act) + 1, [&](int64_t begin, int64_t end) {
      kernels.backward(x.data<float>() + begin, dy.data<float>() + begin, dx.data<float>() + begin,
                       end - begin);
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    ForEachElement(x.numel(), 30, [&](int64_t i) {
      pdx[i] = FromFloat<T>(ToFloat(pdy[i]) * ActivationDerivative(act, ToFloat(px[i])));
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Dropout(const Tensor& x, const Tensor& y, const ops::DropoutSpec& spec) {
  if (spec.p == 0.0f) return Cast(x, y);
  const int64_t rows = ops::Rows(x), cols = ops::Cols(x);
  const uint32_t threshold = DropoutThreshold(spec.p);
  const float keep_scale = 1.0f / (1.0f - spec.p);
  if (x.dtype() == DType::kF32) {
    ParallelFor(rows, cols * 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        Elementwise().dropout_row(DropoutRowOf(spec, r), x.data<float>() + r * cols,
                                  y.data<float>() + r * cols, cols);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    ParallelFor(rows, cols * 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const uint64_t sample = spec.first_sample + (spec.token_offset + r) / spec.seq_len;
        const uint64_t position = (spec.token_offset + r) % spec.seq_len;
        PhiloxCounter words{};
        for (int64_t c = 0; c < cols; ++c) {
          const uint64_t col = spec.col_offset + c;
          if (c == 0 || (col & 3) == 0) {
            words = DropoutWords(spec.seed, spec.site, sample, 0, position, col);
          }
          const bool keep = words[col & 3] >= threshold;
          const int64_t i = r * cols + c;
          py[i] = FromFloat<T>(keep ? ToFloat(px[i]) * keep_scale : 0.0f);
        }
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() != dst.raw_data())
      std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
    return absl::OkStatus();
  }
  DispatchFloat(src.dtype(), [&]<typename S>() {
    DispatchFloat(dst.dtype(), [&]<typename D>() {
      const S* ps = src.data<S>();
      D* pd = dst.data<D>();
      ForEachElement(src.numel(), 1, [&](int64_t i) { pd[i] = FromFloat<D>(ToFloat(ps[i])); });
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Copy(const Tensor& src, const Tensor& dst) { return Cast(src, dst); }

absl::Status CpuBackend::Fill(const Tensor& x, float value) {
  auto fill = [&]<typename T>(T v) {
    T* p = x.data<T>();
    ForEachElement(x.numel(), 1, [&](int64_t i) { p[i] = v; });
  };
  switch (x.dtype()) {
    case DType::kF32:
      fill(value);
      break;
    case DType::kF16:
      fill(FromFloat<Half>(value));
      break;
    case DType::kBF16:
      fill(FromFloat<BFloat16>(value));
      break;
    case DType::kI32:
      fill(static_cast<int32_t>(value));
      break;
    case DType::kI64:
      fill(static_cast<int64_t>(value));
      break;
    case DType::kU16:
      fill(static_cast<uint16_t>(value));
      break;
    case DType::kU8:
      fill(static_cast<uint8_t>(value));
      break;
    case DType::kF64:
      fill(static_cast<double>(value));
      break;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(const Tensor& x, float alpha) {
  if (x.dtype() == DType::kF32) {
    float* p = x.data<float>();
    ParallelFor(x.numel(), 1, [&](int64_t begin, int64_t end) {
      Elementwise().scale(p + begin, alpha, p + begin, end - begin);
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    T* p = x.data<T>();
    ForEachElement(x.numel(), 1, [&](int64_t i) { p[i] = FromFloat<T>(alpha * ToFloat(p[i])); });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Axpy(float alpha, const Tensor& x, const Tensor& y) {
  if (x.dtype() == DType::kF32 && y.dtype() == DType::kF32) {
    ParallelFor(x.numel(), 2, [&](int64_t begin, int64_t end) {
      Elementwise().axpy(alpha, x.data<float>() + begin, y.data<float>() + begin, end - begin);
    });
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename X>() {
    DispatchFloat(y.dtype(), [&]<typename Y>() {
      const X* px = x.data<X>();
      Y* py = y.data<Y>();
      ForEachElement(x.numel(), 2, [&](int64_t i) {
        py[i] = FromFloat<Y>(ToFloat(py[i]) + alpha * ToFloat(px[i]));
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
