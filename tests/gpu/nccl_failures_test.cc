// The NCCL communicator's failure paths (issue 46, section 4) on two GPUs, two ranks as two
// threads of one process (NcclCommunicator::CreateWithId), where one rank fails the other:
//   - a peer that never issues its first operation leaves the other rank's host blocked inside
//     ncclGroupEnd (NCCL connects lazily there), and one that never joins leaves it inside
//     ncclCommInitRank: both are reported by the watchdog like a collective that hangs (the
//     report line names the rank, the call, the group and the peers), the job is ended (134),
//     and the communicator, aborting, issues nothing more;
//   - an abort that never returns (NF_EMU_NCCL_ABORT_HANGS=1, NCCL issue 992) still ends the
//     process with 134 once the abort's grace has passed;
//   - an allocation beyond the device's memory while an NCCL operation waits for a peer fails
//     with ResourceExhausted after the allocator's drain limit instead of hanging in cudaFree,
//     and succeeds, releasing the cache, once a healthy operation completes (caching_allocator.h).
// The watchdog's end is observed (report, end_job, hard exit as recorded events) except in the
// death test. Each case bounds its own wait: where the fix is missing the waiting rank gives
// up after 20 s, releases the blocked one by doing its part, and the case fails instead of
// hanging. Runs on the emulated GPUs (the NCCL double: tests/emulation/nccl.cc) and on a machine
// with two GPUs; skipped elsewhere.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_context.h"
#include "core/cuda/outstanding_communication.h"
#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "parallel/nccl_communicator.h"
#include "tests/assert_ok.h"
#if NF_CUDA_EMULATION
#include "tests/emulation/emulator.h"
#endif

namespace nf {
namespace {

using parallel::NcclCommunicator;
using parallel::ReduceOp;
using ::testing::HasSubstr;
using ::testing::Not;

// Each emulated GPU has 256 MiB here (read at the first CUDA call), so that the out-of-memory
// case needs no large allocation; every other case needs far less.
const bool kSmallDevices = [] { return setenv("NF_EMU_DEVICE_MEMORY_MIB", "256", 0) == 0; }();

constexpr auto kGiveUp = std::chrono::seconds(20);

// The watchdog's end as events: "report: ...", "end <code>", "hard exit <code>: ...".
class Outcome {
 public:
  void Add(std::string event) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(event));
    }
    changed_.notify_all();
  }
  // Waits until the job was ended, or `limit`: whether it was.
  bool AwaitEnd(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit,
                             [&] { return !events_.empty() && events_.back().starts_with("end"); });
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }

  NcclCommunicator::Options Options(absl::Duration timeout) {
    return {.watchdog = {.timeout = timeout},
            .report = [this](const std::string& line) { Add("report: " + line); },
            .end_job = [this](int code) { Add(absl::StrCat("end ", code)); },
            .abort_grace = absl::Hours(24),
            .hard_exit =
                [this](int code, const std::string& line) {
                  Add(absl::StrCat("hard exit ", code, ": ", line));
                }};
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
};

// One rank's device, compute stream and tensors.
struct Rank {
  int index = 0;
  cuda::CudaContext* context = nullptr;

  Tensor Device(std::vector<float> values) const {
    auto allocator = ops::AllocatorFor(Device::Cuda(index));
    NF_EXPECT_OK(allocator);
    const Shape shape = {static_cast<int64_t>(values.size())};
    auto t = Tensor::Empty(DType::kF32, shape, **allocator);
    NF_EXPECT_OK(t);
    NF_EXPECT_OK(ops::Copy(testing::MakeTensor(DType::kF32, shape, values), *t));
    return *t;
  }
};

// Runs body(rank, id) on two threads, each with its GPU set up.
void OnTwoThreads(const std::function<void(Rank&, const ncclUniqueId&)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      Rank rank{.index = r};
      auto context = cuda::CudaContext::ForDevice(r);
      NF_ASSERT_OK(context);
      rank.context = *context;
      body(rank, id);
    });
  }
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> Join(const Rank& rank, const ncclUniqueId& id,
                                                       NcclCommunicator::Options options) {
  return NcclCommunicator::CreateWithId(
      {.name = "world", .world_ranks = {0, 1}, .rank = rank.index}, id, rank.index,
      rank.context->stream(), std::move(options));
}

std::vector<std::string> UsesAfterAbort() {
  std::vector<std::string> found;
#if NF_CUDA_EMULATION
  for (const std::string& report : emu::Reports()) {
    if (report.find("after ncclCommAbort") != std::string::npos) found.push_back(report);
  }
#endif
  return found;
}

class NcclFailuresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NF_REQUIRE_GPU();
    if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, one per rank";
  }
};

