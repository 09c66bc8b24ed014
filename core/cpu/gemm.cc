// GEMM on the CPU: OpenBLAS sgemm per batch. fp16/bf16 operands are widened to fp32 first, so
// products and sums are fp32 whatever the storage type (the contract of ops::Gemm).
#include <cblas.h>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

struct Operand {
  const float* data;     // fp32 view of the whole operand
  int64_t batch_stride;  // elements between batches; 0 when shared by every batch
  int64_t ld;            // row-major leading dimension (the stored matrix's column count)
};

template <typename T>
Operand Widen(const Tensor& t, std::vector<float>& buffer) {
  const int64_t rows = t.dim(-2), cols = t.dim(-1);
  return {AsFloat(t.data<T>(), t.numel(), buffer), t.rank() == 3 ? rows * cols : 0,
          std::max<int64_t>(1, cols)};
}

}  // namespace

absl::Status CpuBackend::Gemm(const ops::GemmArgs& args) {
  const Tensor& c = args.c;
  const int64_t m = c.dim(-2), n = c.dim(-1);
  const int64_t k = args.trans_a ? args.a.dim(-2) : args.a.dim(-1);
  const int64_t batch = c.rank() == 3 ? c.dim(0) : 1;
  if (c.numel() == 0) return absl::OkStatus();

  std::vector<float> a_buffer, b_buffer, c_buffer;
  const Operand a =
      DispatchFloat(args.a.dtype(), [&]<typename T>() { return Widen<T>(args.a, a_buffer); });
  const Operand b =
      DispatchFloat(args.b.dtype(), [&]<typename T>() { return Widen<T>(args.b, b_buffer); });
  // C is computed in fp32: in place when it is fp32, else in a staging buffer.
  float* c_data = DispatchFloat(c.dtype(), [&]<typename T>() -> float* {
    if constexpr (std::is_same_v<T, float>) {
      return c.data<float>();
    } else {
      c_buffer.assign(c.numel(), 0.0f);
      if (args.beta != 0.0f) AsFloat(c.data<T>(), c.numel(), c_buffer);
      return c_buffer.data();
    }
  });

  for (int64_t i = 0; i < batch; ++i) {
    float* c_i = c_data + i * m * n;
    if (k == 0) {  // C = beta * C; BLAS semantics: beta == 0 does not read C
      for (int64_t j = 0; j < m * n; ++j) c_i[j] = args.beta == 0.0f ? 0.0f : args.beta * c_i[j];
      continue;
    }
    cblas_sgemm(CblasRowMajor, args.trans_a ? CblasTrans : CblasNoTrans,
                args.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), args.alpha,
                a.data + i * a.batch_stride, static_cast<blasint>(a.ld),
                b.data + i * b.batch_stride, static_cast<blasint>(b.ld), args.beta, c_i,
                static_cast<blasint>(std::max<int64_t>(1, n)));
  }

  DispatchFloat(c.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) StoreFloats(c_data, c.numel(), c.data<T>());
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
