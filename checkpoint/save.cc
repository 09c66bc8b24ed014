#include "checkpoint/save.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/load.h"
#include "checkpoint/shard_mapping.h"
#include "core/files/atomic_file.h"
#include "core/non_finite.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "parallel/rank_warnings.h"

namespace nf::checkpoint {

// This rank's pieces with their descriptions: what a save writes, taken at a step boundary.
// A synchronous save writes the pieces from where they lie (the training state, or host copies
// of device buffers); an async save first copies them into `copy` so that training may go on
// while they are written. Checksums are computed by the writer (off the loop when async).
struct ShardSnapshot {
  std::string file;                  // "rank_00003.shard"
  int64_t size = 0;                  // of the file
  Manifest fragment;                 // this rank's records and pieces (checksums and files
                                     // entry: when written)
  std::vector<const char*> sources;  // each piece's bytes, in the file's order
  std::vector<Tensor> host_copies;   // device buffers' host copies, which sources point into
  std::unique_ptr<char[]> copy;      // async saves: each distinct piece once, back to back
  int64_t copy_capacity = 0;
};

namespace {

namespace fs = std::filesystem;

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// One piece to copy into a snapshot.
struct PieceSource {
  const model::ParamTable::Entry* entry;
  TensorRecord::Kind kind;
  DType dtype;
  const char* data;
  int64_t begin, end;
};

// The bytes of a tensor readable on the host: its own storage on the CPU, else a host copy
// appended to `keep` (which must outlive the pointer). A GPU's buffers are copied once per
// snapshot, whole, rather than piece by piece.
absl::StatusOr<const char*> HostBytes(const Tensor& t, std::vector<Tensor>& keep) {
  if (t.device().type == DeviceType::kCpu) return static_cast<const char*>(t.raw_data());
  NF_ASSIGN_OR_RETURN(Tensor host, ops::OnHost(t));
  keep.push_back(std::move(host));
  return static_cast<const char*>(keep.back().raw_data());
}

// Parameters: dp rank 0 of every (tp, pp) cell. Optimizer state: every dp rank for its slices
// when sharded, else dp rank 0. Tensor-parallel duplicates: tp rank 0. Copies of another
// stage's parameters: never (the owner writes them). Host copies of device buffers go to
// `keep`.
absl::StatusOr<std::vector<PieceSource>> PiecesOf(const RankState& state,
                                                  std::vector<Tensor>& keep) {
  const parallel::Topology& t = state.topology;
  std::vector<PieceSource> pieces;
  for (const ChunkState& chunk : state.chunks) {
    const parallel::DataParallelOptimizer& optimizer = *chunk.optimizer;
    optim::MixedPrecisionAdamW& adamw = chunk.optimizer->adamw();
    const auto states = OptimizerStateBuffers(adamw);
    NF_ASSIGN_OR_RETURN(const char* params, HostBytes(chunk.params->params(), keep));
    std::array<const char*, states.size()> state_bytes;
    for (size_t i = 0; i < states.size(); ++i) {
      NF_ASSIGN_OR_RETURN(state_bytes[i], HostBytes(*states[i].buffer, keep));
    }
    for (const model::ParamTable::Entry& e : chunk.params->entries()) {
      if (Contains(chunk.copies_of_other_stages, e.spec.name)) continue;
      if (e.spec.sharding == model::Sharding::kReplicated && t.tp_rank() != 0) continue;
      const int64_t numel = e.value.numel();
      if (t.dp_rank() == 0) {
        const char* data = params + e.offset * static_cast<int64_t>(SizeOf(e.value.dtype()));
        pieces.push_back({&e, TensorRecord::PARAM, e.value.dtype(), data, 0, numel});
      }
      if (!optimizer.sharded() && t.dp_rank() != 0) continue;
      NF_RETURN_IF_ERROR(optimizer.ForEachHeldPiece(
          e.offset, numel,
          [&](int64_t full_offset, int64_t state_offset, int64_t count) -> absl::Status {
            const int64_t begin = full_offset - e.offset;
            for (size_t i = 0; i < states.size(); ++i) {
              const char* data = state_bytes[i] + state_offset * sizeof(float);
              pieces.push_back({&e, states[i].kind, DType::kF32, data, begin, begin + count});
            }
            return absl::OkStatus();
          }));
    }
  }
  return pieces;
}

// "rank_00003.shard": the file each rank writes into a checkpoint.
std::string ShardFileName(int world_rank) { return absl::StrFormat("rank_%05d.shard", world_rank); }

// Where the checkpoint of `step` is written before its commit renames it into place.
fs::path StagingDir(const fs::path& checkpoints_dir, int64_t step) {
  return checkpoints_dir / (IterationDirName(step) + ".tmp");
}

// This rank's pieces as they lie: records and sources, nothing copied but device buffers.
absl::StatusOr<ShardSnapshot> PlanShard(const RankState& state) {
  const parallel::Topology& t = state.topology;
  ShardSnapshot shard;
  shard.file = ShardFileName(t.world_rank());
  NF_ASSIGN_OR_RETURN(const std::vector<PieceSource> sources, PiecesOf(state, shard.host_copies));
  for (const PieceSource& p : sources) {
    const model::ParamTable::Entry& e = *p.entry;
    const int64_t length = (p.end - p.begin) * static_cast<int64_t>(SizeOf(p.dtype));
    const bool replicated = e.spec.sharding == model::Sharding::kReplicated;
    TensorRecord* record = shard.fragment.add_tensors();
    record->set_name(e.spec.name);
    record->set_kind(p.kind);
    for (int64_t dim : e.spec.global_shape) record->add_global_shape(dim);
    record->set_dtype(std::string(DTypeName(p.dtype)));
    Piece* piece = record->add_pieces();
    piece->set_file(shard.file);
    piece->set_offset(shard.size);
    piece->set_length(length);
    piece->set_sharding(ShardingToProto(e.spec.sharding));
    piece->set_tp_rank(replicated ? 0 : t.tp_rank());
    piece->set_tp_size(replicated ? 1 : t.tp());
    piece->set_begin(p.begin);
    piece->set_end(p.end);
    shard.sources.push_back(p.data);
    shard.size += length;
  }
  return shard;
}

// Where each piece of a snapshot goes in its copy: a piece whose bytes another piece holds too
// (the master weights of an f32 model are its parameters) is copied once.
struct CopyLayout {
  struct Span {
    const char* from;
    int64_t offset, length;
  };
  std::vector<Span> spans;            // each distinct piece once, back to back
  std::vector<int64_t> piece_offset;  // per piece, in the file's order
  int64_t size = 0;
};

CopyLayout CopyLayoutOf(const ShardSnapshot& shard) {
  CopyLayout layout;
  std::map<std::pair<const char*, int64_t>, int64_t> copied;  // (source, length) -> offset
  size_t i = 0;
  for (const TensorRecord& record : shard.fragment.tensors()) {
    for (const Piece& piece : record.pieces()) {
      const auto [it, fresh] =
          copied.emplace(std::make_pair(shard.sources[i++], piece.length()), layout.size);
      if (fresh) {
        layout.spans.push_back({it->first.first, layout.size, piece.length()});
        layout.size += piece.length();
      }
      layout.piece_offset.push_back(it->second);
    }
  }
  return layout;
}

// A buffer of `bytes` whose pages are mapped: written once, so the kernel maps (and zeroes) each
// page now rather than during a copy into it.
std::unique_ptr<char[]> MappedBuffer(int64_t bytes) {
  std::unique_ptr<char[]> buffer(new char[static_cast<size_t>(bytes)]);
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (int64_t at = 0; at < bytes; at += page) buffer[static_cast<size_t>(at)] = 0;
  return buffer;
}

// Copies the pieces into the snapshot's own buffer, so that training may change the state
// while they are written. `spare` is a previous snapshot, whose buffer is reused when large
// enough: its pages are mapped already, which makes the copy several times faster than into
// fresh memory. An async save calls it on its writer thread, beside the next training step, so
// it copies on that one thread: the pool belongs to the step's kernels.
void CopyPieces(ShardSnapshot& shard, ShardSnapshot& spare) {
  const CopyLayout layout = CopyLayoutOf(shard);
  shard.copy = std::move(spare.copy);
  shard.copy_capacity = spare.copy_capacity;
  if (shard.copy == nullptr || shard.copy_capacity < layout.size) {
    shard.copy_capacity = std::max<int64_t>(layout.size, 1);
    shard.copy.reset(new char[static_cast<size_t>(shard.copy_capacity)]);
  }
  for (const CopyLayout::Span& span : layout.spans) {
    std::memcpy(shard.copy.get() + span.offset, span.from, static_cast<size_t>(span.length));
  }
  for (size_t p = 0; p < shard.sources.size(); ++p) {
    shard.sources[p] = shard.copy.get() + layout.piece_offset[p];
  }
  shard.host_copies.clear();  // nothing points into them any more
}

// Checks a piece for non-finite values, checksums it and appends it to `writer`, block by
// block: a block is read from memory once, and checked and checksummed while cached before
// write() copies it to the page cache.
absl::StatusOr<uint32_t> AppendPiece(DurableWriter& writer, const char* data,
                                     const TensorRecord& record, const Piece& piece, DType dtype,
                                     int world_rank) {
  constexpr int64_t kBlockBytes = int64_t{256} << 10;
  const int64_t element = static_cast<int64_t>(SizeOf(dtype));
  const int64_t block_elements = kBlockBytes / element;
  const int64_t count = piece.end() - piece.begin();
  uint32_t crc = 0;
  for (int64_t first = 0; first < count; first += block_elements) {
    const int64_t n = std::min(block_elements, count - first);
    const char* block = data + first * element;
    if (FindNonFinite(block, n, dtype).count > 0) {
      const NonFinite bad = FindNonFinite(data, count, dtype);  // all of them, for the message
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint not saved: ", record.name(), " (",
                       TensorRecord::Kind_Name(record.kind()), ") holds ", bad.count,
                       " non-finite values on rank ", world_rank, " (the first at element ",
                       piece.begin() + bad.first, "); the training state is not finite"));
    }
    crc = Crc32c(block, static_cast<size_t>(n * element), crc);
    NF_RETURN_IF_ERROR(writer.Append(block, n * element));
  }
  return crc;
}

// Checksums a snapshot's pieces and writes them into `staging`, fsynced; returns its fragment
// with the file listed. A non-finite value fails the save (the staging directory goes with
// it), so no checkpoint ever holds one.
absl::StatusOr<Manifest> WriteSnapshot(const fs::path& staging, ShardSnapshot& shard,
                                       int world_rank) {
  NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(staging / shard.file));
  size_t i = 0;
  for (TensorRecord& record : *shard.fragment.mutable_tensors()) {
    const DType dtype = *ParseDType(record.dtype());  // written by PlanShard
    for (Piece& piece : *record.mutable_pieces()) {
      NF_ASSIGN_OR_RETURN(const uint32_t crc, AppendPiece(writer, shard.sources[i++], record, piece,
                                                          dtype, world_rank));
      piece.set_crc32c(crc);
    }
  }
  NF_RETURN_IF_ERROR(writer.Close());
  ShardFile* file = shard.fragment.add_files();
  file->set_name(shard.file);
  file->set_size(shard.size);
  file->set_world_rank(world_rank);
  return std::move(shard.fragment);
}

