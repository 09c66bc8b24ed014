// The one door to OpenBLAS. The CPU backend runs OpenBLAS single-threaded and parallelises
// around it with its own thread pool: nested threading (pool threads each calling a
// multi-threaded sgemm) was measured 5-8x slower for attention, and one pool gives one knob
// (NF_NUM_THREADS) and thread-count-independent results.
#pragma once

#include <cstdint>

namespace nf::cpu {

// Switches OpenBLAS to one thread; called once when the CPU backend is created.
void UseSingleThreadedBlas();

// C[m, n] = alpha * op(A) op(B) + beta * C on row-major fp32 matrices with leading dimensions
// (row lengths as stored) lda, ldb, ldc. k == 0 gives C = beta * C (C not read when beta == 0).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace nf::cpu
