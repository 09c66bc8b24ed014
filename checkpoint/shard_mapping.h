// Where the elements of a tensor-parallel shard sit in the global tensor. A parameter of
// global shape [rows, cols] (or [rows]) split over tp ranks is held by rank t as
//   kSplitRows: rows [t R, (t + 1) R), R = rows / tp: one contiguous run of the global tensor
//   kSplitCols: columns [t C, (t + 1) C) of every row, C = cols / tp: one run per row
//   kReplicated: the whole tensor
// in row-major order. Checkpoints record pieces as (shard, local element range) and map them
// through this to assemble global tensors and cut them for any other layout.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/tensor.h"
#include "model/param_table.h"

namespace nf::checkpoint {

struct ShardPlace {
  model::Sharding sharding = model::Sharding::kReplicated;
  int tp_rank = 0;
  int tp_size = 1;
};

// The manifest's spelling of a sharding, and back.
Sharding ShardingToProto(model::Sharding sharding);
model::Sharding ShardingFromProto(Sharding sharding);

// The local shape of `place`'s shard of a tensor of `global_shape`.
Shape LocalShape(const Shape& global_shape, const ShardPlace& place);

// Calls fn(local_index, global_index, count) for the maximal runs of elements [begin, end) of
// the local shard that are contiguous in the global tensor, in order.
void ForEachGlobalRun(const Shape& global_shape, const ShardPlace& place, int64_t begin,
                      int64_t end, absl::FunctionRef<void(int64_t, int64_t, int64_t)> fn);

}  // namespace nf::checkpoint
