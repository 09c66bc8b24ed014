// Per-channel scaling and the head layout permutation on the CPU.
#include <algorithm>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/elementwise_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/ops/composed_ops.h"

namespace nf::cpu {
namespace {

// Column blocks of the scale gradient's sums: one Elementwise().sum_rows_product call each.
constexpr int64_t kColumnBlock = 64;

// y = x * scale[channel] for fp32 x, y [outer, channels, inner] (y may be x): rows of channels
// for inner = 1 (NormFormer's residual scale), else one scaled run of `inner` per (outer,
// channel) block (its head scales).
void ScaleChannelsF32(const float* x, const float* scale, int64_t outer, int64_t channels,
                      int64_t inner, float* y) {
  const ElementwiseKernels& kernels = Elementwise();
  if (inner == 1) {
    ParallelFor(outer, channels, [&](int64_t begin, int64_t end) {
      kernels.scale_columns(x + begin * channels, scale, y + begin * channels, end - begin,
                            channels);
    });
    return;
  }
  ParallelFor(outer * channels, inner, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      kernels.scale(x + block * inner, scale[block % channels], y + block * inner, inner);
    }
  });
}

// dscale[c] += sum over (outer, inner) of dy * x at channel c, fp32 inputs, in double (each
// product exact). Deterministic for any thread count: the sums run over the [outer, channels *
// inner] matrices column by column, each column over the rows in order (sum_rows_product).
// For inner = 1 the columns are the channels, so each channel is the scalar loop's sum over
// outer in order; otherwise a channel's inner columns are taken in parts of up to 64, a part's
// column sums added in column order and the parts in order.
void ScaleGradientF32(const float* x, const float* dy, int64_t outer, int64_t channels,
                      int64_t inner, float* dscale) {
  const ElementwiseKernels& kernels = Elementwise();
  const int64_t cols = channels * inner;
  // Column sums of columns [first, first + width), width <= kColumnBlock, into sums.
  const auto column_sums = [&](int64_t first, int64_t width, double* sums) {
    std::fill_n(sums, width, 0.0);
    kernels.sum_rows_product(dy + first, x + first, outer, width, cols, sums);
  };
  if (inner == 1) {
    ParallelFor((channels + kColumnBlock - 1) / kColumnBlock, 2 * outer * kColumnBlock,
                [&](int64_t begin, int64_t end) {
                  double sums[kColumnBlock];
                  for (int64_t block = begin; block < end; ++block) {
                    const int64_t first = block * kColumnBlock;
                    const int64_t width = std::min(kColumnBlock, channels - first);
                    column_sums(first, width, sums);
                    for (int64_t c = 0; c < width; ++c) {
                      dscale[first + c] += static_cast<float>(sums[c]);
                    }
                  }
                });
    return;
  }
  const int64_t parts = (inner + kColumnBlock - 1) / kColumnBlock;
  std::vector<double> part_sums(channels * parts);
  ParallelFor(channels * parts, 2 * outer * kColumnBlock, [&](int64_t begin, int64_t end) {
    double sums[kColumnBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t part = task % parts, offset = part * kColumnBlock;
      const int64_t width = std::min(kColumnBlock, inner - offset);
      column_sums((task / parts) * inner + offset, width, sums);
      double sum = 0.0;
      for (int64_t c = 0; c < width; ++c) sum += sums[c];
      part_sums[task] = sum;
    }
  });
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0.0;
    for (int64_t part = 0; part < parts; ++part) sum += part_sums[c * parts + part];
    dscale[c] += static_cast<float>(sum);
  }
}

// Copies between [batch, seq, groups, heads, dim] (token order) and [groups, batch, heads, seq,
// dim]; a 4-D side is one group.
template <typename T>
void PermuteHeads(const Tensor& head_side, const T* src, T* dst, bool to_heads) {
  const int rank = head_side.rank();
  const int64_t groups = rank == 5 ? head_side.dim(0) : 1;
  const int64_t batch = head_side.dim(rank - 4), heads = head_side.dim(rank - 3);
  const int64_t seq = head_side.dim(rank - 2), dim = head_side.dim(rank - 1);
  ParallelFor(batch * seq, groups * heads * dim, [&](int64_t begin, int64_t end) {
    for (int64_t token = begin; token < end; ++token) {
      const int64_t b = token / seq, s = token % seq;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t token_index = ((token * groups + g) * heads + h) * dim;
          const int64_t head_index = (((g * batch + b) * heads + h) * seq + s) * dim;
          const T* from = src + (to_heads ? token_index : head_index);
          std::copy(from, from + dim, dst + (to_heads ? head_index : token_index));
        }
      }
    }
  });
}

}  // namespace

