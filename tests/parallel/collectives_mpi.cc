// Tests of parallel/mpi_communicator.h, run by mpirun on 2 and 4 ranks (nf_add_mpi_test).
// Every rank computes the expected result of each collective locally from the values every
// rank contributes; the values are small multiples of 1/4 (integers for integer dtypes), whose
// sums are exact in every dtype and every reduction order, so results compare exactly.
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mpi_test_util.h"
#include "parallel/mpi_communicator.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::TensorOf;
using ::nf::testing::Values;
using ::nf::testing::World;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr DType kReducible[] = {DType::kF32,  DType::kF64, DType::kF16,
                                DType::kBF16, DType::kI32, DType::kI64};

// What rank `rank` contributes at element `i`: in [-2, 2] in steps of 1/4 for floating dtypes,
// in [-8, 8] for integers.
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

int64_t Bytes(const CommStats& s, CommOp op) { return s.bytes[static_cast<int>(op)]; }
int64_t Calls(const CommStats& s, CommOp op) { return s.calls[static_cast<int>(op)]; }

TEST(MpiCommunicatorTest, WorldSpansTheJob) {
  MpiCommunicator& world = World();
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(world.size(), size);
  EXPECT_EQ(world.rank(), rank);
  EXPECT_EQ(world.name(), "world");
  std::vector<int> all(size);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(world.world_ranks(), all);
  EXPECT_NE(world.comm(), MPI_COMM_WORLD);  // a duplicate: its own message space
}

TEST(MpiCommunicatorTest, AllReduceSumAndMaxInEveryDtype) {
  MpiCommunicator& world = World();
  for (DType dtype : kReducible) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << (op == ReduceOp::kSum ? " sum" : " max"));
      const Tensor t = TensorOf(dtype, {3, 5}, Contributions(dtype, world.rank(), 15));
      NF_ASSERT_OK(world.AllReduce(t, op));
      EXPECT_THAT(Values(t), ElementsAreArray(Reduced(dtype, world.size(), 15, op)));
    }
  }
}

// fp16/bf16 are summed in fp32 and rounded once: rank 0 contributes a large value, every other
// rank a small one that alone would round away. Summed in the 16-bit type, 1024 + 0.5 + 0.5 +
// 0.5 stays 1024 (each addition ties to even); in fp32 it is 1025.5, which rounds to 1026.
TEST(MpiCommunicatorTest, HalfPrecisionIsReducedInFp32AndRoundedOnce) {
  MpiCommunicator& world = World();
  const int others = world.size() - 1;
  struct Case {
    DType dtype;
    double big, small[2];
  };
  for (const Case& c : {Case{DType::kF16, 1024, {0.5, 0.75}}, Case{DType::kBF16, 256, {1, 1.5}}}) {
    SCOPED_TRACE(DTypeName(c.dtype));
    const bool first = world.rank() == 0;
    const Tensor t =
        TensorOf(c.dtype, {2}, {first ? c.big : c.small[0], first ? c.big : c.small[1]});
    NF_ASSERT_OK(world.AllReduce(t, ReduceOp::kSum));
    const std::vector<double> expected =
        Values(TensorOf(c.dtype, {2}, {c.big + others * c.small[0], c.big + others * c.small[1]}));
    EXPECT_THAT(Values(t), ElementsAreArray(expected));
  }
  if (world.size() == 4) {
    const Tensor h = TensorOf(DType::kF16, {1}, {world.rank() == 0 ? 1024.0 : 0.5});
    NF_ASSERT_OK(world.AllReduce(h, ReduceOp::kSum));
    EXPECT_EQ(Values(h)[0], 1026.0);
    const Tensor b = TensorOf(DType::kBF16, {1}, {world.rank() == 0 ? 256.0 : 1.0});
    NF_ASSERT_OK(world.AllReduce(b, ReduceOp::kSum));
    EXPECT_EQ(Values(b)[0], 260.0);
  }
}

