// The NCCL communicator (parallel/nccl_communicator.h) on two GPUs, two ranks run as two threads
// of one process (NcclCommunicator::CreateWithId: the NCCL id handed over in memory instead of
// over MPI), so that the lent-GPU check (scripts/gpu-check.sh), whose machine has no MPI,
// exercises NCCL's real behaviour: every collective the training uses in fp32, fp16 and bf16,
// ZeRO's in-place reduce-scatter and all-gather, a batch of sends and receives larger than
// NCCL's buffers in both directions at once (the pipeline's step), the barrier, the
// communication stream's priority, and the bound on operations waited for without stats().
// The MPI programs (tests/parallel/nccl_communicator_mpi.cc) run the same communicator under
// mpirun where there is one. On a machine with fewer than two GPUs the test skips, saying so;
// gpu-check.sh accepts that skip only where nvidia-smi lists one GPU.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "parallel/nccl_communicator.h"
#include "parallel/settling_queue.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using parallel::CommOp;
using parallel::NcclCommunicator;
using parallel::ReduceOp;

constexpr int kRanks = 2;

// One rank: its GPU's compute stream (the CUDA backend's), and its communicator.
struct Rank {
  int index = 0;
  cuda::CudaContext* context = nullptr;
  std::unique_ptr<NcclCommunicator> comm;

  Tensor Device(DType dtype, Shape shape, const std::vector<float>& values) const {
    auto allocator = ops::AllocatorFor(Device::Cuda(index));
    NF_EXPECT_OK(allocator);
    auto t = Tensor::Empty(dtype, shape, **allocator);
    NF_EXPECT_OK(t);
    NF_EXPECT_OK(ops::Copy(testing::MakeTensor(dtype, shape, values), *t));
    return *t;
  }
  std::vector<double> Values(const Tensor& device) const {
    NF_EXPECT_OK(ops::Synchronize(Device::Cuda(index)));
    return testing::ToDoubles(testing::ToCpu(device));
  }
};

// Runs body(rank) on kRanks threads, each with its GPU and its communicator of the group
// "world" over both; fails (without hanging: the watchdog's 60 s) if either cannot set up.
void OnTwoRanks(const std::function<void(Rank&)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      Rank rank;
      rank.index = r;
      auto context = cuda::CudaContext::ForDevice(r);
      NF_ASSERT_OK(context);
      rank.context = *context;
      auto comm = NcclCommunicator::CreateWithId(
          {.name = "world", .world_ranks = {0, 1}, .rank = r}, id, r, rank.context->stream(),
          {.watchdog = {.timeout = absl::Seconds(60)}});
      NF_ASSERT_OK(comm);
      rank.comm = *std::move(comm);
      body(rank);
      NF_EXPECT_OK(ops::Synchronize(Device::Cuda(r)));
      rank.comm.reset();
    });
  }
  for (std::thread& t : threads) t.join();
}

class NcclThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NF_REQUIRE_GPU();
    if (cuda::DeviceCount() < kRanks) {
      GTEST_SKIP() << "needs 2 GPUs, one per rank: this machine has " << cuda::DeviceCount()
                   << " (NCCL refuses two ranks of one communicator on one GPU)";
    }
  }
};

// Small multiples of 1/4, whose sums are exact in fp16 and bf16 as in fp32.
std::vector<float> Contribution(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank * 7 + i * 3) % 17 - 8) / 4;
  return v;
}