// Rank 1 joins but never issues its first all-reduce: rank 0's host blocks inside ncclGroupEnd,
// connecting. The watchdog reports it, aborts the communicator (which makes ncclGroupEnd
// return) and ends the job; the blocked call then waits for the job's end instead of failing
// with an error of its own, and later calls issue nothing.
TEST_F(NcclFailuresTest, APeerThatNeverIssuesItsFirstOperationIsReported) {
  Outcome outcome;
  OnTwoThreads([&](Rank& rank, const ncclUniqueId& id) {
    const bool watched = rank.index == 0;
    auto comm =
        Join(rank, id, watched ? outcome.Options(absl::Seconds(1)) : NcclCommunicator::Options{});
    NF_ASSERT_OK(comm);
    const Tensor t = rank.Device({1, 2, 3, 4});
    if (watched) {
      const absl::Status status = (*comm)->AllReduce(t, ReduceOp::kSum);
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
      EXPECT_THAT(status.message(), HasSubstr("the watchdog is aborting the job"));
      // Aborting: nothing reaches NCCL any more.
      const absl::Status later = (*comm)->AllReduce(t, ReduceOp::kSum);
      EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
      comm->reset();
      EXPECT_THAT(UsesAfterAbort(), ::testing::IsEmpty());
    } else {
      if (!outcome.AwaitEnd(kGiveUp)) {
        ADD_FAILURE() << "rank 0 was not reported within " << kGiveUp.count() << " s; releasing it";
        NF_EXPECT_OK((*comm)->AllReduce(t, ReduceOp::kSum));
      }
      NF_EXPECT_OK(ops::Synchronize(Device::Cuda(rank.index)));
      comm->reset();
    }
  });
  const std::vector<std::string> events = outcome.events();
  ASSERT_EQ(events.size(), 2u) << ::testing::PrintToString(events);
  EXPECT_EQ(events[0],
            "report: rank 0: all_reduce (host blocked in ncclGroupEnd) on group world (ranks "
            "[0, 1]) did not complete within 1s before the first step; waiting for peers [1]; "
            "aborting the job");
  EXPECT_EQ(events[1], "end 134");
}

// Rank 1 never joins: rank 0's host blocks inside ncclCommInitRank, which is watched as well.
// There is no communicator to abort yet; once rank 1 comes (late), creation returns Aborted.
TEST_F(NcclFailuresTest, APeerThatNeverJoinsIsReported) {
  Outcome outcome;
  OnTwoThreads([&](Rank& rank, const ncclUniqueId& id) {
    if (rank.index == 0) {
      auto comm = Join(rank, id, outcome.Options(absl::Seconds(1)));
      EXPECT_EQ(comm.status().code(), absl::StatusCode::kAborted) << comm.status();
    } else {
      if (!outcome.AwaitEnd(kGiveUp)) {
        ADD_FAILURE() << "rank 0 was not reported within " << kGiveUp.count() << " s";
      }
      auto comm = Join(rank, id, {});  // releases rank 0's ncclCommInitRank
      NF_EXPECT_OK(comm);
    }
  });
  const std::vector<std::string> events = outcome.events();
  ASSERT_EQ(events.size(), 2u) << ::testing::PrintToString(events);
  EXPECT_EQ(events[0],
            "report: rank 0: create NCCL communicator (host blocked in ncclCommInitRank) on group "
            "world (ranks [0, 1]) did not complete within 1s before the first step; waiting for "
            "peers [1]; aborting the job");
  EXPECT_EQ(events[1], "end 134");
}

// ncclCommAbort that never returns (NCCL issue 992, the double's NF_EMU_NCCL_ABORT_HANGS=1):
// the process still ends with the watchdog's 134 once the abort's grace (2 s here) has passed
// since the report (1 s here), saying why. The child gives up after 30 s with 99.
TEST_F(NcclFailuresTest, AHungAbortStillEndsTheProcessWith134WithinTheBound) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        setenv("NF_EMU_NCCL_ABORT_HANGS", "1", 1);
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::seconds(30));
          std::fprintf(stderr, "the process did not end within 30 s\n");
          std::_Exit(99);
        }).detach();
        OnTwoThreads([](Rank& rank, const ncclUniqueId& id) {
          auto comm =
              Join(rank, id,
                   {.watchdog = {.timeout = absl::Seconds(1)}, .abort_grace = absl::Seconds(2)});
          NF_ASSERT_OK(comm);
          const Tensor t = rank.Device({1, 2});
          if (rank.index == 0) {
            (*comm)->AllReduce(t, ReduceOp::kSum).IgnoreError();
            std::fprintf(stderr, "rank 0's all-reduce returned\n");
            std::_Exit(1);
          }
          while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
        });
      },
      ::testing::ExitedWithCode(134),
      "all_reduce \\(host blocked in ncclGroupEnd\\) on group world(.|\\n)*rank 0: the abort did "
      "not finish within 2s of the watchdog's report");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 15.0) << "bound: 1 s timeout + 2 s grace, plus start-up";
  std::fprintf(stderr, "the child ended after %.1f s (bound: 1 s timeout + 2 s grace)\n", seconds);
}

// What rank 0's allocation gave in AllocateWhileAnAllReduceWaits.
struct AllocationOutcome {
  absl::Status status;
  double seconds = 0;
  cuda::AllocatorStats before, after;  // rank 0's allocator around the request
};

