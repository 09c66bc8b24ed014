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
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/checkpoint_names.h"
#include "checkpoint/manifest_file.h"
#include "checkpoint/training_state.h"
#include "parallel/communicator.h"

namespace nf::checkpoint {

// Which checkpoints survive a save: the newest keep_last, and every one whose step is a
// multiple of keep_every (0: none) forever.
struct RetentionPolicy {
  int keep_last = 2;
  int64_t keep_every = 0;
};

// Collective over `world` (every rank calls it at the same step). Fails on every rank when any
// rank could not write its shard; then nothing is committed and the previous `latest` stays.
absl::Status SaveCheckpoint(const std::filesystem::path& checkpoints_dir, const RankState& state,
                            const RunProgress& progress, parallel::Communicator& world,
                            const RetentionPolicy& retention = {});

// This rank's pieces in host memory (save.cc).
struct ShardSnapshot;

// What the manifest records besides the pieces.
struct CommitInfo {
  RunProgress progress;
  model::ModelConfig model;
  std::string train_config;
  Layout layout;
  RetentionPolicy retention;
};

// Saving in the background: Start plans this rank's shard and returns; a thread copies the
// state into host memory while the next step's forward and backward run (each chunk's next
// optimizer Update, the only writer of the saved state, waits for that copy:
// DataParallelOptimizer::AddStateReader), then writes the copy while training continues. The
// commit, which is collective, happens in Poll once every rank's write has finished, or in
// Finish. At most one save is in flight: Start finishes the previous one first. Errors of a
// background write surface from the Poll or Finish that commits it, on every rank. The state
// must outlive the save: Finish, or destroy the checkpointer, before the trainer.
class AsyncCheckpointer {
 public:
  // on_commit (optional) is called with each checkpoint directory once it is committed.
  AsyncCheckpointer(std::filesystem::path checkpoints_dir, RetentionPolicy retention,
                    std::function<void(const std::filesystem::path&)> on_commit = nullptr);
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  // Discards a save in flight (call Finish first to keep it): waits for this rank's write,
  // removes its shard file, and rank 0 removes the staging directory, so that a run ending in
  // an error leaves no iter_*.tmp behind and `latest` as it was.
  ~AsyncCheckpointer();

  // Allocates the buffer this rank's saves copy the state into, and maps its pages, on a
  // background thread, so that the first save copies as fast as later ones, which reuse it:
  // into fresh memory the copy is several times slower, and the step after Start waits for it
  // (the loop was blocked 0.5 s by a run's first async save, 0.001 s by later ones). Call once
  // the state is built; the first Start waits for it. (Plans the shard as a save does: on a GPU
  // that includes copying the state to the host once.)
  void Reserve(const RankState& state);
  // Collective (every rank, the same step).
  absl::Status Start(const RankState& state, const RunProgress& progress,
                     parallel::Communicator& world);
  // Collective, one tiny all-reduce while a save is pending: call once per step.
  absl::Status Poll(parallel::Communicator& world);
  // Collective: waits for this rank's write and commits; a no-op without a pending save.
  absl::Status Finish(parallel::Communicator& world);
  bool pending() const { return pending_ != nullptr; }

 private:
  struct Pending {
    CommitInfo info;
    int world_rank = 0;
    std::shared_ptr<absl::StatusOr<ShardSnapshot>> snapshot;  // shared with the writer
    std::future<absl::StatusOr<Manifest>> write;              // this rank's fragment, once written
  };
  absl::Status Commit(parallel::Communicator& world);

  std::filesystem::path dir_;
  RetentionPolicy retention_;
  std::function<void(const std::filesystem::path&)> on_commit_;
  std::unique_ptr<Pending> pending_;
  // The last committed snapshot, whose buffer the next one reuses.
  std::unique_ptr<ShardSnapshot> spare_;
  // Reserve's buffer (in a snapshot of its own), while it is being mapped or until Start.
  std::future<std::unique_ptr<ShardSnapshot>> reserved_;
};

}  // namespace nf::checkpoint
