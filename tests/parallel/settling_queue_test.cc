// parallel/settling_queue.h: the bound on the NCCL communicator's operations waited for but not
// yet in the stats, which only stats() used to drain (nf-eval and nf-generate never call it, so
// a tensor-parallel generation grew it by three CUDA events per operation). The NCCL side runs
// on a GPU (tests/parallel/nccl_communicator_mpi.cc, WaitedOperationsStayBoundedWithoutStats).
#include "parallel/settling_queue.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace nf::parallel {
namespace {

// An operation that completes once `done` is set; settling it records its id.
struct FakeOp {
  int id = 0;
  std::shared_ptr<bool> done;
};

TEST(SettlingQueueTest, PushSettlesTheCompletedFrontSoAQueueNobodyReadsStaysSmall) {
  SettlingQueue<FakeOp> queue;
  std::vector<int> settled;
  const auto settle = [&](const FakeOp& op) {
    if (!*op.done) return false;
    settled.push_back(op.id);
    return true;
  };
  // A generation: each operation has completed by the time the next one is waited for.
  std::shared_ptr<bool> previous;
  for (int i = 0; i < 1'000'000; ++i) {
    if (previous) *previous = true;
    previous = std::make_shared<bool>(false);
    queue.Push({.id = i, .done = previous}, settle);
    ASSERT_LE(queue.size(), 1u);
  }
  EXPECT_EQ(queue.dropped(), 0);
  ASSERT_EQ(settled.size(), 999'999u);
  for (int i = 0; i < 999'999; ++i) ASSERT_EQ(settled[i], i);  // in issue order, each once
}

TEST(SettlingQueueTest, SettlingStopsAtTheFirstOperationStillRunning) {
  SettlingQueue<FakeOp> queue;
  std::vector<int> settled;
  const auto settle = [&](const FakeOp& op) {
    if (!*op.done) return false;
    settled.push_back(op.id);
    return true;
  };
  std::vector<std::shared_ptr<bool>> done;
  for (int i = 0; i < 4; ++i) {
    done.push_back(std::make_shared<bool>(false));
    queue.Push({.id = i, .done = done.back()}, settle);
  }
  *done[1] = true;  // completes, but behind operation 0
  queue.SettleCompleted(settle);
  EXPECT_TRUE(settled.empty());
  EXPECT_EQ(queue.size(), 4u);
  *done[0] = true;
  queue.SettleCompleted(settle);
  EXPECT_EQ(settled, (std::vector<int>{0, 1}));
  EXPECT_EQ(queue.size(), 2u);
}

TEST(SettlingQueueTest, OperationsThatNeverCompleteAreBoundedByTheCapacity) {
  SettlingQueue<FakeOp> queue(/*capacity=*/8);
  const auto never = [](const FakeOp&) { return false; };
  for (int i = 0; i < 100; ++i) {
    queue.Push({.id = i, .done = std::make_shared<bool>(false)}, never);
    ASSERT_LE(queue.size(), 8u);
  }
  EXPECT_EQ(queue.size(), 8u);
  EXPECT_EQ(queue.dropped(), 92);
  EXPECT_EQ(SettlingQueue<int>().capacity(), SettlingQueue<int>::kDefaultCapacity);
}

}  // namespace
}  // namespace nf::parallel
