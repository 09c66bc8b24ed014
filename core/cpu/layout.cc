// Per-channel scaling and the head layout permutation on the CPU.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

// Copies between [batch, seq, heads, dim] (token order) and [batch, heads, seq, dim].
template <typename T>
void PermuteHeads(const Tensor& four_d, const T* src, T* dst, bool to_heads) {
  const int64_t batch = four_d.dim(0), heads = four_d.dim(1), seq = four_d.dim(2);
  const int64_t dim = four_d.dim(3);
  ParallelFor(batch * seq, heads * dim, [&](int64_t begin, int64_t end) {
    for (int64_t token = begin; token < end; ++token) {
      const int64_t b = token / seq, s = token % seq;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t token_index = (token * heads + h) * dim;
        const int64_t head_index = ((b * heads + h) * seq + s) * dim;
        const T* from = src + (to_heads ? token_index : head_index);
        std::copy(from, from + dim, dst + (to_heads ? head_index : token_index));
      }
    }
  });
}

}  // namespace

absl::Status CpuBackend::ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner,
                                       const Tensor& y) {
  const int64_t channels = scale.numel();
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

absl::Status CpuBackend::ScaleChannelsBackward(const Tensor& x, const Tensor& scale,
                                               int64_t inner, const Tensor& dy, const Tensor& dx,
                                               const Tensor& dscale) {
  const int64_t channels = scale.numel();
  const int64_t outer = x.numel() / (channels * inner);
  float* ds = dscale.data<float>();
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

}  // namespace nf::cpu
