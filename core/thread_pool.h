// A fixed pool of worker threads for the CPU kernels. Kernels compute each index of a
// ParallelFor independently of how [0, n) is split into chunks, and reductions sum partials of
// fixed-size blocks in block order, so results are identical for any thread count.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

 private:
  struct Job;
  void WorkerLoop();
  static void RunChunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  Job* job_ = nullptr;       // guarded by mutex_
  uint64_t generation_ = 0;  // guarded by mutex_; bumped per job so workers join each once
  bool stopping_ = false;    // guarded by mutex_
  std::mutex submit_mutex_;  // one job at a time from outside the pool
};

}  // namespace nf
