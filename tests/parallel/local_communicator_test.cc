// Tests of parallel/local_communicator.h: identities and copies, the same refusals as the MPI
// communicator (messages naming op, group and tensor), byte counting, and CommOpName.
#include "parallel/local_communicator.h"

#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::TensorOf;
using ::nf::testing::Values;
using ::testing::ElementsAre;

TEST(LocalCommunicatorTest, IsRankZeroOfOne) {
  LocalCommunicator comm("tp");
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.name(), "tp");
  EXPECT_EQ(LocalCommunicator().name(), "world");
}

TEST(LocalCommunicatorTest, CollectivesAreIdentities) {
  LocalCommunicator comm("dp");
  for (DType dtype :
       {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor x = TensorOf(dtype, {2, 2}, {1, -2, 3, 4});
    NF_ASSERT_OK(comm.AllReduce(x, ReduceOp::kSum));
    NF_ASSERT_OK(comm.AllReduce(x, ReduceOp::kMax));
    auto handle = comm.AllReduceAsync(x, ReduceOp::kSum);
    NF_ASSERT_OK(handle);
    NF_ASSERT_OK((*handle)->Wait());
    NF_ASSERT_OK(comm.Broadcast(x, 0));
    EXPECT_THAT(Values(x), ElementsAre(1, -2, 3, 4));

    const Tensor gathered = TensorOf(dtype, {4}, {0, 0, 0, 0});
    NF_ASSERT_OK(comm.AllGather(x, gathered));
    EXPECT_THAT(Values(gathered), ElementsAre(1, -2, 3, 4));
    const Tensor scattered = TensorOf(dtype, {4}, {0, 0, 0, 0});
    NF_ASSERT_OK(comm.ReduceScatter(x, scattered));
    EXPECT_THAT(Values(scattered), ElementsAre(1, -2, 3, 4));
  }
  NF_ASSERT_OK(comm.Barrier());
  // AllGather copies any dtype, including in place.
  const Tensor bytes = TensorOf(DType::kU8, {3}, {7, 8, 9});
  NF_ASSERT_OK(comm.AllGather(bytes, bytes));
  EXPECT_THAT(Values(bytes), ElementsAre(7, 8, 9));
}

TEST(LocalCommunicatorTest, SendAndRecvHaveNoPeer) {
  LocalCommunicator comm("pp");
  const Tensor x = TensorOf(DType::kF32, {4}, {1, 2, 3, 4});
  ExpectInvalidArgument(comm.Send(x, 1), "send on group pp",
                        "peer 1 is out of range for a group of 1 rank (tensor f32[4] on cpu)");
  ExpectInvalidArgument(comm.Recv(x, 0), "recv on group pp",
                        "peer 0 is this rank (tensor f32[4] on cpu)");
  ExpectInvalidArgument(comm.SendAsync(x, 1).status(), "send on group pp", "peer 1");
  ExpectInvalidArgument(comm.RecvAsync(x, 1).status(), "recv on group pp", "peer 1");
  EXPECT_EQ(comm.stats().total_bytes(), 0);
  EXPECT_EQ(comm.stats().calls[static_cast<int>(CommOp::kSend)], 0);
}

TEST(LocalCommunicatorTest, RefusesWhatAGroupOfManyWouldRefuse) {
  LocalCommunicator comm("tp");
  ExpectInvalidArgument(comm.AllReduce(Tensor(), ReduceOp::kSum), "all_reduce on group tp",
                        "tensor is an undefined tensor");
  ExpectInvalidArgument(comm.AllReduce(TensorOf(DType::kU8, {2}, {1, 2}), ReduceOp::kSum),
                        "all_reduce on group tp",
                        "tensor u8[2] on cpu has dtype u8; reductions take f32, f64, f16, bf16, "
                        "i32 or i64");
  ExpectInvalidArgument(
      comm.AllGather(TensorOf(DType::kF32, {2}, {1, 2}), TensorOf(DType::kF32, {3}, {0, 0, 0})),
      "all_gather on group tp",
      "output f32[3] on cpu has 3 elements; 1 ranks x input f32[2] on cpu need 2");
  ExpectInvalidArgument(
      comm.AllGather(TensorOf(DType::kF32, {2}, {1, 2}), TensorOf(DType::kF16, {2}, {0, 0})),
      "all_gather on group tp", "output f16[2] on cpu and input f32[2] on cpu differ in dtype");
  ExpectInvalidArgument(comm.ReduceScatter(TensorOf(DType::kF32, {4}, {1, 2, 3, 4}),
                                           TensorOf(DType::kF32, {2}, {0, 0})),
                        "reduce_scatter on group tp",
                        "input f32[4] on cpu has 4 elements; 1 ranks x output f32[2] on cpu "
                        "need 2");
  ExpectInvalidArgument(comm.Broadcast(TensorOf(DType::kF32, {1}, {1}), 1), "broadcast on group tp",
                        "root 1 is out of range for a group of 1 rank (tensor f32[1] on cpu)");
  EXPECT_EQ(comm.stats().total_bytes(), 0);
  for (int64_t calls : comm.stats().calls) EXPECT_EQ(calls, 0);
}

TEST(LocalCommunicatorTest, CountsThePayloadOfEachCall) {
  LocalCommunicator comm;
  const Tensor x = TensorOf(DType::kBF16, {3, 4}, std::vector<double>(12, 1.0));  // 24 bytes
  const Tensor y = TensorOf(DType::kBF16, {12}, std::vector<double>(12, 0.0));
  NF_ASSERT_OK(comm.AllReduce(x, ReduceOp::kSum));
  NF_ASSERT_OK(comm.AllReduce(x, ReduceOp::kMax));
  NF_ASSERT_OK(comm.ReduceScatter(x, y));
  NF_ASSERT_OK(comm.AllGather(x, y));
  NF_ASSERT_OK(comm.Broadcast(x, 0));
  NF_ASSERT_OK(comm.Barrier());
  const CommStats& s = comm.stats();
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kAllReduce)], 48);
  EXPECT_EQ(s.calls[static_cast<int>(CommOp::kAllReduce)], 2);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kReduceScatter)], 24);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kAllGather)], 24);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kBroadcast)], 24);
  EXPECT_EQ(s.bytes[static_cast<int>(CommOp::kBarrier)], 0);
  EXPECT_EQ(s.calls[static_cast<int>(CommOp::kBarrier)], 1);
  EXPECT_EQ(s.total_bytes(), 120);
  comm.ResetStats();
  EXPECT_EQ(comm.stats().total_bytes(), 0);
  EXPECT_EQ(comm.stats().calls[static_cast<int>(CommOp::kAllReduce)], 0);
}

