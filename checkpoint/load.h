// Loading a checkpoint into a run of any (tp, pp, dp, ZeRO) layout. Every rank reads the
// manifest and, for each parameter its chunks hold, the pieces of that parameter's global
// tensors (parameters, fp32 master weights, both moments) that hold elements of its own shard
// (and of its optimizer slices), from whichever shard files hold them, verifies each piece's
// checksum and copies the elements it needs into place. Nothing in the files is ever executed or
// followed outside the checkpoint directory; every problem is a one-line error naming the
// checkpoint and the file or field, and nothing on disk is changed.
#pragma once

#include <filesystem>
#include <string>

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

// Reads `dir`/manifest.pb and checks it: its checksum and structure (manifest_file.h), its step
// against the directory's name, and every shard file it lists exists with the recorded size.
absl::StatusOr<Manifest> ReadManifest(const std::filesystem::path& dir);

// The steps of the checkpoints in `checkpoints_dir`: iteration directories whose manifest reads
// (ReadManifest), ascending. Retention counts and removes only these: a directory that merely
// carries a checkpoint's name (empty, half copied, damaged) is neither counted nor touched.
std::vector<int64_t> CheckpointSteps(const std::filesystem::path& checkpoints_dir);

// Where a run in `checkpoints_dir` resumes: the checkpoint `latest` names when its manifest
// reads (ReadManifest). When `latest` is missing or damaged, or names a checkpoint that fails,
// the newest checkpoint whose manifest reads, with `warning` naming what was wrong and the
// checkpoint taken instead. NotFound when there is no checkpoint at all (a fresh run);
// FailedPrecondition when there are checkpoints and none reads: never a silent fresh start.
// (The shards' checksums are checked as they load.)
struct ResumePoint {
  std::filesystem::path dir;
  Manifest manifest;
  std::string warning;  // empty when `latest` was taken
};
absl::StatusOr<ResumePoint> FindResumePoint(const std::filesystem::path& checkpoints_dir);

// OK when the checkpoint was written for `model`; otherwise names every differing field with
// both values.
absl::Status CheckSameModel(const std::filesystem::path& dir, const Manifest& manifest,
                            const model::ModelConfig& model);

// What a load read, for benchmarks and tests.
struct LoadStats {
  int64_t bytes_read = 0;  // from the shard files: whole pieces, only those this rank needs
};

// Loads parameters and optimizer state into `state`'s chunks and returns the run's progress.
// A rank reads only the pieces that hold elements of its shards and optimizer slices.
absl::StatusOr<RunProgress> LoadCheckpoint(const std::filesystem::path& dir,
                                           const Manifest& manifest, const RankState& state,
                                           LoadStats* stats = nullptr);

}  // namespace nf::checkpoint
