// Finding inf and NaN in a buffer by the elements' bit patterns (an all-ones exponent), without
// converting: f32, f16, bf16 and f64 alike. Checkpoints are checked with it (none is written,
// loaded, exported or converted with a non-finite value: a non-finite parameter, master weight
// or moment is never a state to resume from), and so are the ops' outputs in the NaN-origin
// search (core/ops/nonfinite_trace.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace nf {

struct NonFinite {
  int64_t count = 0;   // non-finite elements
  int64_t first = -1;  // the index of the first, -1 when none
};

// Over `count` elements of `dtype` (f32, f16, bf16 or f64; other dtypes have none) at `data`.
NonFinite FindNonFinite(const void* data, int64_t count, DType dtype);

}  // namespace nf