// Every rank's bytes, in rank order (all-gathers the lengths, then the padded bytes).
absl::StatusOr<std::vector<std::string>> AllGatherBytes(parallel::Communicator& world,
                                                        const std::string& mine) {
  const int n = world.size();
  NF_ASSIGN_OR_RETURN(const Tensor length, Tensor::HostZeros(DType::kI64, {1}));
  NF_ASSIGN_OR_RETURN(const Tensor lengths, Tensor::HostZeros(DType::kI64, {n}));
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  NF_RETURN_IF_ERROR(world.AllGather(length, lengths));
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data<int64_t>()[r]);
  NF_ASSIGN_OR_RETURN(const Tensor bytes, Tensor::HostZeros(DType::kU8, {longest}));
  NF_ASSIGN_OR_RETURN(const Tensor all, Tensor::HostZeros(DType::kU8, {longest * n}));
  std::memcpy(bytes.raw_data(), mine.data(), mine.size());
  NF_RETURN_IF_ERROR(world.AllGather(bytes, all));
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    out.emplace_back(static_cast<const char*>(all.raw_data()) + r * longest,
                     static_cast<size_t>(lengths.data<int64_t>()[r]));
  }
  return out;
}

// True on every rank when `ok` is false on any.
absl::StatusOr<bool> AnyFailed(parallel::Communicator& world, bool ok) {
  NF_ASSIGN_OR_RETURN(const Tensor flag, Tensor::HostZeros(DType::kI32, {1}));
  flag.data<int32_t>()[0] = ok ? 0 : 1;
  NF_RETURN_IF_ERROR(world.AllReduce(flag, parallel::ReduceOp::kMax));
  return flag.data<int32_t>()[0] != 0;
}

