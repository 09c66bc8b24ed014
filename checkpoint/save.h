// Saving a checkpoint: every rank writes its own shard file (no tensor data passes through
// another rank), rank 0 writes the manifest from everyone's piece lists and commits.
//
//   RUN/checkpoints/iter_0000200.tmp/      written by all ranks, fsynced
//       rank_00000.shard ... manifest.pb
//   RUN/checkpoints/iter_0000200/          after the rename: complete, loadable
//   RUN/checkpoints/latest                 "iter_0000200", replaced atomically
//
// A directory is renamed into place only after every shard and the manifest are on disk, so
// a crash at any moment leaves `latest` naming a complete checkpoint (or none); leftover .tmp
// directories are removed by the next save.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "checkpoint/training_state.h"
#include "parallel/communicator.h"

namespace nf::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr char kManifestName[] = "manifest.pb";
inline constexpr char kLatestName[] = "latest";

// Which checkpoints survive a save: the newest keep_last, and every one whose step is a
// multiple of keep_every (0: none) forever.
struct RetentionPolicy {
  int keep_last = 2;
  int64_t keep_every = 0;
};

// "iter_0000200".
std::string IterationDirName(int64_t step);

// Collective over `world` (every rank calls it at the same step). Fails on every rank when any
// rank could not write its shard; then nothing is committed and the previous `latest` stays.
absl::Status SaveCheckpoint(const std::filesystem::path& checkpoints_dir, const RankState& state,
                            const RunProgress& progress, parallel::Communicator& world,
                            const RetentionPolicy& retention = {});

}  // namespace nf::checkpoint
