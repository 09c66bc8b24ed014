#include "core/cpu/blas.h"

#include <cblas.h>

#include <algorithm>

namespace nf::cpu {

void UseSingleThreadedBlas() { openblas_set_num_threads(1); }

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS leaves this to the implementation's edge handling; be explicit
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}

}  // namespace nf::cpu
