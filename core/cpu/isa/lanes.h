// Fixed-lane reductions shared by the ISA kernel sources (core/cpu/isa/isa.h). Included only by
// sources that nf_add_isa_sources compiles, so everything here lives in that compilation's
// namespace (one copy per ISA level: an inline function shared across levels would let the
// linker keep the AVX-512 copy for the baseline too).
//
// A reduction over n terms keeps kLanes partial sums: term c goes to lane c % kLanes, each lane
// adds its terms in index order, and the lanes are combined by a fixed tree. The grouping
// depends on n only, never on the ISA level or the thread count, and the lane loop has no
// cross-iteration dependence, so GCC vectorises it without -ffast-math. The lane loops carry
// `#pragma GCC unroll 1`: unrolled first, GCC turns the lanes into scalars and leaves them so
// (seen on max and on exp sums); kept as a loop, the loop vectoriser makes them vector registers.
#pragma once

#include <cstdint>
#include <limits>

namespace nf::cpu::NF_ISA_NAMESPACE {

// 16 doubles: two AVX-512 registers, four AVX2 or eight SSE2 ones; several independent
// accumulators also hide the adds' latency.
inline constexpr int64_t kLanes = 16;

// lanes[0] + ... + lanes[kLanes - 1] by a fixed tree (lane l += lane l + width, halving).
inline double CombineLanes(double (&lanes)[kLanes]) {
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// lanes[c % kLanes] += term(c) for c in [0, n), in index order: a row's sum taken in pieces
// whose lengths (but the last) are multiples of kLanes gives LaneSum's bits.
template <typename Term>
void AddToLanes(double (&lanes)[kLanes], int64_t n, Term&& term) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(c + l);
  }
  for (int64_t l = 0; c + l < n; ++l) lanes[l] += term(c + l);
}

// Two lane sets in one pass: term(c, t1, t2) sets the two terms of index c, added to lanes1 and
// lanes2 as AddToLanes would add them.
template <typename Terms>
void AddToLanes2(double (&lanes1)[kLanes], double (&lanes2)[kLanes], int64_t n, Terms&& terms) {
  const auto add = [&](int64_t c, int64_t l) {
    double t1, t2;
    terms(c, t1, t2);
    lanes1[l] += t1;
    lanes2[l] += t2;
  };
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < kLanes; ++l) add(c + l, l);
  }
  for (int64_t l = 0; c + l < n; ++l) add(c + l, l);
}

// sum over c in [0, n) of term(c) (a double), in kLanes lanes.
template <typename Term>
double LaneSum(int64_t n, Term&& term) {
  double lanes[kLanes] = {};
  AddToLanes(lanes, n, term);
  return CombineLanes(lanes);
}

// max over i in [0, n) of x[i] in kLanes float lanes (exact in any order; NaN entries are
// skipped, as std::max(max, x) skips them); -inf when n = 0.
inline float LaneMax(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float lanes[kLanes];
  for (float& lane : lanes) lane = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = lanes[l] < x[i + l] ? x[i + l] : lanes[l];
  }
  for (int64_t l = 0; i + l < n; ++l) lanes[l] = lanes[l] < x[i + l] ? x[i + l] : lanes[l];
  float max = kNegInf;
  for (const float lane : lanes) max = max < lane ? lane : max;
  return max;
}

}  // namespace nf::cpu::NF_ISA_NAMESPACE
