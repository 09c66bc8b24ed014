#include "bench/ceilings.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace nf::bench {

AllCoresBlas::AllCoresBlas() : saved_threads_(openblas_get_num_threads()) {
  openblas_set_num_threads(openblas_get_num_procs());
}

AllCoresBlas::~AllCoresBlas() { openblas_set_num_threads(saved_threads_); }

Ceilings MeasureCeilings() {
  Ceilings ceilings{};
  {
    const AllCoresBlas all_cores;
    constexpr int n = 1024;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
    auto sgemm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
    };
    sgemm();  // warm up threads and caches
    ceilings.sgemm_gflops = 2.0 * n * n * n / MedianSeconds(7, sgemm) / 1e9;
  }
  {
    constexpr size_t bytes = size_t{256} << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    // One slice per hardware thread, as the kernels it is compared with use every core.
    const size_t threads = std::max(1u, std::thread::hardware_concurrency());
    const size_t slice = bytes / threads;
    auto copy = [&] {
      std::vector<std::thread> workers;
      for (size_t t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          const size_t begin = t * slice, end = t + 1 == threads ? bytes : begin + slice;
          std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
        });
      }
      for (std::thread& w : workers) w.join();
    };
    copy();
    ceilings.memcpy_gbytes_per_s = 2.0 * bytes / MedianSeconds(5, copy) / 1e9;
  }
  return ceilings;
}

}  // namespace nf::bench
