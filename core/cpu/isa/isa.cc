#include "core/cpu/isa/isa.h"

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

Isa DetectedIsa() {
#if defined(__x86_64__) && defined(__GNUC__)
  // x86-64-v4 and v3 as GCC defines them (the -march levels the variants are compiled for).
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
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
