// Reassembling one global tensor of a checkpoint from the pieces its shard files hold: what
// loading, verification and export share.
#pragma once

#include <filesystem>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/tensor.h"

namespace nf::checkpoint {

struct AssembledTensor {
  Tensor global;  // [numel] in the record's dtype, row-major
  Shape shape;    // the record's global shape
};

// The whole tensor of `record`, read from the shard files in `dir` that the manifest lists:
// every piece's bounds checked against its shard and its file, its CRC-32C verified, and every
// element covered exactly once. DataLoss errors name the checkpoint, the tensor and the file.
absl::StatusOr<AssembledTensor> AssembleTensor(const std::filesystem::path& dir,
                                               const Manifest& manifest,
                                               const TensorRecord& record);

}  // namespace nf::checkpoint
