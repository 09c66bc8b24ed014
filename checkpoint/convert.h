// Offline resharding: rewrites a checkpoint with one shard file per rank of another layout,
// each holding exactly what that rank saves (so the result is what a run on the target layout
// would have written). Loading already reshards any checkpoint on the fly; converting first
// makes every rank's load read only its own file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "absl/status/status.h"
#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint.pb.h"

namespace nf::checkpoint {

struct TargetLayout {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int data_parallel = 1;
  int virtual_stages = 1;
  bool distributed_optimizer = false;
  int64_t grad_bucket_elements = int64_t{1} << 22;  // the target run's parallel setting
};

// Writes the converted checkpoint to `out` (staged as out.tmp, renamed when complete, removed on
// failure); refuses an existing `out` and layouts the model cannot split into, saying what would
// work. Two whole tensors are in memory at a time (the next one read while one is cut and
// written: checkpoint/read_ahead.h), with one rank's shard of one.
absl::Status ConvertCheckpoint(const std::filesystem::path& dir, const Manifest& manifest,
                               const TargetLayout& target, const std::filesystem::path& out);

// The whole tensor of a record of `manifest` ([numel] in the record's dtype, host).
using WholeTensorSource = std::function<absl::StatusOr<AssembledTensor>(const TensorRecord&)>;

// The same for checkpoints that are not (yet) on disk as one: every record of `manifest` (whose
// pieces are ignored) comes from `read`, record by record in the manifest's order, on a second
// thread (one call at a time); `source` names where they come from in errors.
absl::Status WriteCheckpointForLayout(const std::filesystem::path& source, const Manifest& manifest,
                                      const WholeTensorSource& read, const TargetLayout& target,
                                      const std::filesystem::path& out);

}  // namespace nf::checkpoint
