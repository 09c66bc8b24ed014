// Tests of parallel/nccl_communicator.h, one program run by mpirun as two CTest tests (see
// tests/CMakeLists.txt):
//   NcclHostTest.*             no GPU needed, never skipped: dtype and operation mapping, every
//                              refusal and in-place layout on the host side (tensors from an
//                              allocator that labels host memory cuda:0), creation refusing a
//                              device the process does not have, device groups refusing the CPU.
//   NcclCommunicatorGpuTest.*  labelled gpu: a group of one through NCCL on device 0 (NCCL
//                              refuses two ranks on one device), every collective against a
//                              host reference, ordering after the compute stream, byte counts
//                              and refusals, device groups of one rank staying local. Skipped,
//                              saying so, only where no CUDA device is. Sends grouped with
//                              receives need two GPUs: communicators refuse a send to this rank,
//                              and NCCL two ranks on one GPU.
// The references are written for any group size (each rank on device = its rank), so a
// machine with several GPUs can run the same program on more ranks.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mpi_test_util.h"
#include "parallel/device_groups.h"
#include "parallel/local_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/nccl_plan.h"
#include "parallel/settling_queue.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using internal::NcclCaller;
using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::FakeGpuTensor;
using ::nf::testing::TensorOf;
using ::nf::testing::Values;
using ::nf::testing::World;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr DType kReducible[] = {DType::kF32,  DType::kF64, DType::kF16,
                                DType::kBF16, DType::kI32, DType::kI64};

int64_t Bytes(const CommStats& s, CommOp op) { return s.bytes[static_cast<int>(op)]; }
int64_t Calls(const CommStats& s, CommOp op) { return s.calls[static_cast<int>(op)]; }

// ---- Host side ----------------------------------------------------------------------------------