TEST(MpiCommunicatorTest, ReduceScatterGivesEachRankItsSliceOfTheSum) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor input = TensorOf(dtype, {n, 4}, Contributions(dtype, r, 4 * n));
    const Tensor output = TensorOf(dtype, {2, 2}, {0, 0, 0, 0});
    NF_ASSERT_OK(world.ReduceScatter(input, output));
    EXPECT_EQ(output.shape(), Shape({2, 2}));
    EXPECT_THAT(Values(output), ElementsAreArray(Reduced(dtype, n, 4, ReduceOp::kSum, 4 * r)));
    // The output may be this rank's slice of the input (reduced through a scratch).
    const Tensor again = TensorOf(dtype, {4 * n}, Contributions(dtype, r, 4 * n));
    const Tensor slice = *again.View(4 * r, {4});
    NF_ASSERT_OK(world.ReduceScatter(again, slice));
    EXPECT_THAT(Values(slice), ElementsAreArray(Reduced(dtype, n, 4, ReduceOp::kSum, 4 * r)));
  }
}

TEST(MpiCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  for (DType dtype : {DType::kI32, DType::kF16, DType::kU8, DType::kF64}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto part = [&](int rank) {
      std::vector<double> v(6);
      for (int i = 0; i < 6; ++i) v[i] = rank * 10 + i;
      return v;
    };
    std::vector<double> expected;
    for (int k = 0; k < n; ++k) {
      const auto p = part(k);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    const Tensor input = TensorOf(dtype, {2, 3}, part(r));
    const Tensor output = TensorOf(dtype, {2 * n, 3}, std::vector<double>(6 * n, 99));
    NF_ASSERT_OK(world.AllGather(input, output));
    EXPECT_THAT(Values(output), ElementsAreArray(expected));

    // In place: the input is this rank's block of the output.
    const Tensor gathered = TensorOf(dtype, {6 * n}, std::vector<double>(6 * n, 99));
    testing::SetValues(*gathered.View(6 * r, {6}), part(r));
    NF_ASSERT_OK(world.AllGather(*gathered.View(6 * r, {6}), gathered));
    EXPECT_THAT(Values(gathered), ElementsAreArray(expected));

    // Overlapping the output elsewhere (rank 0's block for every rank): gathered from a copy.
    const Tensor overlapped = TensorOf(dtype, {6 * n}, std::vector<double>(6 * n, 99));
    testing::SetValues(*overlapped.View(0, {6}), part(r));
    NF_ASSERT_OK(world.AllGather(*overlapped.View(0, {6}), overlapped));
    EXPECT_THAT(Values(overlapped), ElementsAreArray(expected));
  }
}

TEST(MpiCommunicatorTest, BroadcastCopiesTheRootsTensor) {
  MpiCommunicator& world = World();
  const int root = world.size() - 1;
  for (DType dtype : {DType::kU16, DType::kF64, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<double> values = {3, 1, 4, 1, 5};
    const Tensor t =
        TensorOf(dtype, {5}, world.rank() == root ? values : std::vector<double>(5, 0));
    NF_ASSERT_OK(world.Broadcast(t, root));
    EXPECT_THAT(Values(t), ElementsAreArray(values));
  }
}

// The helpers other communicators are set up with (the NCCL id, agreeing that every rank is
// ready) move bytes and ints without counting them as the training's traffic.
TEST(MpiCommunicatorTest, SetupHelpersBroadcastBytesAndTakeTheMaxUncounted) {
  MpiCommunicator& world = World();
  const int root = world.size() - 1;
  const CommStats before = world.stats();
  std::vector<uint8_t> bytes(5, 0);
  if (world.rank() == root) bytes = {1, 2, 3, 250, 5};
  NF_ASSERT_OK(world.BroadcastBytes(absl::MakeSpan(bytes), root));
  EXPECT_THAT(bytes, ElementsAreArray({1, 2, 3, 250, 5}));
  const absl::StatusOr<int> max = world.MaxOverGroup(world.rank() * 3 - 1);
  NF_ASSERT_OK(max);
  EXPECT_EQ(*max, root * 3 - 1);
  EXPECT_EQ(world.stats().bytes, before.bytes);
  EXPECT_EQ(world.stats().calls, before.calls);
}

TEST(MpiCommunicatorTest, SendRecvAroundTheRing) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto message = [](int from) { return std::vector<double>{from * 1.0, from + 0.5, -from * 2.0}; };
  // Blocking: even ranks send first, odd ranks receive first, so every send meets its receive.
  const Tensor out = TensorOf(DType::kBF16, {3}, message(r));
  const Tensor in = TensorOf(DType::kBF16, {3}, {0, 0, 0});
  if (r % 2 == 0) {
    NF_ASSERT_OK(world.Send(out, next));
    NF_ASSERT_OK(world.Recv(in, prev));
  } else {
    NF_ASSERT_OK(world.Recv(in, prev));
    NF_ASSERT_OK(world.Send(out, next));
  }
  EXPECT_THAT(Values(in), ElementsAreArray(Values(TensorOf(DType::kBF16, {3}, message(prev)))));

  // Async: everyone posts two receives and two sends at once; messages between a pair of
  // ranks arrive in the order they were sent.
  const Tensor a_out = TensorOf(DType::kI64, {2}, {1.0 * r, 100.0 + r});
  const Tensor b_out = TensorOf(DType::kI64, {2}, {2.0 * r, 200.0 + r});
  const Tensor a_in = TensorOf(DType::kI64, {2}, {0, 0});
  const Tensor b_in = TensorOf(DType::kI64, {2}, {0, 0});
  auto recv_a = world.RecvAsync(a_in, prev);
  auto recv_b = world.RecvAsync(b_in, prev);
  auto send_a = world.SendAsync(a_out, next);
  auto send_b = world.SendAsync(b_out, next);
  NF_ASSERT_OK(recv_a);
  NF_ASSERT_OK(recv_b);
  NF_ASSERT_OK(send_a);
  NF_ASSERT_OK(send_b);
  NF_EXPECT_OK((*send_b)->Wait());
  NF_EXPECT_OK((*recv_b)->Wait());
  NF_EXPECT_OK((*send_a)->Wait());
  NF_EXPECT_OK((*recv_a)->Wait());
  EXPECT_THAT(Values(a_in), ElementsAreArray({1.0 * prev, 100.0 + prev}));
  EXPECT_THAT(Values(b_in), ElementsAreArray({2.0 * prev, 200.0 + prev}));
}

TEST(MpiCommunicatorTest, RecvChecksTheMessageSize) {
  MpiCommunicator& world = World();
  if (world.rank() == 0) {
    const Tensor six = TensorOf(DType::kF32, {6}, {1, 2, 3, 4, 5, 6});
    NF_ASSERT_OK(world.Send(six, 1));
    NF_ASSERT_OK(world.Send(six, 1));
  } else if (world.rank() == 1) {
    const Tensor eight = TensorOf(DType::kF32, {8}, std::vector<double>(8, 0));
    ExpectInvalidArgument(world.Recv(eight, 0), "recv on group world",
                          "received 6 elements from peer 0 into tensor f32[8] on cpu of 8 "
                          "elements");
    const Tensor four = TensorOf(DType::kF32, {4}, std::vector<double>(4, 0));
    const absl::Status truncated = world.Recv(four, 0);
    EXPECT_EQ(truncated.code(), absl::StatusCode::kInternal) << truncated;
    EXPECT_THAT(std::string(truncated.message()),
                HasSubstr("recv on group world: tensor f32[4] on cpu: MPI error: "))
        << truncated;
  }
  NF_ASSERT_OK(world.Barrier());
}

TEST(MpiCommunicatorTest, AsyncAllReducesCompleteInAnyOrder) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  const Tensor a = TensorOf(DType::kF32, {7}, Contributions(DType::kF32, r, 7));
  const Tensor b = TensorOf(DType::kBF16, {5}, Contributions(DType::kBF16, r, 5));
  const Tensor c = TensorOf(DType::kI32, {3}, Contributions(DType::kI32, r, 3));
  auto ha = world.AllReduceAsync(a, ReduceOp::kSum);
  auto hb = world.AllReduceAsync(b, ReduceOp::kMax);
  NF_ASSERT_OK(ha);
  NF_ASSERT_OK(hb);
  {
    // Dropped without Wait(): the destructor waits, so `c` is reduced once it is gone.
    auto hc = world.AllReduceAsync(c, ReduceOp::kSum);
    NF_ASSERT_OK(hc);
  }
  NF_ASSERT_OK((*hb)->Wait());
  NF_ASSERT_OK((*ha)->Wait());
  EXPECT_THAT(Values(a), ElementsAreArray(Reduced(DType::kF32, n, 7, ReduceOp::kSum)));
  EXPECT_THAT(Values(b), ElementsAreArray(Reduced(DType::kBF16, n, 5, ReduceOp::kMax)));
  EXPECT_THAT(Values(c), ElementsAreArray(Reduced(DType::kI32, n, 3, ReduceOp::kSum)));
  const absl::Status twice = (*ha)->Wait();
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  EXPECT_THAT(std::string(twice.message()),
              HasSubstr("all_reduce on group world: Wait() called twice"));
}

