// Per-channel scaling (NormFormer's head and residual scales) and the head layout permutation
// on the GPU.
#include "core/cuda/column_sums.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"
#include "core/ops/composed_ops.h"

namespace nf::cuda {
namespace {

template <typename T, typename S>
__global__ void ScaleChannelsKernel(const T* x, const S* scale, int64_t inner, int64_t channels,
                                    T* y, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) {
    y[i] = FromFloat<T>(ToFloat(x[i]) * ToFloat(scale[(i / inner) % channels]));
  }
}

// dscale[c] += sum over outer and inner of dy * x, one block per channel: the head scales have
// few channels, each summing batch * seq * head_dim products.
template <typename T>
__global__ void ChannelGradPerBlock(const T* x, const T* dy, int64_t outer, int64_t channels,
                                    int64_t inner, float* dscale) {
  __shared__ float scratch[32];
  const int64_t c = blockIdx.x;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < outer * inner; j += blockDim.x) {
    const int64_t i = ((j / inner) * channels + c) * inner + j % inner;
    sum += ToFloat(dy[i]) * ToFloat(x[i]);
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) dscale[c] += sum;
}

// With inner == 1 (the residual scale, one channel per feature) x is [outer, channels]: a
// column sum.
template <typename T>
struct ProductValue {
  const T* x;
  const T* dy;
  int64_t cols;
  __device__ Values<1> operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return {{ToFloat(dy[i]) * ToFloat(x[i])}};
  }
};

// Copies between [batch, seq, groups, heads, dim] (token order) and [groups, batch, heads, seq,
// dim]; one thread per element of the destination.
template <typename T>
__global__ void PermuteHeadsKernel(const T* src, T* dst, int64_t groups, int64_t batch,
                                   int64_t heads, int64_t seq, int64_t dim, bool to_heads) {
  const int64_t n = groups * batch * heads * seq * dim;
  NF_GRID_STRIDE_LOOP(i, n) {
    const int64_t d = i % dim;
    int64_t rest = i / dim;
    if (to_heads) {  // i indexes [g, b, h, s, d]
      const int64_t s = rest % seq;
      rest /= seq;
      const int64_t h = rest % heads;
      rest /= heads;
      const int64_t b = rest % batch, g = rest / batch;
      dst[i] = src[(((b * seq + s) * groups + g) * heads + h) * dim + d];
    } else {  // i indexes [b, s, g, h, d]
      const int64_t h = rest % heads;
      rest /= heads;
      const int64_t g = rest % groups;
      rest /= groups;
      const int64_t s = rest % seq, b = rest / seq;
      dst[i] = src[(((g * batch + b) * heads + h) * seq + s) * dim + d];
    }
  }
}

// An element's coordinates in heads [batch, heads, seq, dim] (one group), the shape the scaled
// merge takes, and its flat index in that layout and in token order [batch, seq, heads, dim].
struct HeadElement {
  int64_t b, h, s, d;
};

struct HeadShape {
  int64_t batch, heads, seq, dim;
  __device__ int64_t numel() const { return batch * heads * seq * dim; }
  __device__ int64_t HeadIndex(HeadElement e) const {
    return ((e.b * heads + e.h) * seq + e.s) * dim + e.d;
  }
  __device__ int64_t TokenIndex(HeadElement e) const {
    return ((e.b * seq + e.s) * heads + e.h) * dim + e.d;
  }
  __device__ HeadElement AtHeadIndex(int64_t i) const {
    const int64_t d = i % dim, s = (i / dim) % seq, rest = i / (dim * seq);
    return {rest / heads, rest % heads, s, d};
  }
  __device__ HeadElement AtTokenIndex(int64_t i) const {
    const int64_t d = i % dim, h = (i / dim) % heads, rest = i / (dim * heads);
    return {rest / seq, h, rest % seq, d};
  }
};

// dst = src moved between the two layouts, head h's values times scale[h]: into token order
// (to_heads false: the composition's MergeHeads then ScaleChannels) or into heads (the
// backward's SplitHeads then ScaleChannels); one thread per element of dst.
template <typename T, typename S>
__global__ void PermuteScaledHeadsKernel(const T* src, const S* scale, T* dst, HeadShape shape,
                                         bool to_heads) {
  NF_GRID_STRIDE_LOOP(i, shape.numel()) {
    const HeadElement e = to_heads ? shape.AtHeadIndex(i) : shape.AtTokenIndex(i);
    const int64_t from = to_heads ? shape.TokenIndex(e) : shape.HeadIndex(e);
    dst[i] = FromFloat<T>(ToFloat(src[from]) * ToFloat(scale[e.h]));
  }
}

// dscale[h] += sum of d_tokens * heads over head h's elements, one block per head, read straight
// from the token layout: the same products in the same order as ChannelGradPerBlock over the
// split d_tokens, so the same sum bit for bit (launch with kThreads, as that kernel).
template <typename T>
__global__ void HeadScaleGradKernel(const T* heads, const T* d_tokens, HeadShape shape,
                                    float* dscale) {
  __shared__ float scratch[32];
  const int64_t h = blockIdx.x, per_head = shape.seq * shape.dim;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < shape.batch * per_head; j += blockDim.x) {
    const HeadElement e{j / per_head, h, (j % per_head) / shape.dim, j % shape.dim};
    sum += ToFloat(d_tokens[shape.TokenIndex(e)]) * ToFloat(heads[shape.HeadIndex(e)]);
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) dscale[h] += sum;
}