TEST(LocalCommunicatorTest, ReductionsTouchNoMemorySoTakeDeviceTensors) {
  LocalCommunicator comm("tp");
  const Tensor gpu = testing::FakeGpuTensor(DType::kF16, {8});
  NF_EXPECT_OK(comm.AllReduce(gpu, ReduceOp::kSum));
  NF_EXPECT_OK(comm.Broadcast(gpu, 0));
  EXPECT_EQ(comm.stats().total_bytes(), 32);
  ExpectInvalidArgument(comm.AllGather(TensorOf(DType::kF16, {8}, std::vector<double>(8, 0)), gpu),
                        "all_gather on group tp",
                        "input f16[8] on cpu and output f16[8] on cuda:0 are on different "
                        "devices");
}

TEST(CommOpNameTest, NamesEveryOperation) {
  EXPECT_EQ(CommOpName(CommOp::kAllReduce), "all_reduce");
  EXPECT_EQ(CommOpName(CommOp::kReduceScatter), "reduce_scatter");
  EXPECT_EQ(CommOpName(CommOp::kAllGather), "all_gather");
  EXPECT_EQ(CommOpName(CommOp::kBroadcast), "broadcast");
  EXPECT_EQ(CommOpName(CommOp::kSend), "send");
  EXPECT_EQ(CommOpName(CommOp::kRecv), "recv");
  EXPECT_EQ(CommOpName(CommOp::kBarrier), "barrier");
}

}  // namespace
}  // namespace nf::parallel
