// Fixed-lane reductions shared by the ISA kernel sources (core/cpu/isa/isa.h). Included only by
// sources that nf_add_isa_sources compiles, so everything here lives in that compilation's
// namespace (one copy per ISA level: an inline function shared across levels would let the
// linker keep the AVX-512 copy for the baseline too).
//
// A reduction over n terms of type T keeps N = kLanesOf<T> partial sums: term c goes to lane c % N,
// each lane adds its terms in index order, and the lanes are combined by a fixed tree. The grouping
// depends on n only, never on the ISA level or the thread count, and the lane loop has no
// cross-iteration dependence, so GCC vectorises it without -ffast-math. The lane loops carry
// `#pragma GCC unroll 1`: unrolled first, GCC turns the lanes into scalars and leaves them so
// (seen on max and on exp sums); kept as a loop, the loop vectoriser makes them vector registers.
#pragma once

#include <cstdint>
#include <limits>

namespace nf::cpu::NF_ISA_NAMESPACE {

// A reduction's lanes fill 128 bytes: 16 doubles or 32 floats, two AVX-512 registers (four AVX2
// or eight SSE2 ones); several independent accumulators also hide the adds' latency.
template <typename T>
inline constexpr int64_t kLanesOf = 128 / sizeof(T);
inline constexpr int64_t kLanes = kLanesOf<double>;

// lanes[0] + ... + lanes[N - 1] by a fixed tree (lane l += lane l + width, halving).
template <typename T, int64_t N>
T CombineLanes(T (&lanes)[N]) {
  static_assert(N == kLanesOf<T>);
  for (int64_t width = N / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// lanes[c % N] += term(c) for c in [0, n), in index order: a row's sum taken in pieces whose
// lengths (but the last) are multiples of N gives LaneSum's bits.
template <typename T, int64_t N, typename Term>
void AddToLanes(T (&lanes)[N], int64_t n, Term&& term) {
  static_assert(N == kLanesOf<T>);
  int64_t c = 0;
  for (; c + N <= n; c += N) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < N; ++l) lanes[l] += term(c + l);
  }
  for (int64_t l = 0; c + l < n; ++l) lanes[l] += term(c + l);
}

// Two lane sets in one pass: terms(c, t1, t2) sets the two terms of index c (T&), added to
// lanes1 and lanes2 as AddToLanes would add them.
template <typename T, int64_t N, typename Terms>
void AddToLanes2(T (&lanes1)[N], T (&lanes2)[N], int64_t n, Terms&& terms) {
  static_assert(N == kLanesOf<T>);
  const auto add = [&](int64_t c, int64_t l) {
    T t1, t2;
    terms(c, t1, t2);
    lanes1[l] += t1;
    lanes2[l] += t2;
  };
  int64_t c = 0;
  for (; c + N <= n; c += N) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < N; ++l) add(c + l, l);
  }
  for (int64_t l = 0; c + l < n; ++l) add(c + l, l);
}

// sum over c in [0, n) of term(c) (a T: double unless asked), in kLanesOf<T> lanes.
template <typename T = double, typename Term>
T LaneSum(int64_t n, Term&& term) {
  T lanes[kLanesOf<T>] = {};
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
