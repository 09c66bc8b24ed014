#include "launcher/gemm_ceiling.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
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

namespace {

// Attention's two [S, S] products per layer, forward and backward, per d_model x seq_len.
double AttentionFactor(const model::ModelConfig& model) {
  return model.objective() == model::ModelConfig::MASKED_LM ? 12.0 : 6.0;
}

}  // namespace

double ModelFlopsPerToken(int64_t parameters, const model::ModelConfig& model, int seq_len) {
  return 6.0 * static_cast<double>(parameters) + AttentionFactor(model) * model.num_layers() *
                                                     static_cast<double>(model.d_model()) * seq_len;
}

std::string ModelFlopsFormula(const model::ModelConfig& model) {
  return absl::StrCat("6 x params + ", AttentionFactor(model), " x layers x d_model x seq");
}

}  // namespace nf::launcher