TEST(NcclHostTest, ReducibleDtypesMapToNcclTypesAndOthersDoNot) {
  EXPECT_EQ(internal::NcclReduceType(DType::kF32), ncclFloat32);
  EXPECT_EQ(internal::NcclReduceType(DType::kF64), ncclFloat64);
  EXPECT_EQ(internal::NcclReduceType(DType::kF16), ncclFloat16);
  EXPECT_EQ(internal::NcclReduceType(DType::kBF16), ncclBfloat16);
  EXPECT_EQ(internal::NcclReduceType(DType::kI32), ncclInt32);
  EXPECT_EQ(internal::NcclReduceType(DType::kI64), ncclInt64);
  EXPECT_EQ(internal::NcclReduceType(DType::kU16), std::nullopt);
  EXPECT_EQ(internal::NcclReduceType(DType::kU8), std::nullopt);
  EXPECT_EQ(internal::NcclReduceOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(internal::NcclReduceOp(ReduceOp::kMax), ncclMax);
}

// CUDA counts priorities down: the greatest is the numerically lowest (-5 on Ampere and Hopper).
TEST(NcclHostTest, CommunicationStreamTakesTheGreatestPriority) {
  EXPECT_EQ(internal::CommStreamPriority(0, -5), -5);
  EXPECT_EQ(internal::CommStreamPriority(0, -2), -2);
  EXPECT_EQ(internal::CommStreamPriority(0, 0), 0);  // a device without priorities
}

TEST(NcclHostTest, PlansCountElementsForReductionsAndBytesForCopies) {
  const NcclCaller caller = {.group = "dp", .rank = 1, .size = 4, .device = 0};
  const Tensor h = FakeGpuTensor(DType::kF16, {3, 5});
  auto all_reduce = internal::PlanAllReduce(caller, h, ReduceOp::kMax);
  NF_ASSERT_OK(all_reduce);
  EXPECT_EQ(all_reduce->send, h.raw_data());
  EXPECT_EQ(all_reduce->recv, h.raw_data());
  EXPECT_EQ(all_reduce->count, 15u);
  EXPECT_EQ(all_reduce->type, ncclFloat16);
  EXPECT_EQ(all_reduce->reduce, ncclMax);
  EXPECT_EQ(all_reduce->bytes, 30);

  const Tensor grads = FakeGpuTensor(DType::kBF16, {8});
  const Tensor shard = FakeGpuTensor(DType::kBF16, {2});
  auto reduce_scatter = internal::PlanReduceScatter(caller, grads, shard);
  NF_ASSERT_OK(reduce_scatter);
  EXPECT_EQ(reduce_scatter->count, 2u);  // NCCL counts the output
  EXPECT_EQ(reduce_scatter->type, ncclBfloat16);
  EXPECT_EQ(reduce_scatter->reduce, ncclSum);
  EXPECT_EQ(reduce_scatter->bytes, 16);  // input.nbytes()

  const Tensor part = FakeGpuTensor(DType::kU16, {3});
  const Tensor whole = FakeGpuTensor(DType::kU16, {12});
  auto all_gather = internal::PlanAllGather(caller, part, whole);
  NF_ASSERT_OK(all_gather);
  EXPECT_EQ(all_gather->count, 6u);  // the input's bytes
  EXPECT_EQ(all_gather->type, ncclUint8);
  EXPECT_EQ(all_gather->bytes, 24);  // output.nbytes()

  const Tensor ids = FakeGpuTensor(DType::kI64, {5});
  auto broadcast = internal::PlanBroadcast(caller, ids, 3);
  NF_ASSERT_OK(broadcast);
  EXPECT_EQ(broadcast->count, 40u);
  EXPECT_EQ(broadcast->peer, 3);
  EXPECT_EQ(broadcast->bytes, 40);

  auto send = internal::PlanPointToPoint(caller, CommOp::kSend, ids, 2);
  NF_ASSERT_OK(send);
  EXPECT_EQ(send->send, ids.raw_data());
  EXPECT_EQ(send->count, 40u);
  EXPECT_EQ(send->peer, 2);
  auto recv = internal::PlanPointToPoint(caller, CommOp::kRecv, ids, 0);
  NF_ASSERT_OK(recv);
  EXPECT_EQ(recv->recv, ids.raw_data());
  EXPECT_EQ(recv->bytes, 40);
}

TEST(NcclHostTest, RefusesTensorsThatAreNotOnTheCommunicatorsDevice) {
  const NcclCaller on_0 = {.group = "tp", .rank = 0, .size = 2, .device = 0};
  const Tensor cpu = TensorOf(DType::kF32, {4}, {1, 2, 3, 4});
  ExpectInvalidArgument(internal::PlanAllReduce(on_0, cpu, ReduceOp::kSum).status(),
                        "all_reduce on group tp",
                        "tensor f32[4] on cpu is not on cuda:0, the device of this NCCL "
                        "communicator (CPU tensors go through MpiCommunicator)");
  const NcclCaller on_1 = {.group = "tp", .rank = 0, .size = 2, .device = 1};
  const Tensor gpu0 = FakeGpuTensor(DType::kF32, {4});
  ExpectInvalidArgument(internal::PlanBroadcast(on_1, gpu0, 0).status(), "broadcast on group tp",
                        "tensor f32[4] on cuda:0 is not on cuda:1, the device of this NCCL "
                        "communicator");
  const Tensor gpu_half = FakeGpuTensor(DType::kF32, {2});
  const Tensor cpu8 = TensorOf(DType::kF32, {8}, std::vector<double>(8, 0));
  ExpectInvalidArgument(
      internal::PlanReduceScatter(on_0, FakeGpuTensor(DType::kF32, {8}), cpu).status(),
      "reduce_scatter on group tp", "output f32[4] on cpu is not on cuda:0");
  ExpectInvalidArgument(internal::PlanReduceScatter(on_0, cpu, gpu_half).status(),
                        "reduce_scatter on group tp", "input f32[4] on cpu is not on cuda:0");
  ExpectInvalidArgument(internal::PlanAllGather(on_0, gpu0, cpu8).status(),
                        "all_gather on group tp", "output f32[8] on cpu");
  ExpectInvalidArgument(internal::PlanPointToPoint(on_0, CommOp::kSend, cpu, 1).status(),
                        "send on group tp", "tensor f32[4] on cpu is not on cuda:0");
  ExpectInvalidArgument(internal::PlanPointToPoint(on_0, CommOp::kRecv, cpu, 1).status(),
                        "recv on group tp", "tensor f32[4] on cpu is not on cuda:0");
}

// The checks every communicator shares (comm_checks.h) come first, with the same messages.
TEST(NcclHostTest, RefusesWhatEveryCommunicatorRefuses) {
  const NcclCaller caller = {.group = "dp", .rank = 0, .size = 2, .device = 0};
  ExpectInvalidArgument(
      internal::PlanAllReduce(caller, FakeGpuTensor(DType::kU8, {4}), ReduceOp::kSum).status(),
      "all_reduce on group dp", "has dtype u8; reductions take f32, f64, f16, bf16, i32 or i64");
  ExpectInvalidArgument(internal::PlanAllReduce(caller, Tensor(), ReduceOp::kSum).status(),
                        "all_reduce on group dp", "tensor is an undefined tensor");
  ExpectInvalidArgument(internal::PlanAllGather(caller, FakeGpuTensor(DType::kF32, {4}),
                                                FakeGpuTensor(DType::kF32, {6}))
                            .status(),
                        "all_gather on group dp", "2 ranks x input f32[4] on cuda:0 need 8");
  ExpectInvalidArgument(internal::PlanReduceScatter(caller, FakeGpuTensor(DType::kF32, {4}),
                                                    FakeGpuTensor(DType::kF16, {2}))
                            .status(),
                        "reduce_scatter on group dp", "differ in dtype");
  const Tensor t = FakeGpuTensor(DType::kF32, {4});
  ExpectInvalidArgument(internal::PlanPointToPoint(caller, CommOp::kSend, t, 0).status(),
                        "send on group dp", "peer 0 is this rank");
  ExpectInvalidArgument(internal::PlanPointToPoint(caller, CommOp::kRecv, t, 2).status(),
                        "recv on group dp", "peer 2 is out of range for a group of 2 ranks");
  ExpectInvalidArgument(internal::PlanBroadcast(caller, t, -1).status(), "broadcast on group dp",
                        "root -1 is out of range");
}

TEST(NcclHostTest, TakesNcclsInPlaceLayoutsAndRefusesOtherOverlaps) {
  const NcclCaller rank2 = {.group = "dp", .rank = 2, .size = 4, .device = 0};
  const Tensor whole = FakeGpuTensor(DType::kF32, {12});
  const Tensor block2 = *whole.View(6, {3});  // rank 2's block
  auto gather = internal::PlanAllGather(rank2, block2, whole);
  NF_ASSERT_OK(gather);
  EXPECT_EQ(gather->send, block2.raw_data());
  EXPECT_EQ(gather->recv, whole.raw_data());
  auto scatter = internal::PlanReduceScatter(rank2, whole, block2);
  NF_ASSERT_OK(scatter);
  EXPECT_EQ(scatter->recv, block2.raw_data());

  const Tensor block0 = *whole.View(0, {3});
  ExpectInvalidArgument(internal::PlanAllGather(rank2, block0, whole).status(),
                        "all_gather on group dp",
                        "input f32[3] on cuda:0 overlaps output f32[12] on cuda:0 other than as "
                        "rank 2's block of it; NCCL takes separate buffers or that in-place "
                        "layout");
  const Tensor straddling = *whole.View(5, {3});
  ExpectInvalidArgument(internal::PlanReduceScatter(rank2, whole, straddling).status(),
                        "reduce_scatter on group dp", "output f32[3] on cuda:0 overlaps input");
  // Separate buffers in one storage are not an overlap.
  const Tensor storage = FakeGpuTensor(DType::kF32, {15});
  NF_EXPECT_OK(internal::PlanAllGather(rank2, *storage.View(12, {3}), *storage.View(0, {12})));
}

// Whatever this machine has, device 99 is not one of its devices: every rank of the group
// returns an error instead of entering NCCL (the ranks agree first, over MPI).
TEST(NcclHostTest, CreateRefusesADeviceTheProcessDoesNotHave) {
  auto comm = NcclCommunicator::Create(World(), 99, nullptr);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("create NCCL communicator on group world: "));
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    ExpectInvalidArgument(comm.status(),
                          absl::StrCat("device 99 is not one of the ", count, " CUDA devices"));
  } else {
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr("cudaGetDeviceCount failed: "));
  }
}

