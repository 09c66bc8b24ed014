// Small values into device memory without the host waiting: the values travel as a kernel's
// arguments, so no host buffer has to outlive the call (a cudaMemcpyAsync from pageable memory
// may wait for the stream first).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nf::cuda {

// dst[0] = first, dst[1] = second, in order on `stream`; the launch's error.
cudaError_t WriteInt64Pair(cudaStream_t stream, int64_t* dst, int64_t first, int64_t second);

}  // namespace nf::cuda