TEST(MpiCommunicatorTest, CountsThePayloadOfEachCallExactly) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  world.ResetStats();
  NF_ASSERT_OK(world.AllReduce(TensorOf(DType::kF32, {10}, std::vector<double>(10, 1)),
                               ReduceOp::kSum));  // 40 bytes
  auto pending = world.AllReduceAsync(TensorOf(DType::kBF16, {6}, std::vector<double>(6, 1)),
                                      ReduceOp::kMax);  // 12 bytes, counted when issued
  NF_ASSERT_OK(pending);
  EXPECT_EQ(Bytes(world.stats(), CommOp::kAllReduce), 52);
  NF_ASSERT_OK((*pending)->Wait());
  NF_ASSERT_OK(world.ReduceScatter(TensorOf(DType::kF32, {3 * n}, std::vector<double>(3 * n, 1)),
                                   TensorOf(DType::kF32, {3}, {0, 0, 0})));  // input: 12 n bytes
  NF_ASSERT_OK(world.AllGather(
      TensorOf(DType::kI64, {2}, {1, 2}),
      TensorOf(DType::kI64, {2 * n}, std::vector<double>(2 * n, 0))));  // output: 16 n bytes
  NF_ASSERT_OK(world.Broadcast(TensorOf(DType::kF16, {5}, std::vector<double>(5, 0)), 0));
  const Tensor message = TensorOf(DType::kF32, {7}, std::vector<double>(7, 0));  // 28 bytes
  if (r % 2 == 0 && r + 1 < n) {
    NF_ASSERT_OK(world.Send(message, r + 1));
  } else if (r % 2 == 1) {
    NF_ASSERT_OK(world.Recv(message, r - 1));
  }
  NF_ASSERT_OK(world.Barrier());

  const CommStats& s = world.stats();
  EXPECT_EQ(Bytes(s, CommOp::kAllReduce), 52);
  EXPECT_EQ(Calls(s, CommOp::kAllReduce), 2);
  EXPECT_EQ(Bytes(s, CommOp::kReduceScatter), 12 * n);
  EXPECT_EQ(Bytes(s, CommOp::kAllGather), 16 * n);
  EXPECT_EQ(Bytes(s, CommOp::kBroadcast), 10);
  EXPECT_EQ(Bytes(s, CommOp::kSend), r % 2 == 0 ? 28 : 0);
  EXPECT_EQ(Bytes(s, CommOp::kRecv), r % 2 == 1 ? 28 : 0);
  EXPECT_EQ(Calls(s, CommOp::kSend) + Calls(s, CommOp::kRecv), 1);
  EXPECT_EQ(Bytes(s, CommOp::kBarrier), 0);
  EXPECT_EQ(Calls(s, CommOp::kBarrier), 1);
  EXPECT_EQ(s.total_bytes(), 52 + 12 * n + 16 * n + 10 + 28);
}