// Merges the fragments into one record per (name, kind), in first-seen order, and checks that
// the pieces of each cover the tensor's elements exactly once over all shards.
absl::StatusOr<Manifest> Merge(const std::vector<std::string>& fragments) {
  Manifest merged;
  std::map<std::pair<std::string, int>, int> index;
  for (const std::string& bytes : fragments) {
    Manifest fragment;
    if (!fragment.ParseFromString(bytes)) {
      return absl::InternalError("a rank's checkpoint fragment does not parse");
    }
    for (const ShardFile& f : fragment.files()) *merged.add_files() = f;
    for (const TensorRecord& r : fragment.tensors()) {
      const auto key = std::make_pair(r.name(), static_cast<int>(r.kind()));
      auto [it, inserted] = index.emplace(key, merged.tensors_size());
      if (inserted) {
        TensorRecord* record = merged.add_tensors();
        *record = r;
        record->clear_pieces();
      }
      for (const Piece& p : r.pieces()) *merged.mutable_tensors(it->second)->add_pieces() = p;
    }
  }
  return merged;
}

// Removes the checkpoints the policy no longer keeps; one that cannot be removed is a warning.
// Only checkpoints count (CheckpointSteps): an empty iter_ directory with a later step must not
// push a real one out of the newest keep_last.
void ApplyRetention(const fs::path& checkpoints_dir, const RetentionPolicy& retention,
                    int64_t newest) {
  const std::vector<int64_t> steps = CheckpointSteps(checkpoints_dir);
  const size_t keep_last = static_cast<size_t>(std::max(retention.keep_last, 1));
  for (size_t i = 0; i + keep_last < steps.size(); ++i) {
    const int64_t step = steps[i];
    if (step == newest) continue;
    if (retention.keep_every > 0 && step % retention.keep_every == 0) continue;
    std::error_code error;
    fs::remove_all(checkpoints_dir / IterationDirName(step), error);
    if (error) {
      // The new checkpoint is committed: an old one left behind costs disk, not the run.
      parallel::WarnFromRank(absl::StrCat("cannot remove old checkpoint ",
                                          (checkpoints_dir / IterationDirName(step)).string(), ": ",
                                          error.message(), "; remove it by hand"));
    }
  }
}

