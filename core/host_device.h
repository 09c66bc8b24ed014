// NF_HOST_DEVICE marks the few header functions that CPU and CUDA kernels share (the Philox
// generator behind dropout masks), so one definition serves both and their results agree bit
// for bit. Outside nvcc it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define NF_HOST_DEVICE __host__ __device__
#else
#define NF_HOST_DEVICE
#endif
