// The CUDA backend's host side, which needs no device: these run (and pass) on every machine
// that builds the backend, GPU or not.
#include <set>
#include <string>

#include "core/cuda/attention_dispatch.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
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

// cudaErrorNoDevice is a count of 0; any other failure is CUDA's own error, never a silent 0
// that the caller would blame on CUDA_VISIBLE_DEVICES (an old driver is not a missing GPU).
TEST(CudaWithoutDeviceTest, DeviceCountReportsCudasOwnError) {
  EXPECT_EQ(*cuda::DeviceCountFromResult(cudaSuccess, 8), 8);
  EXPECT_EQ(*cuda::DeviceCountFromResult(cudaErrorNoDevice, 0), 0);
  const absl::StatusOr<int> driver = cuda::DeviceCountFromResult(cudaErrorInsufficientDriver, 0);
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().message(),
            std::string("cudaGetDeviceCount failed: cudaErrorInsufficientDriver: ") +
                cudaGetErrorString(cudaErrorInsufficientDriver));
  EXPECT_FALSE(cuda::DeviceCountFromResult(cudaErrorInitializationError, 0).ok());
  // The process's own answer agrees with DeviceCount() and, on failure, with the op layer's.
  const absl::StatusOr<int> checked = cuda::CheckedDeviceCount();
  EXPECT_EQ(checked.value_or(0), cuda::DeviceCount());
  EXPECT_EQ(ops::GpuCountError(), checked.ok() ? "" : std::string(checked.status().message()));
  if (!checked.ok()) {
    const auto allocator = ops::AllocatorFor(Device::Cuda(0));
    ASSERT_FALSE(allocator.ok());
    EXPECT_THAT(std::string(allocator.status().message()),
                ::testing::HasSubstr(std::string(checked.status().message())));
  }
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

TEST(CudaWithoutDeviceTest, CudnnAttentionRefusals) {
  using cuda::CudnnAttentionRefusal;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int64_t dim : {8, 64, 80, 128}) EXPECT_EQ(CudnnAttentionRefusal(dtype, dim, 0), nullptr);
  }
  EXPECT_EQ(CudnnAttentionRefusal(DType::kF16, 64, 0x7f0000001230), nullptr);
  // cuDNN's is 16-bit only.
  EXPECT_THAT(CudnnAttentionRefusal(DType::kF32, 64, 0), ::testing::HasSubstr("fp32 storage"));
  for (int64_t dim : {0, 60, 100, 136, 256}) {
    EXPECT_THAT(CudnnAttentionRefusal(DType::kBF16, dim, 0),
                ::testing::HasSubstr("head_dim not a multiple of 8 up to 128"))
        << dim;
  }
  // A tensor whose address is not 16-byte aligned (a view at an odd offset).
  EXPECT_THAT(CudnnAttentionRefusal(DType::kF16, 64, 0x7f0000001238),
              ::testing::HasSubstr("not 16-byte aligned"));
}

// The seed of cuDNN's dropout is a pure function of the spec (the backward redraws the
// forward's mask) and differs whenever any coordinate of the call does (no two calls of a run
// share a mask): the run's seed, the site, the first sample (both halves), the shard's first
// head and the first token; the probability and the other fields do not enter.
// One path for both directions of a call (issue 46, 4.3): before, forward and backward chose
// independently, so a backward refused by cuDNN after a cuDNN forward with dropout ran the own
// kernel, which redraws another mask: silently wrong gradients.
TEST(CudaWithoutDeviceTest, TheBackwardFollowsItsForwardsPath) {
  using cuda::AttentionPath;
  using cuda::BackwardAttentionPath;
  using cuda::ForwardAttentionPath;
  ops::DropoutSpec dropout{.p = 0.1f, .seed = 7};
  const Tensor q = *Tensor::HostZeros(DType::kF16, {4, 16, 2048, 80});
  const cuda::AttentionCallKey with_dropout = cuda::AttentionKeyOf(0, q, 0.125f, dropout);
  const cuda::AttentionCallKey without = cuda::AttentionKeyOf(0, q, 0.125f, {});
  EXPECT_TRUE(with_dropout.dropout());
  EXPECT_FALSE(without.dropout());
  EXPECT_NE(with_dropout, without);
  EXPECT_EQ(with_dropout.ToString(), "[4, 16, 2048, 80] f16, dropout 0.1 on cuda:0");

  // The forward: cuDNN when eligible; with dropout only if cuDNN builds the backward graph.
  const absl::Status refused = absl::UnimplementedError("backward graph not supported");
  EXPECT_EQ(ForwardAttentionPath(nullptr, true, absl::OkStatus()), AttentionPath::kCudnn);
  EXPECT_EQ(ForwardAttentionPath(nullptr, true, refused), AttentionPath::kOwn);
  EXPECT_EQ(ForwardAttentionPath(nullptr, false, refused), AttentionPath::kCudnn);
  EXPECT_EQ(ForwardAttentionPath("NF_ATTENTION=own", false, absl::OkStatus()), AttentionPath::kOwn);

  // The backward follows an own forward even where cuDNN could take it (the own mask).
  EXPECT_EQ(*BackwardAttentionPath(with_dropout, AttentionPath::kOwn, nullptr),
            AttentionPath::kOwn);
  EXPECT_EQ(*BackwardAttentionPath(with_dropout, AttentionPath::kCudnn, nullptr),
            AttentionPath::kCudnn);
  // A cuDNN forward with dropout whose backward cuDNN refuses is an error, never a switch.
  const absl::StatusOr<AttentionPath> mixed =
      BackwardAttentionPath(with_dropout, AttentionPath::kCudnn,
                            "a tensor not 16-byte aligned (a view at an odd offset)");
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mixed.status().message()),
              ::testing::AllOf(::testing::HasSubstr("[4, 16, 2048, 80] f16, dropout 0.1"),
                               ::testing::HasSubstr("a tensor not 16-byte aligned"),
                               ::testing::HasSubstr("NF_ATTENTION=own")));
  EXPECT_FALSE(BackwardAttentionPath(with_dropout, AttentionPath::kCudnn, "NF_ATTENTION=own").ok());
  // Without dropout both kernels compute the same gradients: the own kernel may take over.
  EXPECT_EQ(*BackwardAttentionPath(without, AttentionPath::kCudnn, "NF_ATTENTION=own"),
            AttentionPath::kOwn);
  // No forward seen (a backward run alone): its own eligibility decides.
  EXPECT_EQ(*BackwardAttentionPath(with_dropout, std::nullopt, nullptr), AttentionPath::kCudnn);
  EXPECT_EQ(*BackwardAttentionPath(with_dropout, std::nullopt, "NF_ATTENTION=own"),
            AttentionPath::kOwn);

  // The table keeps each key's latest forward.
  cuda::AttentionPathTable table;
  EXPECT_EQ(table.ForwardPath(with_dropout), std::nullopt);
  table.NoteForward(with_dropout, AttentionPath::kCudnn);
  table.NoteForward(without, AttentionPath::kOwn);
  EXPECT_EQ(table.ForwardPath(with_dropout), AttentionPath::kCudnn);
  EXPECT_EQ(table.ForwardPath(without), AttentionPath::kOwn);
  dropout.p = 0.2f;
  EXPECT_EQ(table.ForwardPath(cuda::AttentionKeyOf(0, q, 0.125f, dropout)), std::nullopt);
  EXPECT_EQ(table.ForwardPath(cuda::AttentionKeyOf(1, q, 0.125f, {.p = 0.1f})), std::nullopt);
}