absl::StatusOr<fs::path> PrepareStaging(const fs::path& checkpoints_dir, int64_t step,
                                        parallel::Communicator& world) {
  const fs::path staging = StagingDir(checkpoints_dir, step);
  absl::Status prepared;
  if (world.rank() == 0) {
    // Each step names the directory it failed on: a regular file where checkpoints/ should be
    // is not the staging directory's fault.
    std::error_code error;
    fs::create_directories(checkpoints_dir, error);
    if (error) {
      prepared = absl::UnavailableError(absl::StrCat(
          "cannot create checkpoint directory ", checkpoints_dir.string(), ": ", error.message()));
    }
    if (prepared.ok()) fs::remove_all(staging, error);
    if (prepared.ok() && !error) fs::create_directory(staging, error);
    if (prepared.ok() && error) {
      prepared = absl::UnavailableError(
          absl::StrCat("cannot prepare ", staging.string(), ": ", error.message()));
    }
  }
  NF_ASSIGN_OR_RETURN(const bool failed, AnyFailed(world, prepared.ok()));
  if (!failed) return staging;
  if (!prepared.ok()) return prepared;
  return absl::UnavailableError(absl::StrCat("checkpoint ", IterationDirName(step),
                                             " not saved: rank 0 could not create ",
                                             staging.string()));
}

