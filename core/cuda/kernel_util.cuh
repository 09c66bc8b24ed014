// Helpers shared by the CUDA kernels (nvcc only): element types and their fp32 conversions,
// dtype dispatch, launch shapes and deterministic block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.cuh"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace nf::cuda {

// Arithmetic is fp32 whatever the storage type; conversions round to nearest even, as the CPU
// backend's (core/half.h) do.
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The device element pointer of a floating tensor as T (__half, __nv_bfloat16 or float); the
// op table has checked the dtype.
template <typename T>
T* DevicePtr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Calls f.template operator()<T>() with T the device type of a floating dtype.
template <typename F>
decltype(auto) DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF16:
      return f.template operator()<__half>();
    case DType::kBF16:
      return f.template operator()<__nv_bfloat16>();
    default:
      return f.template operator()<float>();
  }
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill any current GPU, never more
// than the work needs.
inline unsigned int GridFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

#define NF_GRID_STRIDE_LOOP(i, n)                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ double WarpSum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The sum of v over the block, returned to every thread. blockDim.x must be a multiple of 32
// (at most 1024); `scratch` holds 32 values. The order of additions depends only on the
// launch shape, so results repeat exactly.
template <typename V>
__device__ V BlockSum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  V total = lane < warps ? scratch[lane] : V(0);
  return WarpSum(total);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  return WarpMax(lane < warps ? scratch[lane] : -INFINITY);
}

}  // namespace nf::cuda
