// A fixed pool of worker threads for the CPU kernels. Kernels compute each index of a
// ParallelFor independently of how [0, n) is split into chunks, and reductions sum partials of
// fixed-size blocks in block order, so results are identical for any thread count.
//
// A training step issues thousands of short ParallelFors a few microseconds apart, so waking
// sleeping workers through the kernel for each one cost more than some of the loops (futex
// wake-ups were ~8% of a small model's step). Workers therefore spin for a short while
// (kSpinMicros) after each job, joining the next one without a system call, and only then sleep
// on the condition variable; the caller likewise spins, then yields, while the last workers
// finish their chunks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace nf {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 means no workers, everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least `grain` long
  // (but the last), and returns when all are done. A ParallelFor issued from inside a chunk
  // runs inline.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The pool the CPU kernels use: NF_NUM_THREADS threads, else one per hardware thread.
  static ThreadPool& Global();

  // OK unless NF_NUM_THREADS is set to something other than a positive integer (the pool would
  // quietly take one thread per hardware thread instead); programs check it at start-up.
  static absl::Status CheckEnvironment();

 private:
  struct Job;
  void WorkerLoop();
  // Returns once generation_ differs from `seen` or the pool is stopping: spins, then sleeps.
  void WaitForJob(uint64_t seen);
  void JoinPublishedJob();
  static void RunChunks(Job& job);

  std::vector<std::thread> workers_;
  // The job being run, or null. A worker announces itself in joined_workers_ *before* reading
  // job_, and the submitter unpublishes job_ *before* waiting for joined_workers_ to drain, so
  // (all operations sequentially consistent) a worker that saw the job is waited for, and one
  // that did not never touches it.
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> joined_workers_{0};
  std::atomic<uint64_t> generation_{0};  // bumped per job, so a worker runs each job once
  std::atomic<bool> stopping_{false};
  // Sleeping workers wait on wake_ under mutex_; sleepers_ tells the submitter whether to
  // notify at all (the common case, workers still spinning, needs no system call).
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::mutex submit_mutex_;  // one job at a time from outside the pool
};

}  // namespace nf
