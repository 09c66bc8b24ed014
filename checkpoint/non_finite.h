// Finding inf and NaN in a checkpoint's tensors by their bit patterns (an all-ones exponent),
// without converting: f32, f16 and bf16 alike. No checkpoint is written with one, and none is
// loaded, exported or converted with one: a non-finite parameter, master weight or moment is
// never a state to resume from.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace nf::checkpoint {

struct NonFinite {
  int64_t count = 0;   // non-finite elements
  int64_t first = -1;  // the index of the first, -1 when none
};

// Over `count` elements of `dtype` (f32, f16 or bf16; other dtypes have none) at `data`.
NonFinite FindNonFinite(const void* data, int64_t count, DType dtype);

}  // namespace nf::checkpoint