// What the GPU check expects attention to run on: NF_EXPECT_ATTENTION, else NF_ATTENTION's
// choice, cuDNN by default; never "whichever ran".
TEST(CudaWithoutDeviceTest, TheExpectedAttentionPathComesFromTheEnvironment) {
  using cuda::AttentionPath;
  using testing::ExpectedAttentionPath;
  EXPECT_EQ(*ExpectedAttentionPath("cudnn", nullptr), AttentionPath::kCudnn);
  EXPECT_EQ(*ExpectedAttentionPath("own", nullptr), AttentionPath::kOwn);
  EXPECT_EQ(*ExpectedAttentionPath("cudnn", "own"), AttentionPath::kCudnn);  // stated wins
  EXPECT_EQ(*ExpectedAttentionPath(nullptr, nullptr), AttentionPath::kCudnn);
  EXPECT_EQ(*ExpectedAttentionPath("", "auto"), AttentionPath::kCudnn);
  EXPECT_EQ(*ExpectedAttentionPath(nullptr, "own"), AttentionPath::kOwn);
  EXPECT_FALSE(ExpectedAttentionPath("either", nullptr).ok());
}

TEST(CudaWithoutDeviceTest, CudnnDropoutSeedsDifferByCall) {
  const ops::DropoutSpec base{.p = 0.1f,
                              .seed = 7,
                              .site = 3,
                              .first_sample = 1000,
                              .seq_len = 2048,
                              .token_offset = 0,
                              .head_offset = 4};
  const int64_t seed = cuda::CudnnDropoutSeed(base);
  ops::DropoutSpec same = base;
  same.p = 0.2f;
  same.seq_len = 1024;
  same.col_offset = 5;
  EXPECT_EQ(cuda::CudnnDropoutSeed(same), seed);
  std::set<int64_t> seeds = {seed};
  auto vary = [&](auto change) {
    ops::DropoutSpec d = base;
    change(d);
    seeds.insert(cuda::CudnnDropoutSeed(d));
  };
  vary([](ops::DropoutSpec& d) { d.seed = 8; });
  vary([](ops::DropoutSpec& d) { d.site = 4; });
  vary([](ops::DropoutSpec& d) { d.first_sample = 1001; });
  vary([](ops::DropoutSpec& d) { d.first_sample = 1000 + (uint64_t{1} << 32); });
  vary([](ops::DropoutSpec& d) { d.head_offset = 8; });
  vary([](ops::DropoutSpec& d) { d.token_offset = 512; });
  EXPECT_EQ(seeds.size(), 7u);
  // Every (site, first sample, first head) of a small run: all distinct.
  std::set<int64_t> run;
  for (uint32_t site = 0; site < 32; ++site) {
    for (uint64_t sample = 0; sample < 64; sample += 8) {
      for (int64_t head = 0; head < 32; head += 4) {
        ops::DropoutSpec d = base;
        d.site = site;
        d.first_sample = sample;
        d.head_offset = head;
        run.insert(cuda::CudnnDropoutSeed(d));
      }
    }
  }
  EXPECT_EQ(run.size(), 32u * 8 * 8);
}

}  // namespace
}  // namespace nf
