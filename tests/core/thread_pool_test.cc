// Tests of core/thread_pool.h: coverage of ParallelFor's chunks, nesting, concurrent callers,
// determinism of block-ordered reductions across thread counts, and clean shutdown.
//
// Tests that would hang on a deadlock or a lost wake-up run under RunOrAbort, which aborts the
// program with a message after a generous limit instead of hanging until the CTest timeout.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace nf {
namespace {

// Every test here finishes in well under a second (a few seconds under sanitizers on a loaded
// 2-core machine); 120 s can only be exceeded by a hang.
constexpr auto kHangLimit = std::chrono::seconds(120);

template <typename F>
void RunOrAbort(const char* what, F&& body) {
  std::packaged_task<void()> task(std::forward<F>(body));
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(kHangLimit) != std::future_status::ready) {
    std::fprintf(stderr, "%s did not finish within %lld s: deadlock or lost wake-up\n", what,
                 static_cast<long long>(kHangLimit.count()));
    std::abort();
  }
  runner.join();
  done.get();
}

// Runs ParallelFor(n, grain) on `pool` and checks that the chunks are non-empty, disjoint, cover
// [0, n) exactly once, and are each at least `grain` long except the one that ends at n.
void ExpectExactCover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(std::max<int64_t>(n, 0));
  std::atomic<int64_t> bad_chunks{0};
  std::atomic<int64_t> calls{0};
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    ++calls;
    const bool short_chunk = end - begin < std::max<int64_t>(grain, 1) && end != n;
    if (begin < 0 || end > n || begin >= end || short_chunk) {
      ++bad_chunks;
      return;
    }
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  EXPECT_EQ(bad_chunks.load(), 0) << "n=" << n << " grain=" << grain;
  if (n <= 0) {
    EXPECT_EQ(calls.load(), 0) << "n=" << n;
  }
  int64_t wrong = 0, first_wrong = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (hits[i].load() != 1) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  EXPECT_EQ(wrong, 0) << "n=" << n << " grain=" << grain << " threads=" << pool.num_threads()
                      << ": index " << first_wrong << " covered "
                      << (first_wrong >= 0 ? hits[first_wrong].load() : 0) << " times";
}

TEST(ThreadPoolTest, NumThreadsCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).num_threads(), 1);
  EXPECT_EQ(ThreadPool(3).num_threads(), 3);
  EXPECT_EQ(ThreadPool(0).num_threads(), 1);   // clamped: everything inline
  EXPECT_EQ(ThreadPool(-4).num_threads(), 1);  // clamped
  EXPECT_GE(ThreadPool::Global().num_threads(), 1);
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  RunOrAbort("EveryIndexExactlyOnce", [] {
    for (int threads : {1, 2, 3, 8}) {
      ThreadPool pool(threads);
      for (int64_t n : {-3, 0, 1, 2, 3, 5, 7, 8, 31, 64, 100, 1000, 4097, 100003}) {
        for (int64_t grain : {-1, 0, 1, 2, 3, 16, 1000, 1 << 20}) {
          ExpectExactCover(pool, n, grain);
        }
      }
    }
  });
}

TEST(ThreadPoolTest, SmallOrSingleChunkJobsRunInlineOnTheCaller) {
  ThreadPool pool(4);
  for (auto [n, grain] : {std::pair<int64_t, int64_t>{1, 1}, {5, 10}, {100, 100}}) {
    std::vector<std::thread::id> callers;
    pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
      callers.push_back(std::this_thread::get_id());  // single chunk: no race
      EXPECT_EQ(begin, 0);
      EXPECT_EQ(end, n);
    });
    ASSERT_EQ(callers.size(), 1u) << "n=" << n << " grain=" << grain;
    EXPECT_EQ(callers[0], std::this_thread::get_id());
  }
}

// With several chunks, the workers do take part (a pool that silently ran everything on the
// caller would pass the coverage tests). Chunks sleep so that a woken worker finds one left;
// repeated because a loaded machine may be slow to wake workers.
TEST(ThreadPoolTest, WorkersTakePart) {
  RunOrAbort("WorkersTakePart", [] {
    ThreadPool pool(4);
    std::set<std::thread::id> seen;
    for (int attempt = 0; attempt < 50 && seen.size() < 2; ++attempt) {
      std::mutex mutex;
      pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::lock_guard<std::mutex> lock(mutex);
        seen.insert(std::this_thread::get_id());
      });
    }
    EXPECT_GE(seen.size(), 2u);
  });
}