TEST(NcclHostTest, DeviceGroupsNeedACudaDevice) {
  const ProcessGroups groups = SingleProcessGroups();
  ExpectInvalidArgument(CreateDeviceGroups(groups, Device::Cpu()).status(),
                        "device groups need a CUDA device, not cpu");
}

// ---- On a GPU -----------------------------------------------------------------------------------

// Device memory straight from cudaMalloc, so the test depends on nothing but the runtime.
class CudaTestAllocator final : public Allocator {
 public:
  explicit CudaTestAllocator(int device) : device_(device) {}
  Device device() const override { return Device::Cuda(device_); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t error = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes);
    if (error != cudaSuccess) return absl::ResourceExhaustedError(cudaGetErrorString(error));
    return ptr;
  }
  void Deallocate(void* ptr, size_t /*bytes*/) override { cudaFree(ptr); }

 private:
  int device_;
};

class NcclCommunicatorGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess || count == 0) {
      GTEST_SKIP() << "needs a CUDA device; cudaGetDeviceCount reports "
                   << (error != cudaSuccess ? cudaGetErrorString(error) : "0 devices");
    }
    device_ = World().rank();
    ASSERT_LT(device_, count) << "one GPU per rank: run with at most " << count << " ranks";
    ASSERT_EQ(cudaSetDevice(device_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    allocator_ = std::make_unique<CudaTestAllocator>(device_);
    auto comm = NcclCommunicator::Create(World(), device_, compute_,
                                         {.watchdog = {.timeout = absl::Seconds(30)}});
    NF_ASSERT_OK(comm);
    comm_ = *std::move(comm);
  }

  void TearDown() override {
    comm_.reset();
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }

  // A device copy of a host tensor.
  Tensor ToDevice(const Tensor& host) {
    auto t = Tensor::Empty(host.dtype(), host.shape(), *allocator_);
    NF_EXPECT_OK(t);
    EXPECT_EQ(cudaMemcpy(t->raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    return *t;
  }
  Tensor DeviceOf(DType dtype, Shape shape, const std::vector<double>& values) {
    return ToDevice(TensorOf(dtype, std::move(shape), values));
  }
  // The values of a device tensor, read after everything issued on the compute stream.
  std::vector<double> DeviceValues(const Tensor& device) {
    EXPECT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    auto host = Tensor::HostEmpty(device.dtype(), device.shape());
    NF_EXPECT_OK(host);
    EXPECT_EQ(
        cudaMemcpy(host->raw_data(), device.raw_data(), device.nbytes(), cudaMemcpyDeviceToHost),
        cudaSuccess);
    return Values(*host);
  }

  int device_ = 0;
  cudaStream_t compute_ = nullptr;
  std::unique_ptr<CudaTestAllocator> allocator_;
  std::unique_ptr<NcclCommunicator> comm_;
};

// As in collectives_mpi.cc: small multiples of 1/4 (integers for integer dtypes), whose sums
// are exact in every dtype and order, so results compare exactly even where NCCL rounds fp16
// and bf16 at every hop.
double Contribution(DType dtype, int rank, int64_t i) {
  const double base = static_cast<double>((rank * 7 + i * 3) % 17) - 8.0;
  return dtype == DType::kI32 || dtype == DType::kI64 ? base : base / 4;
}

std::vector<double> Contributions(DType dtype, int rank, int64_t n, int64_t first = 0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Contribution(dtype, rank, first + i);
  return v;
}

std::vector<double> Reduced(DType dtype, int ranks, int64_t n, ReduceOp op, int64_t first = 0) {
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Contribution(dtype, 0, first + i);
    for (int r = 1; r < ranks; ++r) {
      const double v = Contribution(dtype, r, first + i);
      out[i] = op == ReduceOp::kSum ? out[i] + v : std::max(out[i], v);
    }
  }
  return out;
}

TEST_F(NcclCommunicatorGpuTest, DescribesItsGroupAndUsesItsOwnNonBlockingStream) {
  EXPECT_EQ(comm_->name(), "world");
  EXPECT_EQ(comm_->rank(), World().rank());
  EXPECT_EQ(comm_->size(), World().size());
  EXPECT_EQ(comm_->world_ranks(), World().world_ranks());
  EXPECT_EQ(comm_->device(), device_);
  EXPECT_EQ(comm_->compute_stream(), compute_);
  ASSERT_NE(comm_->comm_stream(), compute_);
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(comm_->comm_stream(), &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
  // At the device's greatest priority, ahead of the compute stream's kernels.
  int least = 0, greatest = 0, priority = 1;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(comm_->comm_stream(), &priority), cudaSuccess);
  EXPECT_EQ(priority, greatest);
}

// A process that never reads stats() (nf-generate: an all-reduce per layer and token) keeps at
// most SettlingQueue's capacity of operations, not one per operation of the run: each Wait()
// settles the completed ones first.
TEST_F(NcclCommunicatorGpuTest, WaitedOperationsStayBoundedWithoutStats) {
  const Tensor t = DeviceOf(DType::kF32, {4}, {1, 2, 3, 4});
  constexpr int kOperations = 3 * static_cast<int>(SettlingQueue<int>::kDefaultCapacity);
  for (int i = 0; i < kOperations; ++i) {
    NF_ASSERT_OK(comm_->AllReduce(t, ReduceOp::kMax));
    if (i % 512 == 511) {
      ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    }
    ASSERT_LE(comm_->unsettled_operations(), SettlingQueue<int>::kDefaultCapacity);
  }
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  NF_ASSERT_OK(comm_->AllReduce(t, ReduceOp::kMax));
  // Everything before the last synchronisation completed and was settled by a later Wait().
  EXPECT_LE(comm_->unsettled_operations(), 1u);
  EXPECT_EQ(Calls(comm_->stats(), CommOp::kAllReduce), kOperations + 1);
}

TEST_F(NcclCommunicatorGpuTest, AllReduceSumAndMaxInEveryDtype) {
  const int n = comm_->size(), r = comm_->rank();
  for (DType dtype : kReducible) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << (op == ReduceOp::kSum ? " sum" : " max"));
      const Tensor t = DeviceOf(dtype, {3, 5}, Contributions(dtype, r, 15));
      NF_ASSERT_OK(comm_->AllReduce(t, op));
      EXPECT_THAT(DeviceValues(t), ElementsAreArray(Reduced(dtype, n, 15, op)));
      const Tensor u = DeviceOf(dtype, {7}, Contributions(dtype, r, 7));
      auto handle = comm_->AllReduceAsync(u, op);
      NF_ASSERT_OK(handle);
      NF_ASSERT_OK((*handle)->Wait());
      EXPECT_THAT(DeviceValues(u), ElementsAreArray(Reduced(dtype, n, 7, op)));
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, ReduceScatterGivesEachRankItsSliceOfTheSum) {
  const int n = comm_->size(), r = comm_->rank();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor input = DeviceOf(dtype, {n, 4}, Contributions(dtype, r, 4 * n));
    const Tensor output = DeviceOf(dtype, {2, 2}, {0, 0, 0, 0});
    NF_ASSERT_OK(comm_->ReduceScatter(input, output));
    EXPECT_THAT(DeviceValues(output),
                ElementsAreArray(Reduced(dtype, n, 4, ReduceOp::kSum, 4 * r)));
    // In place: the output is this rank's block of the input.
    const Tensor again = DeviceOf(dtype, {4 * n}, Contributions(dtype, r, 4 * n));
    const Tensor block = *again.View(4 * r, {4});
    auto handle = comm_->ReduceScatterAsync(again, block);
    NF_ASSERT_OK(handle);
    NF_ASSERT_OK((*handle)->Wait());
    EXPECT_THAT(DeviceValues(block), ElementsAreArray(Reduced(dtype, n, 4, ReduceOp::kSum, 4 * r)));
  }
}