// Rank 0 issues an all-reduce that waits on the GPU for rank 1, puts `cached` bytes into its
// cache and asks for `requested`, more than its device has left: releasing the cache (cudaFree)
// would wait for the whole device, the all-reduce included. Rank 1 issues its part when rank 0
// is about to ask (`peer_answers`: a healthy overlapped collective, which completes while rank 0
// waits) or only once the request has returned (a peer that waits for this rank); then both
// finish.
AllocationOutcome AllocateWhileAnAllReduceWaits(size_t cached, size_t requested,
                                                bool peer_answers) {
  enum class Phase { kConnecting, kAsking, kAnswered };
  std::mutex mutex;
  std::condition_variable changed;
  Phase phase = Phase::kConnecting;
  const auto enter = [&](Phase next) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      phase = next;
    }
    changed.notify_all();
  };
  AllocationOutcome outcome;
  OnTwoThreads([&](Rank& rank, const ncclUniqueId& id) {
    auto comm = Join(rank, id, {.watchdog = {.timeout = absl::Seconds(120)}});
    NF_ASSERT_OK(comm);
    const Tensor t = rank.Device({1, 2, 3, 4});
    NF_ASSERT_OK((*comm)->AllReduce(t, ReduceOp::kSum));  // connects both ranks
    NF_ASSERT_OK(ops::Synchronize(Device::Cuda(rank.index)));
    if (rank.index == 0) {
      NF_ASSERT_OK((*comm)->AllReduce(t, ReduceOp::kSum));  // waits for rank 1 on the GPU
      EXPECT_GT(cuda::OutstandingCommunication(0), 0);
      auto* allocator = static_cast<cuda::CachingAllocator*>(*ops::AllocatorFor(Device::Cuda(0)));
      auto block = allocator->Allocate(cached);
      NF_ASSERT_OK(block);
      allocator->Deallocate(*block, cached);  // into the cache
      outcome.before = allocator->stats();
      enter(Phase::kAsking);
      const auto start = std::chrono::steady_clock::now();
      auto asked = allocator->Allocate(requested);
      outcome.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      outcome.status = asked.status();
      outcome.after = allocator->stats();
      if (asked.ok()) allocator->Deallocate(*asked, requested);
      enter(Phase::kAnswered);
    } else {
      const Phase awaited = peer_answers ? Phase::kAsking : Phase::kAnswered;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (!changed.wait_for(lock, kGiveUp, [&] { return phase >= awaited; })) {
          ADD_FAILURE() << "rank 0's allocation did not return within " << kGiveUp.count()
                        << " s; releasing it";
        }
      }
      NF_ASSERT_OK((*comm)->AllReduce(t, ReduceOp::kSum));
    }
    NF_EXPECT_OK(ops::Synchronize(Device::Cuda(rank.index)));
    comm->reset();
  });
  EXPECT_EQ(cuda::OutstandingCommunication(0), 0);
  EXPECT_EQ(cuda::OutstandingCommunication(1), 0);
  return outcome;
}

// A peer that never answers while rank 0 runs out of memory: the allocation waits out the drain
// limit and fails, saying why, with the cache kept, instead of hanging in cudaFree.
TEST_F(NcclFailuresTest, OutOfMemoryWhileAnOperationWaitsForAPeerFailsAfterTheDrainLimit) {
  const AllocationOutcome outcome =
      AllocateWhileAnAllReduceWaits(size_t{8} << 20, size_t{300} << 20, /*peer_answers=*/false);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kResourceExhausted) << outcome.status;
  EXPECT_THAT(outcome.status.message(),
              HasSubstr("the cache was not released because 1 communication operation(s) were "
                        "still in flight on the device after 10 s"));
  EXPECT_EQ(outcome.after.reserved_bytes, outcome.before.reserved_bytes) << "the cache was freed";
  const double limit = cuda::CachingAllocator::kCommunicationDrainLimit.count() / 1000.0;
  EXPECT_GE(outcome.seconds, limit);
  EXPECT_LT(outcome.seconds, kGiveUp.count()) << "bound: the drain limit, well within it";
}

// A healthy overlapped collective in flight while rank 0 runs out of memory: the allocation
// waits for it to complete, releases the cache (200 MiB) and succeeds, as without communication.
TEST_F(NcclFailuresTest, OutOfMemoryWhileAHealthyOperationRunsReleasesTheCacheOnceItCompletes) {
  const AllocationOutcome outcome =
      AllocateWhileAnAllReduceWaits(size_t{200} << 20, size_t{100} << 20, /*peer_answers=*/true);
  NF_EXPECT_OK(outcome.status);
  EXPECT_EQ(outcome.after.cuda_mallocs, outcome.before.cuda_mallocs + 1);
  EXPECT_EQ(outcome.after.reserved_bytes, outcome.before.allocated_bytes + (size_t{100} << 20))
      << "the whole cache released and 100 MiB obtained";
}

}  // namespace
}  // namespace nf
