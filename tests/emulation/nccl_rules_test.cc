// The NCCL double keeps NCCL's documented rules (nccl.cc): two ranks as two threads of this
// process, on emulated devices 0 and 1, through NCCL's own C API.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {
namespace {

using ::testing::HasSubstr;

// Waits for a state of another thread (tests wait on states, never on time).
void WaitUntil(const std::function<bool()>& condition) {
  while (!condition()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

struct Rank {
  int device;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
};

class NcclRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClearReportsAndErrors();
    ASSERT_EQ(ncclGetUniqueId(&id_), ncclSuccess);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([this, r] {
        Rank& rank = ranks_[r];
        rank.device = r;
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        ASSERT_EQ(cudaStreamCreateWithFlags(&rank.stream, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&rank.buffer), 64 * sizeof(float)),
                  cudaSuccess);
        ASSERT_EQ(ncclCommInitRank(&rank.comm, 2, id_, r), ncclSuccess);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  void TearDown() override { ClearReportsAndErrors(); }

  // Runs f(rank) on each rank's own thread (its current device set) and joins them.
  void OnBoth(const std::function<void(Rank&, int)>& f) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([this, r, &f] {
        cudaSetDevice(r);
        f(ranks_[r], r);
      });
    }
    for (std::thread& t : threads) t.join();
  }

  void Fill(Rank& rank, float value) {
    std::vector<float> host(64, value);
    ASSERT_EQ(cudaMemcpy(rank.buffer, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> Read(Rank& rank) {
    std::vector<float> host(64);
    EXPECT_EQ(cudaStreamSynchronize(rank.stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), rank.buffer, 64 * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

  ncclUniqueId id_;
  Rank ranks_[2];
};

TEST_F(NcclRulesTest, AllReduceSumsInRankOrder) {
  OnBoth([&](Rank& rank, int r) {
    Fill(rank, r == 0 ? 1.5f : 2.25f);
    ASSERT_EQ(
        ncclAllReduce(rank.buffer, rank.buffer, 64, ncclFloat32, ncclSum, rank.comm, rank.stream),
        ncclSuccess);
    for (float v : Read(rank)) ASSERT_EQ(v, 3.75f);
  });
}

// NCCL_RUNTIME_CONNECT: the first group to a peer connects inside ncclGroupEnd, which blocks the
// host while the peer is missing (what a deadline around group issue must cover).
TEST_F(NcclRulesTest, TheFirstGroupToAPeerBlocksTheHostUntilThePeerComes) {
  std::atomic<bool> sent{false};
  std::thread sender([&] {
    cudaSetDevice(0);
    Fill(ranks_[0], 7.0f);
    EXPECT_EQ(ncclSend(ranks_[0].buffer, 64, ncclFloat32, 1, ranks_[0].comm, ranks_[0].stream),
              ncclSuccess);
    sent = true;
  });
  WaitUntil([] { return NcclHostsConnecting() == 1; });
  EXPECT_FALSE(sent.load());  // still inside ncclSend's implicit group
  cudaSetDevice(1);
  ASSERT_EQ(ncclRecv(ranks_[1].buffer, 64, ncclFloat32, 0, ranks_[1].comm, ranks_[1].stream),
            ncclSuccess);
  sender.join();
  EXPECT_TRUE(sent.load());
  for (float v : Read(ranks_[1])) ASSERT_EQ(v, 7.0f);
}

TEST_F(NcclRulesTest, CollectivesIssuedInAnotherShapeAreReported) {
  OnBoth([&](Rank& rank, int r) {
    ncclAllReduce(rank.buffer, rank.buffer, r == 0 ? 16 : 32, ncclFloat32, ncclSum, rank.comm,
                  rank.stream);
    cudaStreamSynchronize(rank.stream);
    ncclResult_t error = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(rank.comm, &error), ncclSuccess);
    EXPECT_EQ(error, ncclInvalidUsage);
  });
  ASSERT_FALSE(Reports().empty());
  EXPECT_THAT(Reports()[0], HasSubstr("collective mismatch"));
}

TEST_F(NcclRulesTest, AReceiveOfAnotherSizeIsReported) {
  OnBoth([&](Rank& rank, int r) {
    if (r == 0) {
      ncclSend(rank.buffer, 16, ncclFloat32, 1, rank.comm, rank.stream);
    } else {
      ncclRecv(rank.buffer, 8, ncclFloat32, 0, rank.comm, rank.stream);
      cudaStreamSynchronize(rank.stream);
    }
  });
  for (Rank& rank : ranks_) {
    EXPECT_EQ(cudaStreamSynchronize(rank.stream), cudaSuccess);  // the sender's ends too
    ncclResult_t error = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(rank.comm, &error), ncclSuccess);
    EXPECT_EQ(error, ncclInvalidUsage);
  }
  ASSERT_FALSE(Reports().empty());
  EXPECT_THAT(Reports()[0], HasSubstr("rank 0 sends 64 bytes to rank 1, whose matching receive "
                                      "takes 32"));
}

// A receive whose sender never comes waits in its kernel until ncclCommAbort returns it; the
// communicator must not be used after.
TEST_F(NcclRulesTest, AbortReturnsAPendingKernelAndLaterUseIsReported) {
  cudaSetDevice(1);
  Rank& rank = ranks_[1];
  // Connected first, so the receive below is issued and waits on the device, not in the host.
  OnBoth([&](Rank& r, int) {
    ASSERT_EQ(ncclAllReduce(r.buffer, r.buffer, 1, ncclFloat32, ncclSum, r.comm, r.stream),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
  });
  cudaSetDevice(1);
  ASSERT_EQ(ncclRecv(rank.buffer, 64, ncclFloat32, 0, rank.comm, rank.stream), ncclSuccess);
  EXPECT_EQ(cudaStreamQuery(rank.stream), cudaErrorNotReady);
  ASSERT_EQ(ncclCommAbort(rank.comm), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(rank.stream), cudaSuccess);
  EXPECT_EQ(ncclRecv(rank.buffer, 64, ncclFloat32, 0, rank.comm, rank.stream), ncclInvalidUsage);
  ASSERT_FALSE(Reports().empty());
  EXPECT_THAT(Reports().back(), HasSubstr("after ncclCommAbort or ncclCommDestroy"));
  ncclCommAbort(ranks_[0].comm);
}

// NF_EMU_SERIAL_KERNELS: two communicators whose operations the ranks issue in different orders
// deadlock when each device runs one kernel at a time (NCCL's "Using multiple NCCL communicators
// concurrently"). Neither rank's stream finishes until the communicators are aborted.
TEST_F(NcclRulesTest, TwoCommunicatorsInOppositeOrdersDeadlockUnderSerialKernels) {
  ncclUniqueId second_id;
  ASSERT_EQ(ncclGetUniqueId(&second_id), ncclSuccess);
  ncclComm_t second[2];
  OnBoth(
      [&](Rank&, int r) { ASSERT_EQ(ncclCommInitRank(&second[r], 2, second_id, r), ncclSuccess); });
  // Connect both first: the deadlock is in the kernels, not in ncclGroupEnd.
  OnBoth([&](Rank& rank, int r) {
    for (ncclComm_t comm : {rank.comm, second[r]}) {
      ASSERT_EQ(ncclAllReduce(rank.buffer, rank.buffer, 1, ncclFloat32, ncclSum, comm, rank.stream),
                ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(rank.stream), cudaSuccess);
  });
  SetSerialKernels(true);
  cudaStream_t other[2];
  float* other_buffer[2];  // its own allocation: the hazard check works per allocation
  // Rank 0: the first communicator, then the second; rank 1 the other way round.
  ncclComm_t first[2], then[2];
  OnBoth([&](Rank& rank, int r) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&other[r], cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&other_buffer[r]), sizeof(float)), cudaSuccess);
    first[r] = r == 0 ? rank.comm : second[r];
    then[r] = r == 0 ? second[r] : rank.comm;
    ASSERT_EQ(
        ncclAllReduce(rank.buffer, rank.buffer, 1, ncclFloat32, ncclSum, first[r], rank.stream),
        ncclSuccess);
    ASSERT_EQ(
        ncclAllReduce(other_buffer[r], other_buffer[r], 1, ncclFloat32, ncclSum, then[r], other[r]),
        ncclSuccess);
  });
  // Each device runs its first kernel, which waits for the peer's kernel of the same
  // communicator, queued on the peer's device behind the peer's first: a state no host call can
  // change (without the serial order the two kernels of a device would run side by side).
  WaitUntil([] { return SerialTurnWaits() == 2; });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(cudaStreamQuery(other[r]), cudaErrorNotReady);
  // Each rank aborts the communicator of its running kernel first: ncclCommAbort waits for the
  // communicator's kernels, and one queued behind a kernel of the other communicator would wait
  // for that kernel's peer, which the peer rank may have aborted already.
  OnBoth([&](Rank& rank, int r) {
    ncclCommAbort(first[r]);
    ncclCommAbort(then[r]);
    EXPECT_EQ(cudaStreamSynchronize(rank.stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(other[r]), cudaSuccess);
  });
  SetSerialKernels(false);
}

}  // namespace
}  // namespace nf::emu
