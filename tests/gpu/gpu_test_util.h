// Helpers for the gpu-labelled tests: each CUDA op runs on the same inputs as its CPU twin and
// the results are compared. On a machine without a GPU every such test reports itself skipped
// (NF_REQUIRE_GPU); nothing else in the suite needs a device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cuda/attention_dispatch.h"
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

// With NF_TEST_RESULT_DIGESTS=<file>, every GPU result a test compares is also written there
// as "<test>/<what> <FNV-1a of its bytes>": tests/emulation/thread_orders_agree.sh runs a test
// program under each thread order of the emulated GPU and requires the same bits from all.
inline void RecordResultDigest(const Tensor& host, const std::string& what) {
  const char* path = std::getenv("NF_TEST_RESULT_DIGESTS");
  if (path == nullptr) return;
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
  for (size_t i = 0; i < host.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::FILE* file = std::fopen(path, "a");
  ASSERT_NE(file, nullptr) << path;
  std::fprintf(file, "%s.%s/%s %016llx\n", test->test_suite_name(), test->name(), what.c_str(),
               static_cast<unsigned long long>(hash));
  std::fclose(file);
}

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

// The GPU tests' tolerances, relative to the CPU result's largest magnitude (ExpectTwinClose):
// one rounded function evaluation per element (4 fp32 units); a sum in another order than the
// CPU's; and, for a result stored in fp16/bf16, two units of its rounding on top (Tol).
inline constexpr double kElementwise = 4 * kU32;
inline constexpr double kReduction = 2e-5;
inline double Tol(DType dtype, double fp32_tol) { return fp32_tol + 2 * UnitRoundoff(dtype); }

// Sets NF_ATTENTION for a scope (nullptr: unset) and restores the previous value.
class ScopedAttentionPolicy {
 public:
  explicit ScopedAttentionPolicy(const char* value) {
    if (const char* old = std::getenv("NF_ATTENTION"); old != nullptr) previous_ = old;
    Set(value);
  }
  ~ScopedAttentionPolicy() { Set(previous_ ? previous_->c_str() : nullptr); }

 private:
  static void Set(const char* value) {
    if (value == nullptr) {
      unsetenv("NF_ATTENTION");
    } else {
      setenv("NF_ATTENTION", value, 1);
    }
  }
  std::optional<std::string> previous_;
};

// Runs `op` once with the CPU tensors and once with the GPU tensors of the twins.
template <typename Op>
void OnBoth(Op&& op) {
  const absl::Status cpu = op([](const Twin& t) { return t.cpu; });
  NF_ASSERT_OK(cpu);
  const absl::Status gpu = op([](const Twin& t) { return t.gpu; });
  NF_ASSERT_OK(gpu);
}

// Expects the GPU result to equal the CPU's within tol * max|CPU| (plus the same for
// non-finite values): the two backends sum in different orders, so elementwise relative
// checks would be meaningless for values that cancel. Synchronises the device first and
// fails on a recorded device fault. `terms`, when larger than max|CPU|, is the scale instead:
// the magnitude of the terms a result that is 0 in exact arithmetic was computed from, whose
// rounding noise each backend keeps (a LayerNorm over one column, attention over one key).
inline void ExpectTwinClose(const Twin& t, double tol, const std::string& what,
                            double terms = 0.0) {
  const absl::Status synced = ops::Synchronize(kGpu);
  NF_ASSERT_OK(synced) << what;
  const Tensor gpu_on_host = ToCpu(t.gpu);
  RecordResultDigest(gpu_on_host, what);
  const std::vector<double> cpu = ToDoubles(t.cpu);
  const std::vector<double> gpu = ToDoubles(gpu_on_host);
  ExpectAllClose(gpu, cpu, tol * std::max({1e-30, MaxAbs(cpu), terms}), 0.0, what);
}

// Bit-for-bit equality (dropout masks, permutations, copies).
inline void ExpectTwinIdentical(const Twin& t, const std::string& what) {
  NF_ASSERT_OK(ops::Synchronize(kGpu));
  const Tensor gpu_on_host = ToCpu(t.gpu);
  RecordResultDigest(gpu_on_host, what);
  const std::vector<double> cpu = ToDoubles(t.cpu);
  const std::vector<double> gpu = ToDoubles(gpu_on_host);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i], gpu[i]) << what << ": element " << i;
  }
}

// The attention path the GPU check expects its calls to take, so that a test fails when
// another ran (before, `EXPECT_EQ(cudnn, cudnn_status.ok())` passed whichever path ran):
// NF_EXPECT_ATTENTION (`expect`: "cudnn" or "own"; scripts/gpu-check.sh sets cudnn), else
// the own kernel under NF_ATTENTION=own (`policy`) and cuDNN otherwise (a GPU machine must run
// cuDNN's fused attention: CudnnAttentionTest refuses one where it cannot). Any other
// NF_EXPECT_ATTENTION is an error. Pure: the callers pass getenv's values.
inline absl::StatusOr<cuda::AttentionPath> ExpectedAttentionPath(const char* expect,
                                                                 const char* policy) {
  if (expect != nullptr && expect[0] != '\0') {
    if (std::string(expect) == "cudnn") return cuda::AttentionPath::kCudnn;
    if (std::string(expect) == "own") return cuda::AttentionPath::kOwn;
    return absl::InvalidArgumentError(std::string("NF_EXPECT_ATTENTION=") + expect +
                                      " is not cudnn or own");
  }
  if (policy != nullptr && std::string(policy) == "own") return cuda::AttentionPath::kOwn;
  return cuda::AttentionPath::kCudnn;
}

inline const char* AttentionPathName(cuda::AttentionPath path) {
  return path == cuda::AttentionPath::kCudnn ? "cuDNN fused attention" : "own kernel";
}

}  // namespace nf::testing
