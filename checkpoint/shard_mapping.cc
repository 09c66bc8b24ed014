#include "checkpoint/shard_mapping.h"

#include <algorithm>

namespace nf::checkpoint {
namespace {

int64_t Cols(const Shape& shape) { return shape.size() > 1 ? shape[1] : 1; }

}  // namespace

Sharding ShardingToProto(model::Sharding sharding) {
  switch (sharding) {
    case model::Sharding::kSplitRows:
      return SPLIT_ROWS;
    case model::Sharding::kSplitCols:
      return SPLIT_COLS;
    default:
      return REPLICATED;
  }
}

model::Sharding ShardingFromProto(Sharding sharding) {
  switch (sharding) {
    case SPLIT_ROWS:
      return model::Sharding::kSplitRows;
    case SPLIT_COLS:
      return model::Sharding::kSplitCols;
    default:
      return model::Sharding::kReplicated;
  }
}

Shape LocalShape(const Shape& global_shape, const ShardPlace& place) {
  Shape local = global_shape;
  if (place.sharding == model::Sharding::kSplitRows) local[0] /= place.tp_size;
  if (place.sharding == model::Sharding::kSplitCols) local[1] /= place.tp_size;
  return local;
}

void ForEachGlobalRun(const Shape& global_shape, const ShardPlace& place, int64_t begin,
                      int64_t end, absl::FunctionRef<void(int64_t, int64_t, int64_t)> fn) {
  if (begin >= end) return;
  const Shape local = LocalShape(global_shape, place);
  switch (place.sharding) {
    case model::Sharding::kReplicated:
      fn(begin, begin, end - begin);
      return;
    case model::Sharding::kSplitRows: {
      const int64_t shard_elements = NumElements(local);
      fn(begin, place.tp_rank * shard_elements + begin, end - begin);
      return;
    }
    case model::Sharding::kSplitCols: {
      const int64_t cols = local[1], global_cols = Cols(global_shape);
      const int64_t col0 = place.tp_rank * cols;
      for (int64_t i = begin; i < end;) {
        const int64_t row = i / cols, col = i % cols;
        const int64_t count = std::min(end - i, cols - col);
        fn(i, row * global_cols + col0 + col, count);
        i += count;
      }
      return;
    }
  }
}

}  // namespace nf::checkpoint
