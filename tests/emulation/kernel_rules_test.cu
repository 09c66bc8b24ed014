// The emulated GPU enforces CUDA's rules: each test launches a small kernel that breaks one
// (or keeps it) through core/cuda's own launch helper and checks what the emulator says.
#include <cuda_runtime.h>

#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/launch.cuh"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {
namespace {

using cuda::Launch;
using ::testing::HasSubstr;

// ---- Kernels ----------------------------------------------------------------------------------

__global__ void BarrierSkippedByHalf(int* out) {
  if (threadIdx.x < 32) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void TwoBarriers(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void FullMaskOnPartialWarp(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Every lane ends with the sum over its warp: 0 + 1 + ... + 31 = 496.
__global__ void ButterflySum(float* out) {
  float v = static_cast<float>(threadIdx.x & 31);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v;
}

// Reads its neighbour's shared slot without a barrier between the write and the read.
__global__ void RacyNeighbour(float* out, float base) {
  __shared__ float slots[64];
  slots[threadIdx.x] = base + static_cast<float>(threadIdx.x);
  out[threadIdx.x] = slots[(threadIdx.x + 1) % 64];
}

// The same with the barrier: no race.
__global__ void OrderedNeighbour(float* out, float base) {
  __shared__ float slots[64];
  slots[threadIdx.x] = base + static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = slots[(threadIdx.x + 1) % 64];
}

__global__ void UsesDynamicShared(float* out) {
  NF_DYNAMIC_SHARED(float, shared);
  shared[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = shared[threadIdx.x];
}

__global__ void WriteOnes(float* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = 1.0f;
}

__global__ void ReadSum(const float* in, int n, float* out) {
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += in[i];
    *out = sum;
  }
}

// Takes the next ticket of `counter` into its slot of `order`.
__global__ void TakeTicket(unsigned* counter, unsigned* order, int slot) {
  unsigned expected = *counter;
  while (atomicCAS(counter, expected, expected + 1) != expected) expected = *counter;
  order[slot] = expected;
}

// ---- Helpers ----------------------------------------------------------------------------------

template <typename T>
T* DeviceBuffer(size_t n) {
  void* ptr = nullptr;
  EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
  return static_cast<T*>(ptr);
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

class KernelRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClearReportsAndErrors();
    SetThreadOrder({ThreadOrder::kForward, 1});
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override {
    ClearReportsAndErrors();
    SetThreadOrder({ThreadOrder::kForward, 1});
  }
  // Synchronises and returns the one report the kernel caused.
  std::string ExpectOneReport() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    const std::vector<std::string> reports = Reports();
    EXPECT_EQ(reports.size(), 1u);
    return reports.empty() ? "" : reports[0];
  }
};

TEST_F(KernelRulesTest, ABarrierSomeThreadsSkipIsReportedWithKernelAndLines) {
  int* out = DeviceBuffer<int>(64);
  Launch<BarrierSkippedByHalf>({1, 64, 0, nullptr}, out);
  // The launch itself is valid; its failure surfaces asynchronously (at the synchronisation, or
  // at an earlier call once the kernel has run).
  const std::string report = ExpectOneReport();
  EXPECT_THAT(report, HasSubstr("BarrierSkippedByHalf"));
  EXPECT_THAT(report, HasSubstr("kernel_rules_test.cu:"));
  EXPECT_THAT(report, HasSubstr("reached by 32 of 64 threads; 32 exited without it"));
}

TEST_F(KernelRulesTest, ThreadsAtTwoDifferentBarriersAreReported) {
  int* out = DeviceBuffer<int>(64);
  Launch<TwoBarriers>({1, 64, 0, nullptr}, out);
  EXPECT_THAT(ExpectOneReport(), HasSubstr("threads wait at two different __syncthreads"));
}

TEST_F(KernelRulesTest, AFullMaskInAPartialWarpIsReported) {
  float* out = DeviceBuffer<float>(48);
  Launch<FullMaskOnPartialWarp>({1, 48, 0, nullptr}, out);
  EXPECT_THAT(ExpectOneReport(), HasSubstr("names lanes that warp 1 does not have (16 threads"));
}

TEST_F(KernelRulesTest, ShufflesExchangeAcrossTheWarpUnderEveryOrder) {
  for (OrderSetting order :
       {OrderSetting{ThreadOrder::kForward, 1}, OrderSetting{ThreadOrder::kReverse, 1},
        OrderSetting{ThreadOrder::kShuffle, 7}}) {
    SetThreadOrder(order);
    float* out = DeviceBuffer<float>(64);
    Launch<ButterflySum>({1, 64, 0, nullptr}, out);
    for (float v : ToHost(out, 64)) ASSERT_EQ(v, 496.0f) << OrderName(order);
    cudaFree(out);
  }
  EXPECT_TRUE(Reports().empty());
}

// What racecheck would find shows as results that depend on the thread order.
TEST_F(KernelRulesTest, ARaceBetweenThreadsGivesDifferentBitsUnderDifferentOrders) {
  // Each run writes values of its own (base), so a read of a slot not yet written this run
  // shows an earlier run's value.
  float base = 0.0f;
  auto run = [&base](auto kernel_launch, OrderSetting order) {
    SetThreadOrder(order);
    float* out = DeviceBuffer<float>(64);
    base += 1000.0f;
    kernel_launch(out, base);
    std::vector<float> host = ToHost(out, 64);
    cudaFree(out);
    for (float& v : host) v -= base;  // the same bits for the same thread order
    return host;
  };
  auto racy = [](float* out, float b) { Launch<RacyNeighbour>({1, 64, 0, nullptr}, out, b); };
  auto ordered = [](float* out, float b) { Launch<OrderedNeighbour>({1, 64, 0, nullptr}, out, b); };
  const OrderSetting forward{ThreadOrder::kForward, 1}, reverse{ThreadOrder::kReverse, 1};
  const std::vector<float> racy_forward = run(racy, forward);
  const std::vector<float> racy_reverse = run(racy, reverse);
  EXPECT_NE(racy_forward, racy_reverse);
  const std::vector<float> ordered_forward = run(ordered, forward);
  EXPECT_EQ(ordered_forward, run(ordered, reverse));
  EXPECT_EQ(ordered_forward, run(ordered, {ThreadOrder::kShuffle, 3}));
}

TEST_F(KernelRulesTest, LaunchLimitsAreCudasErrors) {
  float* out = DeviceBuffer<float>(2048);
  Launch<WriteOnes>({1, 1025, 0, nullptr}, out, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Launch<WriteOnes>({1, dim3(1, 1, 65), 0, nullptr}, out, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Launch<WriteOnes>({dim3(1, 65536), 32, 0, nullptr}, out, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Launch<WriteOnes>({dim3(1, 65535), 32, 0, nullptr}, out, 32);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the error was cleared by the first read
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(KernelRulesTest, DynamicSharedMemoryAbove48KiBNeedsTheOptIn) {
  float* out = DeviceBuffer<float>(64);
  const size_t bytes = 64 << 10;
  Launch<UsesDynamicShared>({1, 64, bytes, nullptr}, out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(&UsesDynamicShared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
            cudaSuccess);
  Launch<UsesDynamicShared>({1, 64, bytes, nullptr}, out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : ToHost(out, 64)) EXPECT_EQ(v, 2.0f);
}

TEST_F(KernelRulesTest, APointerThatIsNotDeviceMemoryIsAnIllegalAddress) {
  std::vector<float> host(64);
  Launch<WriteOnes>({1, 64, 0, nullptr}, host.data(), 64);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("which is not memory of any device"));
}

TEST_F(KernelRulesTest, AKernelOnAnotherDevicesStreamIsRefused) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* out = DeviceBuffer<float>(64);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  Launch<WriteOnes>({1, 64, 0, stream}, out, 64);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---- Streams: hazards are found from the program's order, not from timing -------------------

class StreamHazardTest : public KernelRulesTest {
 protected:
  void SetUp() override {
    KernelRulesTest::SetUp();
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&consumer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    cudaStreamSynchronize(producer_);
    cudaStreamSynchronize(consumer_);
    cudaEventDestroy(written_);
    cudaStreamDestroy(producer_);
    cudaStreamDestroy(consumer_);
    KernelRulesTest::TearDown();
  }
  cudaStream_t producer_ = nullptr, consumer_ = nullptr;
  cudaEvent_t written_ = nullptr;
};

TEST_F(StreamHazardTest, AReadOnAnotherStreamWithoutAnEventIsAHazard) {
  float* data = DeviceBuffer<float>(256);
  float* sum = DeviceBuffer<float>(1);
  Launch<WriteOnes>({1, 64, 0, producer_}, data, 256);
  Launch<ReadSum>({1, 32, 0, consumer_}, data, 256, sum);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("hazard (read after write)"));
  EXPECT_THAT(Reports()[0], HasSubstr("ReadSum"));
  EXPECT_THAT(Reports()[0], HasSubstr("WriteOnes"));
}

TEST_F(StreamHazardTest, AnEventBetweenTheStreamsOrdersThem) {
  float* data = DeviceBuffer<float>(256);
  float* sum = DeviceBuffer<float>(1);
  SetStreamDelays(5);  // whatever the timing
  Launch<WriteOnes>({1, 64, 0, producer_}, data, 256);
  ASSERT_EQ(cudaEventRecord(written_, producer_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer_, written_, 0), cudaSuccess);
  Launch<ReadSum>({1, 32, 0, consumer_}, data, 256, sum);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  SetStreamDelays(0);
  EXPECT_EQ(ToHost(sum, 1)[0], 256.0f);
  EXPECT_TRUE(Reports().empty());
}

TEST_F(StreamHazardTest, ReusingMemoryAnotherStreamStillReadsIsAHazard) {
  float* data = DeviceBuffer<float>(256);
  float* sum = DeviceBuffer<float>(1);
  Launch<WriteOnes>({1, 64, 0, producer_}, data, 256);
  ASSERT_EQ(cudaEventRecord(written_, producer_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer_, written_, 0), cudaSuccess);
  Launch<ReadSum>({1, 32, 0, consumer_}, data, 256, sum);
  // The producer writes the buffer again while the consumer may still read it: what a caching
  // allocator does when it hands a block out before the other stream's use is over.
  Launch<WriteOnes>({1, 64, 0, producer_}, data, 256);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("hazard (write after read)"));
}

TEST_F(StreamHazardTest, AHostSynchronisationOrdersLaterWork) {
  float* data = DeviceBuffer<float>(256);
  float* sum = DeviceBuffer<float>(1);
  Launch<WriteOnes>({1, 64, 0, producer_}, data, 256);
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  Launch<ReadSum>({1, 32, 0, consumer_}, data, 256, sum);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  EXPECT_TRUE(Reports().empty());
}

// CUDA's minimum guarantee, enforced by NF_EMU_SERIAL_KERNELS: a device runs its kernels one at
// a time in the order they were issued, whatever their streams (and however the stream delays
// would reorder them).
TEST_F(StreamHazardTest, SerialKernelsRunInIssueOrderAcrossStreams) {
  unsigned* counter = DeviceBuffer<unsigned>(1);
  unsigned* order = DeviceBuffer<unsigned>(16);
  ASSERT_EQ(cudaMemset(counter, 0, sizeof(unsigned)), cudaSuccess);
  SetHazardChecks(false);  // the kernels share the counter through atomics only
  SetSerialKernels(true);
  SetStreamDelays(3);
  for (int slot = 0; slot < 16; ++slot) {
    Launch<TakeTicket>({1, 1, 0, slot % 2 == 0 ? producer_ : consumer_}, counter, order, slot);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SetStreamDelays(0);
  SetSerialKernels(false);
  SetHazardChecks(true);
  const std::vector<unsigned> tickets = ToHost(order, 16);
  for (int slot = 0; slot < 16; ++slot) EXPECT_EQ(tickets[slot], static_cast<unsigned>(slot));
}

// A pinned source is read when the stream reaches the copy, a pageable one at the call: a pinned
// buffer the host changes before its copy ran gives the new bytes (the bug pinned_staging.h's
// events prevent), a pageable one the old.
TEST_F(StreamHazardTest, APinnedBufferChangedBeforeItsCopyRanGivesTheNewBytes) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto* wait = new std::shared_future<void>(released);
  ASSERT_EQ(cudaLaunchHostFunc(
                producer_,
                [](void* data) {
                  auto* future = static_cast<std::shared_future<void>*>(data);
                  future->wait();
                  delete future;
                },
                wait),
            cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), sizeof(float), 0), cudaSuccess);
  float pageable = 1.0f;
  *pinned = 1.0f;
  float* from_pinned = DeviceBuffer<float>(1);
  float* from_pageable = DeviceBuffer<float>(1);
  ASSERT_EQ(cudaMemcpyAsync(from_pinned, pinned, sizeof(float), cudaMemcpyHostToDevice, producer_),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(from_pageable, &pageable, sizeof(float), cudaMemcpyHostToDevice, producer_),
      cudaSuccess);
  *pinned = 2.0f;  // the stream has not reached either copy: it waits in the host function
  pageable = 2.0f;
  release.set_value();
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  EXPECT_EQ(ToHost(from_pinned, 1)[0], 2.0f);
  EXPECT_EQ(ToHost(from_pageable, 1)[0], 1.0f);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// The caching allocator's rule (caching_allocator.h): a block freed on the host may be handed out
// at once only because every kernel runs on one stream. A block another stream still reads,
// handed out and written on the compute stream without an event between, is a hazard.
TEST_F(StreamHazardTest, ABlockHandedOutWhileAnotherStreamReadsItIsAHazard) {
  cuda::CachingAllocator allocator(0);
  auto block = allocator.Allocate(1024);
  ASSERT_TRUE(block.ok());
  float* sum = DeviceBuffer<float>(1);
  Launch<WriteOnes>({1, 64, 0, producer_}, static_cast<float*>(*block), 256);
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  Launch<ReadSum>({1, 32, 0, consumer_}, static_cast<const float*>(*block), 256, sum);
  allocator.Deallocate(*block, 1024);  // the consumer may still be reading it
  auto again = allocator.Allocate(1024);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(*again, *block);  // the same block, from the cache
  Launch<WriteOnes>({1, 64, 0, producer_}, static_cast<float*>(*again), 256);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("hazard (write after read)"));
  ClearReportsAndErrors();
  allocator.Deallocate(*again, 1024);
}

TEST_F(KernelRulesTest, DevicesHaveTheirOwnUuidsInVisibleOrder) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  // emulation.kernel_rules_test.visible_devices runs this with CUDA_VISIBLE_DEVICES=1,0 of 2.
  const bool swapped = visible != nullptr && std::string(visible) == "1,0";
  ASSERT_EQ(count, 2);
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties;
    ASSERT_EQ(cudaGetDeviceProperties(&properties, device), cudaSuccess);
    EXPECT_EQ(static_cast<unsigned char>(properties.uuid.bytes[15]), swapped ? 1 - device : device);
  }
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
}

}  // namespace
}  // namespace nf::emu