TEST_F(NcclCommunicatorGpuTest, AllGatherConcatenatesInRankOrder) {
  const int n = comm_->size(), r = comm_->rank();
  for (DType dtype : {DType::kI32, DType::kF16, DType::kU8, DType::kF64}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto part = [](int rank) {
      std::vector<double> v(6);
      for (int i = 0; i < 6; ++i) v[i] = rank * 10 + i;
      return v;
    };
    std::vector<double> expected;
    for (int k = 0; k < n; ++k) {
      const std::vector<double> p = part(k);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    const Tensor input = DeviceOf(dtype, {2, 3}, part(r));
    const Tensor output = DeviceOf(dtype, {2 * n, 3}, std::vector<double>(6 * n, 99));
    NF_ASSERT_OK(comm_->AllGather(input, output));
    EXPECT_THAT(DeviceValues(output), ElementsAreArray(expected));
    // In place: the input is this rank's block of the output (ZeRO's gather).
    std::vector<double> initial(6 * n, 99);
    for (int i = 0; i < 6; ++i) initial[6 * r + i] = part(r)[i];
    const Tensor gathered = DeviceOf(dtype, {6 * n}, initial);
    auto handle = comm_->AllGatherAsync(*gathered.View(6 * r, {6}), gathered);
    NF_ASSERT_OK(handle);
    NF_ASSERT_OK((*handle)->Wait());
    EXPECT_THAT(DeviceValues(gathered), ElementsAreArray(expected));
  }
}

TEST_F(NcclCommunicatorGpuTest, BroadcastCopiesTheRootsTensor) {
  const int root = comm_->size() - 1;
  for (DType dtype : {DType::kU16, DType::kF64, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<double> values = {3, 1, 4, 1, 5};
    const Tensor t =
        DeviceOf(dtype, {5}, comm_->rank() == root ? values : std::vector<double>(5, 0));
    NF_ASSERT_OK(comm_->Broadcast(t, root));
    EXPECT_THAT(DeviceValues(t), ElementsAreArray(values));
  }
}

// A collective reads what the compute stream wrote before it, though it runs on another
// stream: a large memset queued first keeps the compute stream busy while the call is issued.
TEST_F(NcclCommunicatorGpuTest, CollectivesRunAfterTheComputeStreamsEarlierWork) {
  const int n = comm_->size(), r = comm_->rank();
  auto busy = Tensor::Empty(DType::kU8, {int64_t{1} << 30}, *allocator_);
  NF_ASSERT_OK(busy);
  const Tensor input = DeviceOf(DType::kU8, {1 << 20}, std::vector<double>(1 << 20, 0));
  const Tensor output = DeviceOf(DType::kU8, {n << 20}, std::vector<double>(n << 20, 0));
  for (int round = 1; round <= 3; ++round) {
    ASSERT_EQ(cudaMemsetAsync(busy->raw_data(), round, busy->nbytes(), compute_), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(input.raw_data(), 16 * round + r, input.nbytes(), compute_),
              cudaSuccess);
    NF_ASSERT_OK(comm_->AllGather(input, output));
    const std::vector<double> got = DeviceValues(output);
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(got[static_cast<size_t>(k) << 20], 16 * round + k) << "round " << round;
      EXPECT_EQ(got[((static_cast<size_t>(k) + 1) << 20) - 1], 16 * round + k);
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, CountsBytesAsTheInterfaceSays) {
  const int n = comm_->size();
  comm_->ResetStats();
  const Tensor h = DeviceOf(DType::kF16, {10}, std::vector<double>(10, 1));
  const Tensor d = DeviceOf(DType::kF64, {3}, {1, 2, 3});
  const Tensor in = DeviceOf(DType::kF32, {4 * n}, std::vector<double>(4 * n, 1));
  const Tensor out = DeviceOf(DType::kF32, {4}, std::vector<double>(4, 0));
  NF_ASSERT_OK(comm_->AllReduce(h, ReduceOp::kSum));
  NF_ASSERT_OK(comm_->Broadcast(d, 0));
  NF_ASSERT_OK(comm_->ReduceScatter(in, out));
  NF_ASSERT_OK(comm_->AllGather(out, in));
  NF_ASSERT_OK(comm_->Barrier());
  const CommStats& s = comm_->stats();
  EXPECT_EQ(Bytes(s, CommOp::kAllReduce), 20);
  EXPECT_EQ(Bytes(s, CommOp::kBroadcast), 24);
  EXPECT_EQ(Bytes(s, CommOp::kReduceScatter), 16 * n);  // input.nbytes()
  EXPECT_EQ(Bytes(s, CommOp::kAllGather), 16 * n);      // output.nbytes()
  EXPECT_EQ(Bytes(s, CommOp::kBarrier), 0);
  for (CommOp op : {CommOp::kAllReduce, CommOp::kBroadcast, CommOp::kReduceScatter,
                    CommOp::kAllGather, CommOp::kBarrier}) {
    EXPECT_EQ(Calls(s, op), 1) << CommOpName(op);
  }
  EXPECT_EQ(s.total_bytes(), 20 + 24 + 32 * n);
}

TEST_F(NcclCommunicatorGpuTest, RefusesBeforeIssuingAndCountsNothing) {
  comm_->ResetStats();
  const Tensor cpu = TensorOf(DType::kF32, {4}, {1, 2, 3, 4});
  ExpectInvalidArgument(comm_->AllReduce(cpu, ReduceOp::kSum), "all_reduce on group world",
                        absl::StrCat("tensor f32[4] on cpu is not on cuda:", device_,
                                     ", the device of this NCCL communicator"));
  const Tensor gpu = DeviceOf(DType::kF32, {4}, {1, 2, 3, 4});
  ExpectInvalidArgument(comm_->AllGather(gpu, cpu), "all_gather on group world",
                        "output f32[4] on cpu");
  ExpectInvalidArgument(comm_->AllReduce(DeviceOf(DType::kU8, {2}, {1, 2}), ReduceOp::kMax),
                        "all_reduce on group world", "has dtype u8");
  ExpectInvalidArgument(comm_->Send(gpu, comm_->rank()), "send on group world", "is this rank");
  ExpectInvalidArgument(comm_->RecvAsync(gpu, comm_->size()).status(), "recv on group world",
                        "out of range");
  ExpectInvalidArgument(comm_->Broadcast(gpu, -1), "broadcast on group world", "root -1");
  EXPECT_EQ(comm_->stats().total_bytes(), 0);
  for (int64_t calls : comm_->stats().calls) EXPECT_EQ(calls, 0);
  EXPECT_EQ(DeviceValues(gpu), (std::vector<double>{1, 2, 3, 4}));
}

TEST_F(NcclCommunicatorGpuTest, HandlesAreWaitedForOnceAndMayOutliveTheCommunicator) {
  const Tensor t = DeviceOf(DType::kF32, {4}, Contributions(DType::kF32, comm_->rank(), 4));
  auto handle = comm_->AllReduceAsync(t, ReduceOp::kSum);
  NF_ASSERT_OK(handle);
  comm_.reset();  // the handle keeps the NCCL communicator and its streams
  NF_ASSERT_OK((*handle)->Wait());
  EXPECT_THAT(DeviceValues(t),
              ElementsAreArray(Reduced(DType::kF32, World().size(), 4, ReduceOp::kSum)));
  const absl::Status twice = (*handle)->Wait();
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  EXPECT_THAT(std::string(twice.message()), HasSubstr("Wait() called twice"));
}

// A group of one member makes no NCCL communicator (in a job of one rank, none does); a
// larger one is NCCL's.
TEST_F(NcclCommunicatorGpuTest, DeviceGroupsOfOneRankStayLocal) {
  auto groups = CreateProcessGroups({});
  NF_ASSERT_OK(groups);
  auto device_groups = CreateDeviceGroups(*groups, Device::Cuda(device_));
  NF_ASSERT_OK(device_groups);
  const std::pair<const char*, Communicator*> made[] = {
      {"tp", device_groups->tp.get()},
      {"dp", device_groups->dp.get()},
      {"pp", device_groups->pp.get()},
      {"embedding", device_groups->embedding.get()}};
  for (const auto& [name, comm] : made) {
    ASSERT_NE(comm, nullptr) << name;
    EXPECT_EQ(comm->name(), name);
    EXPECT_EQ(dynamic_cast<LocalCommunicator*>(comm) != nullptr, comm->size() == 1) << name;
  }
}

}  // namespace
}  // namespace nf::parallel
