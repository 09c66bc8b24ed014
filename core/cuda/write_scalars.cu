#include "core/cuda/write_scalars.h"

#include "core/cuda/launch.cuh"

namespace nf::cuda {
namespace {

__global__ void WriteInt64PairKernel(int64_t* dst, int64_t first, int64_t second) {
  dst[0] = first;
  dst[1] = second;
}

}  // namespace

cudaError_t WriteInt64Pair(cudaStream_t stream, int64_t* dst, int64_t first, int64_t second) {
  Launch<WriteInt64PairKernel>({1, 1, 0, stream}, dst, first, second);
  return cudaGetLastError();
}

}  // namespace nf::cuda
