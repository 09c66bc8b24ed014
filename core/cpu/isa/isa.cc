#include "core/cpu/isa/isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nf::cpu {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

#if defined(__x86_64__)
namespace {

// The x86-64 micro-architecture levels the variants are compiled for (-march=x86-64-v3/v4),
// read from CPUID and XGETBV directly: GCC's __builtin_cpu_supports("x86-64-v3") has no
// equivalent in clang 14 (the fuzzers' compiler), which also lacks "f16c", "lzcnt" and "movbe".
struct Cpuid {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Cpuid Query(unsigned leaf, unsigned subleaf = 0) {
  Cpuid r;
  if (static_cast<unsigned>(__get_cpuid_max(leaf & 0x80000000u, nullptr)) < leaf) return r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool Bit(unsigned word, int bit) { return ((word >> bit) & 1u) != 0; }

Isa DetectX86Level() {
  const Cpuid basic = Query(1), extended = Query(7), amd = Query(0x80000001u);
  // The OS must save the vector registers: XCR0 bits 1-2 (SSE, AVX) and 5-7 (AVX-512 state).
  if (!Bit(basic.ecx, 27)) return Isa::kBaseline;  // OSXSAVE
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool avx_state = (xcr0_low & 0x6u) == 0x6u;
  const bool avx512_state = avx_state && (xcr0_low & 0xe0u) == 0xe0u;
  const bool v3 = avx_state && Bit(basic.ecx, 12) /*FMA*/ && Bit(basic.ecx, 22) /*MOVBE*/ &&
                  Bit(basic.ecx, 28) /*AVX*/ && Bit(basic.ecx, 29) /*F16C*/ &&
                  Bit(extended.ebx, 3) /*BMI1*/ && Bit(extended.ebx, 5) /*AVX2*/ &&
                  Bit(extended.ebx, 8) /*BMI2*/ && Bit(amd.ecx, 5) /*LZCNT*/;
  if (!v3) return Isa::kBaseline;
  const bool v4 = avx512_state && Bit(extended.ebx, 16) /*AVX512F*/ &&
                  Bit(extended.ebx, 17) /*AVX512DQ*/ && Bit(extended.ebx, 28) /*AVX512CD*/ &&
                  Bit(extended.ebx, 30) /*AVX512BW*/ && Bit(extended.ebx, 31) /*AVX512VL*/;
  return v4 ? Isa::kAvx512 : Isa::kAvx2;
}

}  // namespace
#endif

Isa DetectedIsa() {
#if defined(__x86_64__)
  static const Isa level = DetectX86Level();
  return level;
#else
  return Isa::kBaseline;
#endif
}

Isa CappedIsa(const char* requested, Isa detected) {
  if (requested == nullptr || *requested == '\0') return detected;
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (std::strcmp(requested, IsaName(isa)) == 0) return isa < detected ? isa : detected;
  }
  std::fprintf(
      stderr,
      "NF_CPU_ISA=%s: expected baseline, avx2 or avx512 (unset: the best this CPU runs, %s)\n",
      requested, IsaName(detected));
  std::exit(2);
}

Isa SelectedIsa() {
  static const Isa selected = CappedIsa(std::getenv("NF_CPU_ISA"), DetectedIsa());
  return selected;
}

std::vector<Isa> RunnableIsas() {
  std::vector<Isa> levels;
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (isa <= DetectedIsa()) levels.push_back(isa);
  }
  return levels;
}

}  // namespace nf::cpu
