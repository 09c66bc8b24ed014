// The embedding and LM-head row count for a tokenizer vocabulary. Both are padded so that each
// tensor-parallel rank holds an equal slice whose row count is a multiple of 128, which keeps
// GEMM tiles full and every rank's shard the same shape; padded rows are never predicted.
#pragma once

#include <cstdint>

namespace nf::model {

// `vocab` rounded up to a multiple of 128 * tensor_parallel. Requires vocab >= 0 and
// tensor_parallel >= 1.
inline int64_t PaddedVocabSize(int64_t vocab, int tensor_parallel) {
  const int64_t multiple = int64_t{128} * tensor_parallel;
  return (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace nf::model