// After a failed save (every rank's write has ended): rank 0 removes what was written, so that
// a full disk is not left fuller; the previous checkpoints and `latest` are untouched.
void RemoveStaging(const fs::path& staging, parallel::Communicator& world) {
  if (world.rank() != 0) return;
  std::error_code error;
  fs::remove_all(staging, error);
  if (error) {
    parallel::WarnFromRank(absl::StrCat("cannot remove ", staging.string(),
                                        " after a failed save: ", error.message(),
                                        "; remove it by hand"));
  }
}

absl::Status CommitCheckpoint(const fs::path& checkpoints_dir, const CommitInfo& info,
                              const absl::StatusOr<Manifest>& fragment,
                              parallel::Communicator& world) {
  const std::string name = IterationDirName(info.progress.step);
  const fs::path staging = StagingDir(checkpoints_dir, info.progress.step);
  NF_ASSIGN_OR_RETURN(const bool write_failed, AnyFailed(world, fragment.ok()));
  if (write_failed) {
    RemoveStaging(staging, world);
    if (!fragment.ok()) return fragment.status();
    return absl::UnavailableError(absl::StrCat(
        "checkpoint ", name,
        " not saved: another rank could not write its shard (its own error says why); latest is "
        "unchanged"));
  }
  NF_ASSIGN_OR_RETURN(const std::vector<std::string> fragments,
                      AllGatherBytes(world, fragment->SerializeAsString()));
  absl::Status committed;
  if (world.rank() == 0) {
    committed = [&]() -> absl::Status {
      NF_ASSIGN_OR_RETURN(Manifest manifest, Merge(fragments));
      const RunProgress& progress = info.progress;
      manifest.set_format_version(kFormatVersion);
      manifest.set_step(progress.step);
      manifest.set_consumed_samples(progress.consumed_samples);
      manifest.set_data_stream_samples(progress.data_stream_samples);
      manifest.set_optimizer_updates(progress.optimizer_updates);
      manifest.set_skipped_total(progress.skipped_total);
      for (const SampleWindow& w : progress.skipped_samples) *manifest.add_skipped_samples() = w;
      manifest.set_rollbacks(progress.rollbacks);
      if (!progress.spike_losses.empty() || !progress.spike_grad_norms.empty()) {
        SpikeHistory* history = manifest.mutable_spike_history();
        for (double v : progress.spike_losses) history->add_loss(v);
        for (double v : progress.spike_grad_norms) history->add_grad_norm(v);
      }
      if (progress.loss_scaler) {
        LossScalerState* s = manifest.mutable_loss_scaler();
        s->set_scale(progress.loss_scaler->scale);
        s->set_growth_tracker(progress.loss_scaler->growth_tracker);
        s->set_hysteresis_tracker(progress.loss_scaler->hysteresis_tracker);
        s->set_skipped_steps(progress.loss_scaler->skipped_steps);
      }
      *manifest.mutable_model() = info.model;
      manifest.set_train_config(info.train_config);
      *manifest.mutable_layout() = info.layout;
      NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(staging / kManifestName));
      const std::string bytes = EncodeManifest(manifest);
      NF_RETURN_IF_ERROR(writer.Append(bytes.data(), static_cast<int64_t>(bytes.size())));
      NF_RETURN_IF_ERROR(writer.Close());
      NF_RETURN_IF_ERROR(SyncDirectory(staging));
      const fs::path final_dir = checkpoints_dir / name;
      std::error_code error;
      fs::remove_all(final_dir, error);  // a checkpoint of the same step, saved again
      fs::rename(staging, final_dir, error);
      if (error) {
        return absl::UnavailableError(absl::StrCat("cannot rename ", staging.string(), " to ",
                                                   final_dir.string(), ": ", error.message()));
      }
      NF_RETURN_IF_ERROR(SyncDirectory(checkpoints_dir));
      NF_RETURN_IF_ERROR(ReplaceFileAtomically(checkpoints_dir / kLatestName, name + "\n"));
      ApplyRetention(checkpoints_dir, info.retention, progress.step);
      return absl::OkStatus();
    }();
  }
  NF_ASSIGN_OR_RETURN(const bool commit_failed, AnyFailed(world, committed.ok()));
  if (commit_failed) RemoveStaging(staging, world);
  if (commit_failed && committed.ok()) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint ", name, " not committed: rank 0 failed (its error says why)"));
  }
  return committed;
}

