// The ceiling the progress line's MFU is measured against: the matrix-product throughput of
// this rank's device, measured at the start of the run with the op table's own GEMM (OpenBLAS
// sgemm on the CPU, cuBLASLt in the model's precision on a GPU), so that MFU means the same
// thing on every machine and needs no table of datasheet peaks. nf-bench reports MFU against
// the datasheet peak as well.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/model_config.pb.h"

namespace nf::launcher {

// FLOP/s of an n x n x n product (the best of three after a warm-up) on `device` with inputs of
// `dtype` (fp32 on the CPU whatever the model's dtype: the CPU backend computes in fp32). On the
// CPU n = 512; on a GPU n doubles from 1024 until one product takes 10 ms or n reaches 8192,
// where every current GPU is saturated (an H100 needs 1.6 ms for 8192 in bf16, so it is timed
// at 8192; a slow device, such as the emulated GPU of the tests, stops early).
inline constexpr int64_t kFirstGpuGemmSize = 1024;
inline constexpr int64_t kLastGpuGemmSize = 8192;
inline constexpr double kLongEnoughSeconds = 0.01;
absl::StatusOr<double> MeasureGemmFlops(Device device, DType dtype);

// Model FLOPs per token of a training step as llm.c counts them: 6 x parameters for the
// matrix products forward and backward, plus 6 x layers x d_model x seq_len for attention's
// two products (PaLM's 12, halved for the causal mask; a masked LM's bidirectional attention
// computes all of PaLM's 12). The dry run, the progress line's MFU and the benchmarks all use
// this count.
double ModelFlopsPerToken(int64_t parameters, const model::ModelConfig& model, int seq_len);
// "6 x params + 6 x layers x d_model x seq" (12 for a masked LM): the count, for the MFU line.
std::string ModelFlopsFormula(const model::ModelConfig& model);

}  // namespace nf::launcher
