#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

namespace nf {

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n;
  int64_t chunk;
  int64_t num_chunks;
  std::atomic<int64_t> next_chunk{0};
  int active_workers = 0;  // workers inside RunChunks; guarded by done_mutex
  std::mutex done_mutex;
  std::condition_variable done;
};

namespace {
thread_local bool inside_parallel_for = false;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunChunks(Job& job) {
  inside_parallel_for = true;
  for (int64_t c = job.next_chunk.fetch_add(1); c < job.num_chunks;
       c = job.next_chunk.fetch_add(1)) {
    const int64_t begin = c * job.chunk;
    (*job.fn)(begin, std::min(job.n, begin + job.chunk));
  }
  inside_parallel_for = false;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen_generation = 0;
  while (true) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      job = job_;
      if (job == nullptr) continue;
      std::lock_guard<std::mutex> job_lock(job->done_mutex);
      ++job->active_workers;
    }
    RunChunks(*job);
    // Decrement and notify under the job's mutex: the submitter may destroy the job as soon as
    // it sees zero active workers, so nothing here may touch the job after the unlock.
    std::lock_guard<std::mutex> job_lock(job->done_mutex);
    if (--job->active_workers == 0) job->done.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // About 4 chunks per thread balances uneven chunks without much scheduling overhead.
  const int64_t target_chunks = 4 * static_cast<int64_t>(num_threads());
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  if (workers_.empty() || inside_parallel_for || chunk >= n) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mutex_);
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = chunk;
  job.num_chunks = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  RunChunks(job);
  {
    // Unpublish the job so no further worker joins it; every chunk has been claimed, and the
    // workers still running one are counted in active_workers.
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = nullptr;
  }
  std::unique_lock<std::mutex> lock(job.done_mutex);
  job.done.wait(lock, [&] { return job.active_workers == 0; });
}

ThreadPool& ThreadPool::Global() {
  static ThreadPool* pool = [] {
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("NF_NUM_THREADS"); env != nullptr && std::atoi(env) > 0) {
      threads = std::atoi(env);
    }
    return new ThreadPool(std::max(1, threads));
  }();
  return *pool;
}

}  // namespace nf
