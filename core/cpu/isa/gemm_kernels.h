// The CPU GEMM's loops over fp16/bf16 operands (core/cpu/gemm.cc), one table per ISA level
// (core/cpu/isa/isa.h): the widenings to fp32, which every fp16/bf16 GEMM runs on its operands,
// and the row dots of the skinny path. That path takes a few rows of A against a weight matrix
// stored in fp16 or bf16 and transposed, as a linear layer computes while decoding one token
// per sequence: each weight row is widened into a buffer that stays in L1 and every row of A is
// dotted with it, so the weights are read once, in their 2-byte form, where widening the whole
// matrix first wrote and read it again at 4 bytes.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"

namespace nf::cpu {

struct GemmKernels {
  // w[c] = the bfloat16 with bits src[c], as fp32, for c in [0, k): exact.
  void (*widen_bf16)(const uint16_t* src, int64_t k, float* w);
  // w[c] = the IEEE fp16 with bits src[c], as fp32, for c in [0, k): exact, and bit for bit
  // HalfBitsToFloat (core/half.h), NaN payloads made quiet included, without its branches.
  void (*widen_f16)(const uint16_t* src, int64_t k, float* w);
  // out[i] = sum over c in [0, k) of a[i k + c] * w[c], for i in [0, rows): fp32 products
  // summed in kLanesOf<float> fixed lanes (core/cpu/isa/lanes.h), the same bits for any thread
  // count; the AVX2 and AVX-512 levels may contract a product and its sum into one FMA.
  void (*dot_rows)(const float* a, int64_t rows, const float* w, int64_t k, float* out);
};

NF_ISA_KERNEL_TABLES(GemmKernels, kGemmKernels, GemmKernelsFor, SelectedGemmKernels)

}  // namespace nf::cpu
