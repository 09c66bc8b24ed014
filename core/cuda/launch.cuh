// The one way core/cuda launches a kernel, so that the nvcc build and the emulated build
// (NF_CUDA_EMULATION: the same sources compiled by the host compiler and run on the emulated
// GPU of tests/emulation) share every kernel's source:
//
//   Launch<AddBiasKernel<T, B>>({GridFor(n), kThreads, 0, stream()}, x, bias, n, cols);
//
// is nvcc's Launch<AddBiasKernel<T, B>>({grid, block, shared bytes, stream}, ...). LaunchShape
// keeps where the launch is written, which the emulator's reports name. Kernels that need dynamic
// shared memory declare it with NF_DYNAMIC_SHARED(type, name) instead of `extern __shared__`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <source_location>
#include <utility>

namespace nf::cuda {

struct LaunchShape {
  LaunchShape(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
              std::source_location where = std::source_location::current())
      : grid(grid), block(block), shared_bytes(shared_bytes), stream(stream), where(where) {}

  dim3 grid, block;
  size_t shared_bytes;  // dynamic shared memory per block
  cudaStream_t stream;
  std::source_location where;
};

template <auto Kernel, typename... Args>
void Launch(const LaunchShape& shape, Args&&... args) {
#if NF_CUDA_EMULATION
  NfEmulatedLaunch<Kernel>(shape.grid, shape.block, shape.shared_bytes, shape.stream, shape.where,
                           std::forward<Args>(args)...);
#else
  // clang-format would split the chevrons into "> > >", which nvcc does not parse.
  // clang-format off
  Kernel<<<shape.grid, shape.block, shape.shared_bytes, shape.stream>>>(std::forward<Args>(args)...);
  // clang-format on
#endif
}

}  // namespace nf::cuda

#if NF_CUDA_EMULATION
#define NF_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::nf::emu::DynamicSharedMemory())
#else
#define NF_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
