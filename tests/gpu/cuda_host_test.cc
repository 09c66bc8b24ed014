// The CUDA backend's host side, which needs no device: these run (and pass) on every machine
// that builds the backend, GPU or not.
#include <string>

#include "core/cuda/attention_dispatch.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nf {
namespace {

TEST(CudaWithoutDeviceTest, MissingDeviceIsAClearError) {
  const int count = cuda::DeviceCount();
  const auto allocator = ops::AllocatorFor(Device::Cuda(count));
  ASSERT_FALSE(allocator.ok());
  EXPECT_THAT(std::string(allocator.status().message()),
              ::testing::HasSubstr("cuda:" + std::to_string(count) +
                                   " does not exist: this "
                                   "process sees " +
                                   std::to_string(count) + " GPU(s)"));
}

TEST(CudaWithoutDeviceTest, AllocatorRoundsToSharedSizes) {
  using cuda::CachingAllocator;
  EXPECT_EQ(CachingAllocator::RoundedSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundedSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundedSize((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(CachingAllocator::RoundedSize((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::RoundedSize((5u << 20) + 7), 6u << 20);
}

TEST(CudaWithoutDeviceTest, AttentionPolicyFromTheEnvironment) {
  using cuda::AttentionPolicy;
  using cuda::ParseAttentionPolicy;
  EXPECT_EQ(*ParseAttentionPolicy(nullptr), AttentionPolicy::kAuto);
  EXPECT_EQ(*ParseAttentionPolicy(""), AttentionPolicy::kAuto);
  EXPECT_EQ(*ParseAttentionPolicy("auto"), AttentionPolicy::kAuto);
  EXPECT_EQ(*ParseAttentionPolicy("own"), AttentionPolicy::kOwn);
  // A misspelt value must not silently choose a kernel.
  for (const char* bad : {"OWN", "cudnn", "own "}) {
    const auto policy = ParseAttentionPolicy(bad);
    ASSERT_FALSE(policy.ok()) << bad;
    EXPECT_THAT(std::string(policy.status().message()),
                ::testing::HasSubstr(std::string("NF_ATTENTION=") + bad + " is not a choice"));
  }
}

TEST(CudaWithoutDeviceTest, CudnnAttentionEligibility) {
  using cuda::CudnnAttentionEligible;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int64_t dim : {8, 64, 80, 128}) EXPECT_TRUE(CudnnAttentionEligible(dtype, dim, 0.0f, 0));
  }
  EXPECT_TRUE(CudnnAttentionEligible(DType::kF16, 64, 0.0f, 0x7f0000001230));
  EXPECT_FALSE(CudnnAttentionEligible(DType::kF32, 64, 0.0f, 0));  // cuDNN's is 16-bit only
  for (int64_t dim : {0, 60, 100, 136, 256}) {
    EXPECT_FALSE(CudnnAttentionEligible(DType::kBF16, dim, 0.0f, 0)) << dim;
  }
  // Attention dropout stays on the own kernel: cuDNN cannot draw the project's Philox masks.
  EXPECT_FALSE(CudnnAttentionEligible(DType::kF16, 64, 0.1f, 0));
  EXPECT_FALSE(CudnnAttentionEligible(DType::kF16, 64, 1e-7f, 0));
  // A tensor whose address is not 16-byte aligned (a view at an odd offset).
  EXPECT_FALSE(CudnnAttentionEligible(DType::kF16, 64, 0.0f, 0x7f0000001238));
}

}  // namespace
}  // namespace nf
