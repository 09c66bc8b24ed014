#include "launcher/gemm_ceiling.h"

#include <algorithm>
#include <chrono>

#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::launcher {

namespace {

// FLOP/s of an n x n x n product on `device`: the best of three after a warm-up; `seconds` is
// the best one's time.
absl::StatusOr<double> BestOfThree(Device device, DType type, int64_t n, double* seconds) {
  NF_ASSIGN_OR_RETURN(const Tensor a, ops::Zeros(type, {n, n}, device));
  NF_ASSIGN_OR_RETURN(const Tensor b, ops::Zeros(type, {n, n}, device));
  NF_ASSIGN_OR_RETURN(const Tensor c, ops::Zeros(type, {n, n}, device));
  NF_RETURN_IF_ERROR(ops::Fill(a, 0.5f));
  NF_RETURN_IF_ERROR(ops::Fill(b, 0.25f));
  double best = 0.0;
  for (int i = 0; i < 4; ++i) {
    NF_RETURN_IF_ERROR(ops::Synchronize(device));
    const auto start = std::chrono::steady_clock::now();
    NF_RETURN_IF_ERROR(ops::Gemm({.a = a, .b = b, .c = c}));
    NF_RETURN_IF_ERROR(ops::Synchronize(device));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 && (best == 0.0 || took < *seconds)) {
      *seconds = took;
      best = 2.0 * static_cast<double>(n * n * n) / took;
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<double> MeasureGemmFlops(Device device, DType dtype) {
  double seconds = 0.0;
  if (device.type != DeviceType::kCuda) return BestOfThree(device, DType::kF32, 512, &seconds);
  for (int64_t n = kFirstGpuGemmSize;; n *= 2) {
    NF_ASSIGN_OR_RETURN(const double flops, BestOfThree(device, dtype, n, &seconds));
    if (n >= kLastGpuGemmSize || seconds >= kLongEnoughSeconds) return flops;
  }
}

double ModelFlopsPerToken(int64_t parameters, int layers, int d_model, int seq_len) {
  return 6.0 * static_cast<double>(parameters) +
         6.0 * layers * static_cast<double>(d_model) * seq_len;
}

}  // namespace nf::launcher
