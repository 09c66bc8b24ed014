// Reassembling one global tensor of a checkpoint from the pieces its shard files hold: what
// loading, verification and export share.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/shard_mapping.h"
#include "core/tensor.h"
#include "model/param_table.h"

namespace nf::checkpoint {

struct AssembledTensor {
  Tensor global;  // [numel] in the record's dtype, row-major
  Shape shape;    // the record's global shape
};

// A record whose metadata checks out: a known dtype, a valid global shape, every piece inside
// its shard and its file, and the pieces covering every element exactly once. No data read.
struct CheckedRecord {
  std::string what;  // "name (KIND)", for messages
  DType dtype;
  Shape shape;                     // global
  std::vector<ShardPlace> places;  // each piece's shard, in record order
};
absl::StatusOr<CheckedRecord> CheckRecord(const std::filesystem::path& dir,
                                          const Manifest& manifest, const TensorRecord& record);

// The whole tensor of `record`, read from the shard files in `dir` that the manifest lists:
// every piece's bounds checked against its shard and its file, its CRC-32C verified, and every
// element covered exactly once. DataLoss errors name the checkpoint, the tensor and the file.
absl::StatusOr<AssembledTensor> AssembleTensor(const std::filesystem::path& dir,
                                               const Manifest& manifest,
                                               const TensorRecord& record);

// The token embedding, the untied output projection ([padded vocabulary, d_model]) and a masked
// LM's output bias ([padded vocabulary]): tables whose padding rows depend on the layout.
bool IsVocabularyTable(const std::string& name);

// The shard of an assembled tensor that tensor-parallel rank tp_rank of tp_size holds of the
// parameter `spec` ([local_numel] in the assembled dtype). Vocabulary tables are padded per
// layout (to a multiple of 128 x tp rows), so their row counts may differ from the
// checkpoint's: rows it lacks are zero, rows beyond the model's are dropped. Any other shape
// difference is a DataLoss error naming both shapes.
// OK when a checkpoint tensor of global shape `shape` loads into the parameter `spec`: the same
// shape, or a vocabulary table with other (padding) row counts; else DataLoss naming both.
absl::Status CheckShapeFits(const std::filesystem::path& dir, const Shape& shape,
                            const model::ParamSpec& spec);

absl::StatusOr<Tensor> CutShard(const std::filesystem::path& dir, const AssembledTensor& a,
                                const model::ParamSpec& spec, int64_t local_numel, int tp_rank,
                                int tp_size);

}  // namespace nf::checkpoint