CommitInfo CommitInfoOf(const RankState& state, const RunProgress& progress,
                        const RetentionPolicy& retention) {
  return {.progress = progress,
          .model = state.model,
          .train_config = state.train_config,
          .layout = state.layout,
          .retention = retention};
}

}  // namespace

absl::Status SaveCheckpoint(const fs::path& checkpoints_dir, const RankState& state,
                            const RunProgress& progress, parallel::Communicator& world,
                            const RetentionPolicy& retention) {
  NF_ASSIGN_OR_RETURN(const fs::path staging,
                      PrepareStaging(checkpoints_dir, progress.step, world));
  absl::StatusOr<Manifest> fragment = [&]() -> absl::StatusOr<Manifest> {
    // Nothing changes the state during a synchronous save: the pieces are written from it.
    NF_ASSIGN_OR_RETURN(ShardSnapshot shard, PlanShard(state));
    return WriteSnapshot(staging, shard, state.topology.world_rank());
  }();
  return CommitCheckpoint(checkpoints_dir, CommitInfoOf(state, progress, retention), fragment,
                          world);
}

AsyncCheckpointer::AsyncCheckpointer(fs::path checkpoints_dir, RetentionPolicy retention,
                                     std::function<void(const fs::path&)> on_commit)
    : dir_(std::move(checkpoints_dir)),
      retention_(retention),
      on_commit_(std::move(on_commit)),
      spare_(std::make_unique<ShardSnapshot>()) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!pending_) return;
  pending_->write.wait();  // the thread must not outlive its buffers
  // Nothing of a discarded save stays: a later run's first save would remove the staging
  // directory anyway, but a user looking at checkpoints/ meanwhile should not find it.
  const fs::path staging = StagingDir(dir_, pending_->info.progress.step);
  std::error_code ignored;
  fs::remove(staging / ShardFileName(pending_->world_rank), ignored);
  if (pending_->world_rank == 0) fs::remove_all(staging, ignored);
}