TEST(ThreadPoolTest, NestedParallelForRunsInline) {
  RunOrAbort("NestedParallelForRunsInline", [] {
    ThreadPool pool(4);
    ThreadPool other(3);
    constexpr int64_t kOuter = 64, kInner = 37;
    std::vector<std::atomic<int>> hits(kOuter * kInner);
    std::atomic<int64_t> not_inline{0};
    pool.ParallelFor(kOuter, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const std::thread::id outer_thread = std::this_thread::get_id();
        // Alternate between the same pool and another one: both must run inline on this thread.
        ThreadPool& inner_pool = i % 2 == 0 ? pool : other;
        inner_pool.ParallelFor(kInner, 1, [&](int64_t b, int64_t e) {
          if (std::this_thread::get_id() != outer_thread) ++not_inline;
          for (int64_t j = b; j < e; ++j) hits[i * kInner + j].fetch_add(1);
        });
      }
    });
    EXPECT_EQ(not_inline.load(), 0);
    for (size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k].load(), 1) << k;
    // The pools still work normally afterwards (the inline flag was reset).
    ExpectExactCover(pool, 1000, 1);
    ExpectExactCover(other, 1000, 1);
  });
}

TEST(ThreadPoolTest, ConcurrentCallersAreSafe) {
  RunOrAbort("ConcurrentCallersAreSafe", [] {
    ThreadPool pool(3);
    constexpr int kCallers = 4, kJobs = 100;
    std::vector<int64_t> failures(kCallers, 0);
    std::vector<std::thread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&pool, &failures, c] {
        for (int job = 0; job < kJobs; ++job) {
          const int64_t n = 50 + 37 * job + c;  // different sizes per caller and job
          std::vector<int> hits(n, 0);          // chunks are disjoint: plain ints suffice
          pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) hits[i] += 1 + c;
          });
          for (int64_t i = 0; i < n; ++i) failures[c] += hits[i] != 1 + c;
        }
      });
    }
    for (std::thread& t : callers) t.join();
    for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
  });
}

// A reduction that sums fixed blocks of 256 in float and then the block partials in block order
// gives bitwise the same result for every thread count (the documented recipe). Float addition
// is not associative, so a chunk-dependent order would change low bits.
float BlockSum(ThreadPool& pool, const std::vector<float>& x) {
  constexpr int64_t kBlock = 256;
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<float> partial(blocks, 0.0f);
  pool.ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float s = 0.0f;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) s += x[i];
      partial[b] = s;
    }
  });
  float total = 0.0f;
  for (float p : partial) total += p;
  return total;
}

TEST(ThreadPoolTest, BlockReductionIsIdenticalForAnyThreadCount) {
  RunOrAbort("BlockReductionIsIdenticalForAnyThreadCount", [] {
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
    std::vector<float> x(100003);
    for (float& v : x) v = dist(rng);
    // The serial reference of the same blocked order.
    ThreadPool serial(1);
    const float reference = BlockSum(serial, x);
    double exact = 0.0;
    for (float v : x) exact += v;
    // Sanity: the blocked float sum is close to the double sum (|error| <= n * eps * sum|x|,
    // about 100003 * 6e-8 * 5e7 = 3e5 worst case; the real error is far smaller, so this only
    // catches a broken reduction, e.g. a missing block).
    EXPECT_NEAR(reference, exact, 3e5);
    EXPECT_NE(reference, 0.0f);
    for (int threads : {1, 2, 3, 8}) {
      ThreadPool pool(threads);
      for (int repeat = 0; repeat < 5; ++repeat) {
        const float sum = BlockSum(pool, x);
        EXPECT_EQ(std::bit_cast<uint32_t>(sum), std::bit_cast<uint32_t>(reference))
            << threads << " threads: " << sum << " vs " << reference;
      }
    }
  });
}

TEST(ThreadPoolTest, DestructionWithIdleWorkersIsClean) {
  RunOrAbort("DestructionWithIdleWorkersIsClean", [] {
    for (int round = 0; round < 20; ++round) {
      ThreadPool never_used(8);  // workers may not even have started waiting yet
    }
    for (int round = 0; round < 20; ++round) {
      ThreadPool pool(4);
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(1000, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sum += i;
      });
      EXPECT_EQ(sum.load(), 999 * 1000 / 2);
      // Destroyed right after the job, while workers go back to waiting.
    }
  });
}

// Many tiny back-to-back jobs: a worker that misses a wake-up or joins a finished job would
// hang the submitter or corrupt the next job.
TEST(ThreadPoolTest, ThousandsOfTinyJobsComplete) {
  RunOrAbort("ThousandsOfTinyJobsComplete", [] {
    for (int threads : {2, 4, 8}) {
      ThreadPool pool(threads);
      int64_t wrong = 0;
      for (int job = 0; job < 1000; ++job) {
        const int64_t n = 2 + job % 15;
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) wrong += hits[i].load() != 1;
      }
      EXPECT_EQ(wrong, 0) << threads << " threads";
    }
  });
}

}  // namespace
}  // namespace nf