// The seconds of a call are the caller's wait for its peers: rank 0 enters the all-reduce 300 ms
// after the others, who therefore wait at least that long (less 50 ms for the start-time skew
// the barrier before leaves between ranks), while rank 0 waits far less. A send waited for at
// once by a receiver that is late by the same time counts it the same way.
TEST(MpiCommunicatorTest, CountsTheSecondsEachRankWaitedForItsPeers) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  ASSERT_GE(n, 2) << "run with 2 or more ranks";
  constexpr double kLate = 0.3, kSkew = 0.05;
  NF_ASSERT_OK(world.Barrier());
  world.ResetStats();
  if (r == 0) absl::SleepFor(absl::Seconds(kLate));
  NF_ASSERT_OK(world.AllReduce(TensorOf(DType::kF32, {4}, {1, 2, 3, 4}), ReduceOp::kSum));
  const double all_reduce = world.stats().seconds_of(CommOp::kAllReduce);
  if (r == 0) {
    EXPECT_LT(all_reduce, kLate - kSkew);
  } else {
    EXPECT_GE(all_reduce, kLate - kSkew);
  }
  EXPECT_EQ(world.stats().seconds_of(CommOp::kSend), 0.0);

  NF_ASSERT_OK(world.Barrier());
  const Tensor message = TensorOf(DType::kF32, {3}, {0, 0, 0});
  if (r == 0) {
    NF_ASSERT_OK(world.Recv(message, 1));
    EXPECT_GE(world.stats().seconds_of(CommOp::kRecv), kLate - kSkew);
  } else if (r == 1) {
    absl::SleepFor(absl::Seconds(kLate));
    NF_ASSERT_OK(world.Send(message, 0));
  }
}

