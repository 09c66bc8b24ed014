// Compiled once per ISA level (nf_add_isa_sources): see gemm_kernels.h.
#include "core/cpu/isa/gemm_kernels.h"

#include <bit>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "core/cpu/isa/lanes.h"

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

void WidenBf16(const uint16_t* src, int64_t k, float* w) {
  for (int64_t c = 0; c < k; ++c) w[c] = std::bit_cast<float>(static_cast<uint32_t>(src[c]) << 16);
}

// fp16 bits -> fp32 without a branch, so that the loop vectorises, and without touching an fp32
// subnormal (an operation on one costs a microcode assist). Normal values move their exponent
// and mantissa into fp32's places and rebias the exponent by 112; subnormal ones, m 2^-24, are
// the integer m converted and scaled (exact: m < 2^10, and the product is an fp32 normal); the
// all-ones exponent (inf, NaN) is rebuilt in the bits, NaNs made quiet as HalfBitsToFloat
// makes them. Selects are masks (no ?: on values), which every level vectorises.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;
  const uint32_t mantissa = h & 0x3FFu;
  const uint32_t normal = (magnitude << 13) + (112u << 23);
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f);
  const uint32_t special = 0x7F800000u | (mantissa << 13) | ((mantissa != 0) << 22);
  const uint32_t is_subnormal = -static_cast<uint32_t>(magnitude < 0x0400u);
  const uint32_t is_special = -static_cast<uint32_t>(magnitude >= 0x7C00u);
  const uint32_t finite = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  return std::bit_cast<float>(sign | (special & is_special) | (finite & ~is_special));
}

void WidenF16(const uint16_t* src, int64_t k, float* w) {
  int64_t c = 0;
#ifdef __F16C__
  // The AVX2 and AVX-512 levels convert 8 values an instruction in hardware (vcvtph2ps: exact,
  // NaNs made quiet): the bit operations cost ~40 instructions per 8 values at AVX2, which made
  // an fp16 weight row take twice a bf16 one. GCC does not vectorise _Float16 casts into it.
  for (; c + 8 <= k; c += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    _mm256_storeu_ps(w + c, _mm256_cvtph_ps(halves));
  }
#endif
  for (; c < k; ++c) w[c] = HalfToFloat(src[c]);
}

void DotRows(const float* a, int64_t rows, const float* w, int64_t k, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = a + i * k;
    out[i] = LaneSum<float>(k, [&](int64_t c) { return row[c] * w[c]; });
  }
}

}  // namespace

const GemmKernels kGemmKernels = {
    .widen_bf16 = WidenBf16,
    .widen_f16 = WidenF16,
    .dot_rows = DotRows,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