absl::Status CpuBackend::ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner,
                                       const Tensor& y) {
  const int64_t channels = scale.numel();
  // Nothing to scale; inner is 0 when MergeScaledHeads composes this for heads of head_dim 0,
  // and x.numel() / (channels * inner) would divide by zero.
  if (x.numel() == 0) return absl::OkStatus();
  if (x.dtype() == DType::kF32 && scale.dtype() == DType::kF32) {
    ScaleChannelsF32(x.data<float>(), scale.data<float>(), x.numel() / (channels * inner), channels,
                     inner, y.data<float>());
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(scale.dtype(), [&]<typename S>() {
      const T* px = x.data<T>();
      const S* ps = scale.data<S>();
      T* py = y.data<T>();
      ParallelFor(x.numel(), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          py[i] = FromFloat<T>(ToFloat(px[i]) * ToFloat(ps[(i / inner) % channels]));
        }
      });
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                               const Tensor& dy, const Tensor& dx,
                                               const Tensor& dscale) {
  const int64_t channels = scale.numel();
  // Nothing to scale and no gradient; inner is 0 when MergeScaledHeadsBackward composes this
  // for heads of no tokens (seq * head_dim), and the division below would trap.
  if (x.numel() == 0) return absl::OkStatus();
  const int64_t outer = x.numel() / (channels * inner);
  float* ds = dscale.data<float>();
  if (x.dtype() == DType::kF32 && scale.dtype() == DType::kF32) {
    // The scale gradient first: dx may overwrite dy.
    ScaleGradientF32(x.data<float>(), dy.data<float>(), outer, channels, inner, ds);
    ScaleChannelsF32(dy.data<float>(), scale.data<float>(), outer, channels, inner,
                     dx.data<float>());
    return absl::OkStatus();
  }
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(scale.dtype(), [&]<typename S>() {
      const T* px = x.data<T>();
      const T* pdy = dy.data<T>();
      const S* ps = scale.data<S>();
      T* pdx = dx.data<T>();
      // The scale gradient first (dx may overwrite dy): per channel, outer and inner in order.
      ParallelFor(channels, 2 * outer * inner, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          double sum = 0.0;
          for (int64_t o = 0; o < outer; ++o) {
            const int64_t base = (o * channels + c) * inner;
            for (int64_t i = 0; i < inner; ++i) {
              sum += static_cast<double>(ToFloat(pdy[base + i])) * ToFloat(px[base + i]);
            }
          }
          ds[c] += static_cast<float>(sum);
        }
      });
      ParallelFor(x.numel(), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          pdx[i] = FromFloat<T>(ToFloat(pdy[i]) * ToFloat(ps[(i / inner) % channels]));
        }
      });
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SplitHeads(const Tensor& tokens, const Tensor& heads) {
  DispatchFloat(tokens.dtype(), [&]<typename T>() {
    PermuteHeads<T>(heads, tokens.data<T>(), heads.data<T>(), /*to_heads=*/true);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::MergeHeads(const Tensor& heads, const Tensor& tokens) {
  DispatchFloat(tokens.dtype(), [&]<typename T>() {
    PermuteHeads<T>(heads, heads.data<T>(), tokens.data<T>(), /*to_heads=*/false);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::MergeScaledHeads(const Tensor& heads, const Tensor& scale,
                                          const Tensor& tokens) {
  if (heads.dtype() != DType::kF32 || scale.dtype() != DType::kF32) {
    return ops::ComposedMergeScaledHeads(*this, heads, scale, tokens);
  }
  const int64_t batch = heads.dim(0), count = heads.dim(1), seq = heads.dim(2);
  const int64_t dim = heads.dim(3);
  const float* from = heads.data<float>();
  const float* s = scale.data<float>();
  float* to = tokens.data<float>();
  const ElementwiseKernels& kernels = Elementwise();
  ParallelFor(batch * seq, count * dim, [&](int64_t begin, int64_t end) {
    for (int64_t token = begin; token < end; ++token) {
      const int64_t b = token / seq, pos = token % seq;
      for (int64_t h = 0; h < count; ++h) {
        kernels.scale(from + ((b * count + h) * seq + pos) * dim, s[h],
                      to + (token * count + h) * dim, dim);
      }
    }
  });
  return absl::OkStatus();
}

// Per (batch, head) block of d_heads [seq, head_dim]: the block's unscaled gradient gathered from
// the token side, its dot with the head's activations in double (column sums over seq, then the
// columns in order), then the block scaled in place while it is in cache. The blocks' dots are
// added over the batch in order: the same bits for any thread count.
absl::Status CpuBackend::MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                                  const Tensor& scale, const Tensor& d_heads,
                                                  const Tensor& dscale) {
  if (heads.dtype() != DType::kF32 || scale.dtype() != DType::kF32) {
    return ops::ComposedMergeScaledHeadsBackward(*this, d_tokens, heads, scale, d_heads, dscale);
  }
  const int64_t batch = heads.dim(0), count = heads.dim(1), seq = heads.dim(2);
  const int64_t dim = heads.dim(3), block = seq * dim;
  const float* dt = d_tokens.data<float>();
  const float* act = heads.data<float>();
  const float* s = scale.data<float>();
  float* dh = d_heads.data<float>();
  const ElementwiseKernels& kernels = Elementwise();
  std::vector<double> block_dots(batch * count);
  ParallelFor(batch * count, 4 * block, [&](int64_t begin, int64_t end) {
    std::vector<double> column_sums(dim);
    for (int64_t task = begin; task < end; ++task) {  // task = b * count + h
      const int64_t b = task / count, h = task % count;
      float* out = dh + task * block;
      for (int64_t pos = 0; pos < seq; ++pos) {
        const float* row = dt + ((b * seq + pos) * count + h) * dim;
        std::copy(row, row + dim, out + pos * dim);
      }
      std::fill(column_sums.begin(), column_sums.end(), 0.0);
      kernels.sum_rows_product(out, act + task * block, seq, dim, dim, column_sums.data());
      double dot = 0.0;
      for (const double sum : column_sums) dot += sum;
      block_dots[task] = dot;
      kernels.scale(out, s[h], out, block);
    }
  });
  float* ds = dscale.data<float>();
  for (int64_t h = 0; h < count; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < batch; ++b) sum += block_dots[b * count + h];
    ds[h] += static_cast<float>(sum);
  }
  return absl::OkStatus();
}

}  // namespace nf::cpu