void AsyncCheckpointer::Reserve(const RankState& state) {
  absl::StatusOr<ShardSnapshot> shard = PlanShard(state);
  if (!shard.ok()) return;  // the first Start reports it
  const int64_t bytes = std::max<int64_t>(CopyLayoutOf(*shard).size, 1);
  reserved_ = std::async(std::launch::async, [bytes] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);  // below the training threads
    auto spare = std::make_unique<ShardSnapshot>();
    spare->copy = MappedBuffer(bytes);
    spare->copy_capacity = bytes;
    return spare;
  });
}

absl::Status AsyncCheckpointer::Start(const RankState& state, const RunProgress& progress,
                                      parallel::Communicator& world) {
  if (pending_ && pending_->write.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    parallel::WarnFromRank(
        absl::StrCat("the checkpoint of step ", pending_->info.progress.step,
                     " is still being written when step ", progress.step,
                     "'s is due; training waits for it (a slow file system? raise "
                     "checkpoint.save_interval)"));
  }
  NF_RETURN_IF_ERROR(Finish(world));
  if (reserved_.valid()) {
    std::unique_ptr<ShardSnapshot> reserved = reserved_.get();
    if (reserved->copy_capacity > spare_->copy_capacity) spare_ = std::move(reserved);
  }
  NF_ASSIGN_OR_RETURN(const fs::path staging, PrepareStaging(dir_, progress.step, world));
  auto shard = std::make_shared<absl::StatusOr<ShardSnapshot>>(PlanShard(state));
  // The snapshot copy runs on the writer thread, beside the next step's forward and backward
  // (which only read the state); each chunk's next Update, the only writer of what is saved,
  // waits for it. `copied` is fulfilled however the copy ends, or that Update would wait forever.
  auto copied = std::make_shared<std::promise<void>>();
  const std::shared_future<void> copy_done = copied->get_future().share();
  for (const ChunkState& chunk : state.chunks) {
    if (chunk.optimizer != nullptr) chunk.optimizer->AddStateReader(copy_done);
  }
  auto pending = std::make_unique<Pending>();
  pending->info = CommitInfoOf(state, progress, retention_);
  pending->snapshot = shard;
  const int world_rank = state.topology.world_rank();
  pending->world_rank = world_rank;
  ShardSnapshot* spare = spare_.get();  // untouched by this thread until Commit
  pending->write =
      std::async(std::launch::async,
                 [staging, world_rank, shard, spare, copied]() -> absl::StatusOr<Manifest> {
                   // Below the training threads: the copy and the write fill the cores'
                   // idle moments instead of taking a core from the step.
                   setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
                   {
                     struct Fulfil {
                       std::promise<void>& promise;
                       ~Fulfil() { promise.set_value(); }
                     } fulfil{*copied};
                     if (!shard->ok()) return shard->status();
                     CopyPieces(**shard, *spare);
                   }
                   return WriteSnapshot(staging, **shard, world_rank);
                 });
  pending_ = std::move(pending);
  return absl::OkStatus();
}

absl::Status AsyncCheckpointer::Poll(parallel::Communicator& world) {
  if (!pending_) return absl::OkStatus();
  const bool written =
      pending_->write.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  // Committing is collective: only once every rank's write has finished.
  NF_ASSIGN_OR_RETURN(const bool some_writing, AnyFailed(world, written));
  if (some_writing) return absl::OkStatus();
  return Commit(world);
}

absl::Status AsyncCheckpointer::Finish(parallel::Communicator& world) {
  if (!pending_) return absl::OkStatus();
  pending_->write.wait();
  return Commit(world);
}

absl::Status AsyncCheckpointer::Commit(parallel::Communicator& world) {
  std::unique_ptr<Pending> pending = std::move(pending_);
  const absl::StatusOr<Manifest> fragment = pending->write.get();
  if (pending->snapshot->ok()) *spare_ = std::move(**pending->snapshot);  // for the next save
  NF_RETURN_IF_ERROR(CommitCheckpoint(dir_, pending->info, fragment, world));
  if (on_commit_) on_commit_(dir_ / IterationDirName(pending->info.progress.step));
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
