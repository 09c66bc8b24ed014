// Loading only a checkpoint's model parameters, for programs that run a model without training
// it (nf-eval): no optimizer, so no fp32 master weights or moments are read or allocated. Like
// LoadCheckpoint (load.h), any (tp, pp) layout loads any checkpoint: each parameter's shard is
// read from the pieces that hold its elements (and no others), their checksums verified, and
// converted to the model's dtype.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "model/param_table.h"

namespace nf::checkpoint {

// Fills every parameter of `params` (one model chunk on tensor-parallel rank tp_rank of tp_size)
// from the PARAM records of the checkpoint in `dir`. FailedPrecondition naming the parameter
// when the checkpoint lacks one; DataLoss as CheckRecord and ReadLocalRanges report it.
absl::Status LoadParameters(const std::filesystem::path& dir, const Manifest& manifest,
                            model::ParamTable& params, int tp_rank, int tp_size);

}  // namespace nf::checkpoint
