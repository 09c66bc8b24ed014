// Helpers for the gpu-labelled tests: each CUDA op runs on the same inputs as its CPU twin and
// the results are compared. On a machine without a GPU every such test reports itself skipped
// (NF_REQUIRE_GPU); nothing else in the suite needs a device.
#pragma once

#include <string>
#include <vector>

#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::testing {

#define NF_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (::nf::cuda::DeviceCount() == 0) {                                                 \
      GTEST_SKIP() << "no CUDA device visible: this test compares the CUDA backend with " \
                      "the CPU and runs on a GPU machine (scripts/gpu-check.sh)";         \
    }                                                                                     \
  } while (false)

inline const Device kGpu = Device::Cuda(0);

// The same values on the CPU and on GPU 0.
struct Twin {
  Tensor cpu, gpu;
};

inline Tensor OnGpu(const Tensor& host) {
  auto allocator = ops::AllocatorFor(kGpu);
  NF_EXPECT_OK(allocator);
  auto gpu = Tensor::Empty(host.dtype(), host.shape(), **allocator);
  NF_EXPECT_OK(gpu);
  NF_EXPECT_OK(ops::Copy(host, *gpu));
  return *gpu;
}

inline Tensor ToCpu(const Tensor& gpu) {
  auto host = Tensor::HostEmpty(gpu.dtype(), gpu.shape());
  NF_EXPECT_OK(host);
  const absl::Status status = ops::Copy(gpu, *host);
  NF_EXPECT_OK(status);
  return *host;
}

inline Twin MakeTwin(const Tensor& host) { return {host, OnGpu(host)}; }

inline Twin RandomTwin(DType dtype, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return MakeTwin(MakeTensor(dtype, shape, RandomFloats(NumElements(shape), seed, lo, hi)));
}

inline Twin ZerosTwin(DType dtype, Shape shape) { return MakeTwin(MakeZeros(dtype, shape)); }

// Expects the GPU result to equal the CPU's within tol * max|CPU| (plus the same for
// non-finite values): the two backends sum in different orders, so elementwise relative
// checks would be meaningless for values that cancel. Synchronises the device first and
// fails on a recorded device fault.
inline void ExpectTwinClose(const Twin& t, double tol, const std::string& what) {
  const absl::Status synced = ops::Synchronize(kGpu);
  NF_ASSERT_OK(synced) << what;
  const std::vector<double> cpu = ToDoubles(t.cpu);
  const std::vector<double> gpu = ToDoubles(ToCpu(t.gpu));
  ExpectAllClose(gpu, cpu, tol * std::max(1e-30, MaxAbs(cpu)), 0.0, what);
}

// Bit-for-bit equality (dropout masks, permutations, copies).
inline void ExpectTwinIdentical(const Twin& t, const std::string& what) {
  NF_ASSERT_OK(ops::Synchronize(kGpu));
  const std::vector<double> cpu = ToDoubles(t.cpu);
  const std::vector<double> gpu = ToDoubles(ToCpu(t.gpu));
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i], gpu[i]) << what << ": element " << i;
  }
}

}  // namespace nf::testing
