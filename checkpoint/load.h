// Loading a checkpoint into a run of any (tp, pp, dp, ZeRO) layout. Every rank reads the
// manifest and, for each parameter its chunks hold, the pieces of that parameter's global
// tensors (parameters, fp32 master weights, both moments) from whichever shard files hold
// them, verifies each piece's checksum, assembles the global tensor and cuts out its own shard
// (and its optimizer slices). Nothing in the files is ever executed or followed outside the
// checkpoint directory; every problem is a one-line error naming the checkpoint and the file or
// field, and nothing on disk is changed.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/training_state.h"
#include "model/model_config.pb.h"

namespace nf::checkpoint {

// The checkpoint directory `latest` names in `checkpoints_dir`; NotFound when there is no
// `latest` (a fresh run).
absl::StatusOr<std::filesystem::path> LatestCheckpoint(
    const std::filesystem::path& checkpoints_dir);

// Reads `dir`/manifest.pb and checks it: it parses, has this format version, and every shard
// file it lists exists with the recorded size.
absl::StatusOr<Manifest> ReadManifest(const std::filesystem::path& dir);

// OK when the checkpoint was written for `model`; otherwise names every differing field with
// both values.
absl::Status CheckSameModel(const std::filesystem::path& dir, const Manifest& manifest,
                            const model::ModelConfig& model);

// Loads parameters and optimizer state into `state`'s chunks and returns the run's progress.
absl::StatusOr<RunProgress> LoadCheckpoint(const std::filesystem::path& dir,
                                           const Manifest& manifest, const RankState& state);

}  // namespace nf::checkpoint
