// The vocabulary as the model sees it. The embedding and LM-head row count: both are padded so
// that each tensor-parallel rank holds an equal slice whose row count is a multiple of 128,
// which keeps GEMM tiles full and every rank's shard the same shape; padded rows are never
// predicted. And a masked LM's <mask> id.
#pragma once

#include <cstdint>

#include "model/model_config.pb.h"

namespace nf::model {

// A masked LM's <mask> id: model.mask_token, or the vocabulary's last id when it is -1.
inline int32_t MaskTokenId(const ModelConfig& config) {
  return config.mask_token() == -1 ? config.vocab_size() - 1 : config.mask_token();
}

// `vocab` rounded up to a multiple of 128 * tensor_parallel. Requires vocab >= 0 and
// tensor_parallel >= 1.
inline int64_t PaddedVocabSize(int64_t vocab, int tensor_parallel) {
  const int64_t multiple = int64_t{128} * tensor_parallel;
  return (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace nf::model
