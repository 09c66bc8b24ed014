// Reproducible shuffles for the sample indices: Fisher-Yates driven by Philox (core/philox.h),
// so a permutation is a pure function of (seed, stream, block) and its size, on any platform
// and standard library (std::shuffle and the std distributions are not specified bit for bit).
#pragma once

#include <cstdint>
#include <span>

namespace nf::data {

// A uniform integer in [0, bound), bound >= 1: a pure function of (seed, stream, block, i).
// Unbiased: 64-bit draws from the top 2^64 mod bound are rejected and redrawn.
uint64_t UniformBelow(uint64_t bound, uint32_t seed, uint32_t stream, uint32_t block, uint64_t i);

// Permutes `values` in place; different (seed, stream, block) give independent permutations.
void SeededShuffle(std::span<int64_t> values, uint32_t seed, uint32_t stream, uint32_t block);

}  // namespace nf::data