// Refusals happen before any communication, so each rank checks them on its own.
TEST(MpiCommunicatorTest, RefusesBadCallsWithOneLineNamingOpGroupAndTensor) {
  MpiCommunicator& world = World();
  const int n = world.size();
  world.ResetStats();
  const Tensor two = TensorOf(DType::kF32, {2}, {1, 2});
  ExpectInvalidArgument(world.AllGather(two, TensorOf(DType::kF32, {5}, std::vector<double>(5))),
                        "all_gather on group world",
                        absl::StrCat("output f32[5] on cpu has 5 elements; ", n,
                                     " ranks x input f32[2] on cpu need ", 2 * n));
  ExpectInvalidArgument(
      world.ReduceScatter(TensorOf(DType::kF32, {2 * n + 1}, std::vector<double>(2 * n + 1)), two),
      "reduce_scatter on group world",
      absl::StrCat("input f32[", 2 * n + 1, "] on cpu has ", 2 * n + 1, " elements; ", n,
                   " ranks x output f32[2] on cpu need ", 2 * n));
  ExpectInvalidArgument(world.Send(two, n), "send on group world",
                        absl::StrCat("peer ", n, " is out of range for a group of ", n,
                                     " ranks (tensor f32[2] on cpu)"));
  ExpectInvalidArgument(world.RecvAsync(two, world.rank()).status(), "recv on group world",
                        "is this rank (tensor f32[2] on cpu)");
  ExpectInvalidArgument(world.Broadcast(two, -1), "broadcast on group world",
                        "root -1 is out of range");
  ExpectInvalidArgument(world.AllReduce(TensorOf(DType::kU8, {2}, {1, 2}), ReduceOp::kMax),
                        "all_reduce on group world", "u8[2] on cpu has dtype u8");
  ExpectInvalidArgument(world.AllReduce(testing::FakeGpuTensor(DType::kF32, {4}), ReduceOp::kSum),
                        "all_reduce on group world",
                        "tensor f32[4] on cuda:0 is not in host memory; MpiCommunicator moves "
                        "CPU tensors");
  ExpectInvalidArgument(world.AllGather(two, testing::FakeGpuTensor(DType::kF32, {2 * n})),
                        "all_gather on group world", "output f32[");
  EXPECT_EQ(world.stats().total_bytes(), 0);
  for (int64_t calls : world.stats().calls) EXPECT_EQ(calls, 0);
}

TEST(MpiCommunicatorTest, SplitFormsGroupsByColorOrderedByKey) {
  MpiCommunicator& world = World();
  const int n = world.size(), r = world.rank();
  // Reverse order within each parity: key = -rank.
  auto parity = world.Split(r % 2, -r, "parity");
  NF_ASSERT_OK(parity);
  ASSERT_NE(*parity, nullptr);
  std::vector<int> members;
  for (int k = n - 1; k >= 0; --k) {
    if (k % 2 == r % 2) members.push_back(k);
  }
  EXPECT_EQ((*parity)->world_ranks(), members);
  EXPECT_EQ((*parity)->name(), "parity");
  EXPECT_EQ((*parity)->world_ranks()[(*parity)->rank()], r);
  const Tensor t = TensorOf(DType::kI64, {1}, {static_cast<double>(r)});
  NF_ASSERT_OK((*parity)->AllReduce(t, ReduceOp::kSum));
  EXPECT_EQ(Values(t)[0], std::accumulate(members.begin(), members.end(), 0));

  auto only_zero = world.Split(r == 0 ? 0 : MpiCommunicator::kNoGroup, 0, "solo");
  NF_ASSERT_OK(only_zero);
  EXPECT_EQ(*only_zero == nullptr, r != 0);
  if (r == 0) {
    EXPECT_EQ((*only_zero)->size(), 1);
    NF_ASSERT_OK((*only_zero)->AllReduce(t, ReduceOp::kMax));
    NF_ASSERT_OK((*only_zero)->Barrier());
  }
}

}  // namespace
}  // namespace nf::parallel