TEST_F(NcclThreadsTest, CollectivesInEveryTrainingDtype) {
  OnTwoRanks([](Rank& rank) {
    const int r = rank.index;
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " " << DTypeName(dtype));
      constexpr int64_t n = 1000;
      const Tensor sum = rank.Device(dtype, {n}, Contribution(r, n));
      NF_ASSERT_OK(rank.comm->AllReduce(sum, ReduceOp::kSum));
      const std::vector<double> got = rank.Values(sum);
      const std::vector<float> a = Contribution(0, n), b = Contribution(1, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], double{a[i]} + b[i]) << i;
      // ZeRO's in-place forms: each rank's block of the input is its output.
      const Tensor grads = rank.Device(dtype, {2 * n}, Contribution(r, 2 * n));
      auto slice = grads.Slice(r * n, n);
      NF_ASSERT_OK(slice);
      const Tensor mine = *slice;
      NF_ASSERT_OK(rank.comm->ReduceScatter(grads, mine));
      const std::vector<double> block = rank.Values(mine);
      const std::vector<float> a2 = Contribution(0, 2 * n), b2 = Contribution(1, 2 * n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(block[i], double{a2[r * n + i]} + b2[r * n + i]);
      NF_ASSERT_OK(rank.comm->AllGather(mine, grads));
      const std::vector<double> gathered = rank.Values(grads);
      for (int64_t i = 0; i < 2 * n; ++i) ASSERT_EQ(gathered[i], double{a2[i]} + b2[i]) << i;
      const Tensor root = rank.Device(dtype, {n}, Contribution(r, n));
      NF_ASSERT_OK(rank.comm->Broadcast(root, 1));
      const std::vector<double> broadcast = rank.Values(root);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(broadcast[i], double{b[i]});
    }
    NF_EXPECT_OK(rank.comm->Barrier());
  });
}

// The pipeline's step: each rank sends 32 MiB to the other and receives as much, in one batch
// (one NCCL group): far beyond NCCL's buffers, so this finishes only because the group
// progresses both directions at once (nccl_communicator.h's rules).
TEST_F(NcclThreadsTest, ABatchOfSendsAndReceivesBeyondNcclsBuffersInBothDirections) {
  OnTwoRanks([](Rank& rank) {
    const int r = rank.index, peer = 1 - r;
    constexpr int64_t n = 8 << 20;  // fp32: 32 MiB
    std::vector<float> mine(n);
    for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<float>((i % 1000) + 1000 * r);
    const Tensor send = rank.Device(DType::kF32, {n}, mine);
    const Tensor recv = rank.Device(DType::kF32, {n}, std::vector<float>(n, 0.0f));
    auto handles = rank.comm->StartBatch({{.op = CommOp::kSend, .tensor = send, .peer = peer},
                                          {.op = CommOp::kRecv, .tensor = recv, .peer = peer}});
    NF_ASSERT_OK(handles);
    for (auto& h : *handles) NF_ASSERT_OK(h->Wait());
    const std::vector<double> got = rank.Values(recv);
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], (i % 1000) + 1000 * peer) << i;
  });
}

// The communication stream runs at the device's greatest priority, and a rank that never reads
// stats() (nf-generate) keeps a bounded list of operations waited for.
TEST_F(NcclThreadsTest, PriorityStreamAndBoundedBookkeeping) {
  OnTwoRanks([](Rank& rank) {
    int least = 0, greatest = 0, priority = 1;
    ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
    ASSERT_EQ(cudaStreamGetPriority(rank.comm->comm_stream(), &priority), cudaSuccess);
    EXPECT_EQ(priority, greatest);
    const Tensor t = rank.Device(DType::kF32, {4}, {1, 2, 3, 4});
    constexpr size_t kCapacity = parallel::SettlingQueue<int>::kDefaultCapacity;
    for (size_t i = 0; i < 2 * kCapacity + 100; ++i) {
      NF_ASSERT_OK(rank.comm->AllReduce(t, ReduceOp::kMax));
      ASSERT_LE(rank.comm->unsettled_operations(), kCapacity);
    }
    NF_ASSERT_OK(ops::Synchronize(Device::Cuda(rank.index)));
    NF_ASSERT_OK(rank.comm->AllReduce(t, ReduceOp::kMax));
    EXPECT_LE(rank.comm->unsettled_operations(), 1u);
  });
}

}  // namespace
}  // namespace nf