template <typename T>
absl::Status PermuteScaledHeads(cudaStream_t stream, const Tensor& src, const Tensor& scale,
                                const Tensor& dst, HeadShape shape, bool to_heads) {
  DispatchFloat(scale.dtype(), [&]<typename S>() {
    Launch<PermuteScaledHeadsKernel<T, S>>({GridFor(src.numel()), kThreads, 0, stream},
                                           DevicePtr<T>(src), DevicePtr<S>(scale),
                                           DevicePtr<T>(dst), shape, to_heads);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

HeadShape HeadShapeOf(const Tensor& heads) {
  return {heads.dim(0), heads.dim(1), heads.dim(2), heads.dim(3)};
}

template <typename T>
absl::Status PermuteHeads(cudaStream_t stream, const Tensor& head_side, const T* src, T* dst,
                          bool to_heads) {
  const int64_t n = head_side.numel();
  if (n == 0) return absl::OkStatus();
  const int rank = head_side.rank();  // 5: [groups, batch, heads, seq, dim]; 4: one group
  Launch<PermuteHeadsKernel<T>>({GridFor(n), kThreads, 0, stream}, src, dst,
                                rank == 5 ? head_side.dim(0) : 1, head_side.dim(rank - 4),
                                head_side.dim(rank - 3), head_side.dim(rank - 2),
                                head_side.dim(rank - 1), to_heads);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner,
                                        const Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(scale.dtype(), [&]<typename S>() {
      Launch<ScaleChannelsKernel<T, S>>({GridFor(n), kThreads, 0, stream()}, DevicePtr<T>(x),
                                        DevicePtr<S>(scale), inner, scale.numel(), DevicePtr<T>(y),
                                        n);
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                                const Tensor& dy, const Tensor& dx,
                                                const Tensor& dscale) {
  const int64_t channels = scale.numel();
  if (x.numel() == 0) return absl::OkStatus();
  const int64_t outer = x.numel() / (channels * inner);
  // The scale gradient first: dx may overwrite dy.
  NF_RETURN_IF_ERROR(DispatchFloat(x.dtype(), [&]<typename T>() -> absl::Status {
    if (inner == 1) {
      return AddColumnSums<1>(context_, outer, channels,
                              ProductValue<T>{DevicePtr<T>(x), DevicePtr<T>(dy), channels},
                              Outputs<1>{{dscale.data<float>()}});
    }
    Launch<ChannelGradPerBlock<T>>({static_cast<unsigned int>(channels), kThreads, 0, stream()},
                                   DevicePtr<T>(x), DevicePtr<T>(dy), outer, channels, inner,
                                   dscale.data<float>());
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  }));
  return ScaleChannels(dy, scale, inner, dx);
}

absl::Status CudaBackend::SplitHeads(const Tensor& tokens, const Tensor& heads) {
  return DispatchFloat(tokens.dtype(), [&]<typename T>() {
    return PermuteHeads<T>(stream(), heads, DevicePtr<T>(tokens), DevicePtr<T>(heads), true);
  });
}

absl::Status CudaBackend::MergeHeads(const Tensor& heads, const Tensor& tokens) {
  return DispatchFloat(tokens.dtype(), [&]<typename T>() {
    return PermuteHeads<T>(stream(), heads, DevicePtr<T>(heads), DevicePtr<T>(tokens), false);
  });
}

// The head scale fused with the permutation: one pass forward, two backward (the scale's gradient,
// then the scaled split) where the composition makes two and three. Grouped heads (rank 5) take
// the composition.
absl::Status CudaBackend::MergeScaledHeads(const Tensor& heads, const Tensor& scale,
                                           const Tensor& tokens) {
  if (heads.rank() != 4) return ops::ComposedMergeScaledHeads(*this, heads, scale, tokens);
  if (heads.numel() == 0) return absl::OkStatus();
  return DispatchFloat(heads.dtype(), [&]<typename T>() {
    return PermuteScaledHeads<T>(stream(), heads, scale, tokens, HeadShapeOf(heads), false);
  });
}

absl::Status CudaBackend::MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                                   const Tensor& scale, const Tensor& d_heads,
                                                   const Tensor& dscale) {
  if (heads.rank() != 4) {
    return ops::ComposedMergeScaledHeadsBackward(*this, d_tokens, heads, scale, d_heads, dscale);
  }
  if (heads.numel() == 0) return absl::OkStatus();
  const HeadShape shape = HeadShapeOf(heads);
  return DispatchFloat(heads.dtype(), [&]<typename T>() -> absl::Status {
    Launch<HeadScaleGradKernel<T>>({static_cast<unsigned int>(shape.heads), kThreads, 0, stream()},
                                   DevicePtr<T>(heads), DevicePtr<T>(d_tokens), shape,
                                   dscale.data<float>());
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return PermuteScaledHeads<T>(stream(), d_tokens, scale, d_heads, shape, true);
  });
}

}  // namespace nf::cuda
