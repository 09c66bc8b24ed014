// The CUDA backend's host side, which needs no device: these run (and pass) on every machine
// that builds the backend, GPU or not.
#include <string>

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

}  // namespace
}  // namespace nf
