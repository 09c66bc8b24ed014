#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace nf {

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n;
  int64_t chunk;
  int64_t num_chunks;
  std::atomic<int64_t> next_chunk{0};
};

namespace {

thread_local bool inside_parallel_for = false;

// How long an idle thread spins before it sleeps (workers) or yields (the submitter waiting for
// the last chunks). Long enough to bridge the gap between two kernels of a training step
// (single-threaded work of a few microseconds), short enough that an idle pool costs nothing.
constexpr auto kSpin = std::chrono::microseconds(50);

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <typename Done>
bool SpinUntil(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    for (int i = 0; i < 64; ++i) CpuRelax();
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
  return true;
}

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

void ThreadPool::WaitForJob(uint64_t seen) {
  auto ready = [&] { return stopping_.load() || generation_.load() != seen; };
  if (SpinUntil(ready)) return;
  std::unique_lock<std::mutex> lock(mutex_);
  ++sleepers_;
  wake_.wait(lock, ready);
  --sleepers_;
}

void ThreadPool::JoinPublishedJob() {
  ++joined_workers_;
  if (Job* job = job_.load(); job != nullptr) RunChunks(*job);
  --joined_workers_;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    WaitForJob(seen);
    if (stopping_.load()) return;
    seen = generation_.load();
    JoinPublishedJob();
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
  job_.store(&job);
  ++generation_;
  if (sleepers_.load() > 0) {
    // Taking the mutex orders this notify after a sleeper's predicate check: it either saw the
    // new generation or is waiting and gets woken.
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
  }
  RunChunks(job);
  // Every chunk is claimed; unpublish, then wait for the workers still inside the job.
  job_.store(nullptr);
  auto drained = [&] { return joined_workers_.load() == 0; };
  while (!SpinUntil(drained)) std::this_thread::yield();
}

absl::Status ThreadPool::CheckEnvironment() {
  const char* env = std::getenv("NF_NUM_THREADS");
  int threads = 0;
  if (env == nullptr || (absl::SimpleAtoi(env, &threads) && threads > 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "NF_NUM_THREADS=", env,
      " is not a positive number of threads: set e.g. 8, or unset it for one per hardware "
      "thread (",
      std::thread::hardware_concurrency(), " here)"));
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
