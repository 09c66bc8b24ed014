// Runtime CPU dispatch for the CPU backend's vectorised kernels.
//
// The hot loops (elementwise, LayerNorm, softmax, the optimizer) are plain C++ over float arrays,
// written so the compiler vectorises them (no cross-iteration dependences; reductions kept in a
// fixed number of lanes, so no reassociation is needed). Each such source is compiled once per
// ISA level by CMake's nf_add_isa_sources, into namespace nf::cpu::isa_<level>, and publishes a
// table of function pointers there; the backend calls the table of the best level this CPU runs
// (or the one NF_CPU_ISA caps it to). The baseline (x86-64: SSE2) is always there, so the program
// runs on any x86-64 CPU; on other architectures every level is compiled for the baseline.
//
// A kernel's result may differ between levels by rounding (FMA contraction, lane count), never
// between thread counts: the lanes are fixed by the level, the thread pool only picks who runs
// which rows.
#pragma once

#include <vector>

namespace nf::cpu {

enum class Isa {
  kBaseline,  // x86-64 (SSE2), or the target's baseline off x86
  kAvx2,      // x86-64-v3: AVX2, FMA, F16C
  kAvx512,    // x86-64-v4: AVX-512 F/BW/DQ/VL
};

const char* IsaName(Isa isa);

// The best level this CPU supports.
Isa DetectedIsa();

// The level the kernels use: DetectedIsa(), capped by NF_CPU_ISA (baseline, avx2 or avx512) when
// it is set. A value that is none of these ends the process with a one-line message (exit 2).
Isa SelectedIsa();

// SelectedIsa's rule: `detected`, capped by `requested` (NF_CPU_ISA's value; null or empty:
// no cap); any other value ends the process with a one-line message naming it (exit 2).
Isa CappedIsa(const char* requested, Isa detected);

// Every level this CPU can run, baseline first (what tests compare the levels over).
std::vector<Isa> RunnableIsas();

// The table of `isa` among a kernel family's three compilations.
template <typename Table>
const Table& TableFor(Isa isa, const Table& baseline, const Table& avx2, const Table& avx512) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    case Isa::kBaseline:
      break;
  }
  return baseline;
}

}  // namespace nf::cpu

// Declares, in nf::cpu, a kernel family's three tables (each defined by the family's source in
// its compilation's namespace, `const Table name = {...}`) and two accessors: `for_isa(isa)`,
// the table of a level (tests compare the levels), and `selected()`, the table of SelectedIsa().
#define NF_ISA_KERNEL_TABLES(Table, name, for_isa, selected)                    \
  namespace isa_baseline {                                                      \
  extern const Table name;                                                      \
  }                                                                             \
  namespace isa_avx2 {                                                          \
  extern const Table name;                                                      \
  }                                                                             \
  namespace isa_avx512 {                                                        \
  extern const Table name;                                                      \
  }                                                                             \
  inline const Table& for_isa(Isa isa) {                                        \
    return TableFor(isa, isa_baseline::name, isa_avx2::name, isa_avx512::name); \
  }                                                                             \
  inline const Table& selected() {                                              \
    static const Table& table = for_isa(SelectedIsa());                         \
    return table;                                                               \
  }
