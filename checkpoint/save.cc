#include "checkpoint/save.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/durable_files.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

Sharding ShardingOf(model::Sharding s) {
  switch (s) {
    case model::Sharding::kSplitRows:
      return SPLIT_ROWS;
    case model::Sharding::kSplitCols:
      return SPLIT_COLS;
    default:
      return REPLICATED;
  }
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Writes this rank's pieces into its shard file; returns the manifest fragment describing them.
class ShardWriter {
 public:
  ShardWriter(std::string file, DurableWriter writer)
      : file_(std::move(file)), writer_(std::move(writer)) {}

  absl::Status Add(const model::ParamTable::Entry& e, TensorRecord::Kind kind, DType dtype,
                   const void* data, int64_t begin, int64_t end, int tp_rank, int tp_size) {
    TensorRecord* record = fragment_.add_tensors();
    record->set_name(e.spec.name);
    record->set_kind(kind);
    for (int64_t dim : e.spec.global_shape) record->add_global_shape(dim);
    record->set_dtype(std::string(DTypeName(dtype)));
    Piece* piece = record->add_pieces();
    const int64_t length = (end - begin) * static_cast<int64_t>(SizeOf(dtype));
    const bool replicated = e.spec.sharding == model::Sharding::kReplicated;
    piece->set_file(file_);
    piece->set_offset(writer_.size());
    piece->set_length(length);
    piece->set_crc32c(Crc32c(data, static_cast<size_t>(length)));
    piece->set_sharding(ShardingOf(e.spec.sharding));
    piece->set_tp_rank(replicated ? 0 : tp_rank);
    piece->set_tp_size(replicated ? 1 : tp_size);
    piece->set_begin(begin);
    piece->set_end(end);
    return writer_.Append(data, length);
  }

  absl::StatusOr<Manifest> Finish(int world_rank) {
    NF_RETURN_IF_ERROR(writer_.Close());
    ShardFile* file = fragment_.add_files();
    file->set_name(file_);
    file->set_size(writer_.size());
    file->set_world_rank(world_rank);
    return std::move(fragment_);
  }

 private:
  std::string file_;
  DurableWriter writer_;
  Manifest fragment_;
};

// Parameters: dp rank 0 of every (tp, pp) cell. Optimizer state: every dp rank for its slices
// when sharded, else dp rank 0. Tensor-parallel duplicates: tp rank 0. Copies of another
// stage's parameters: never (the owner writes them).
absl::StatusOr<Manifest> WriteShard(const fs::path& dir, const RankState& state) {
  const parallel::Topology& t = state.topology;
  const std::string file = absl::StrFormat("rank_%05d.shard", t.world_rank());
  NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(dir / file));
  ShardWriter shard(file, std::move(writer));
  for (const ChunkState& chunk : state.chunks) {
    const parallel::DataParallelOptimizer& optimizer = *chunk.optimizer;
    optim::MixedPrecisionAdamW& adamw = chunk.optimizer->adamw();
    const std::pair<TensorRecord::Kind, const Tensor*> states[] = {
        {TensorRecord::MASTER, &adamw.master()},
        {TensorRecord::EXP_AVG, &adamw.exp_avg()},
        {TensorRecord::EXP_AVG_SQ, &adamw.exp_avg_sq()}};
    for (const model::ParamTable::Entry& e : chunk.params->entries()) {
      if (Contains(chunk.copies_of_other_stages, e.spec.name)) continue;
      if (e.spec.sharding == model::Sharding::kReplicated && t.tp_rank() != 0) continue;
      const int64_t numel = e.value.numel();
      if (t.dp_rank() == 0) {
        NF_RETURN_IF_ERROR(shard.Add(e, TensorRecord::PARAM, e.value.dtype(), e.value.raw_data(),
                                     0, numel, t.tp_rank(), t.tp()));
      }
      if (!optimizer.sharded() && t.dp_rank() != 0) continue;
      NF_RETURN_IF_ERROR(optimizer.ForEachHeldPiece(
          e.offset, numel,
          [&](int64_t full_offset, int64_t state_offset, int64_t count) -> absl::Status {
            const int64_t begin = full_offset - e.offset;
            for (const auto& [kind, tensor] : states) {
              const char* data =
                  static_cast<const char*>(tensor->raw_data()) + state_offset * sizeof(float);
              NF_RETURN_IF_ERROR(shard.Add(e, kind, DType::kF32, data, begin, begin + count,
                                           t.tp_rank(), t.tp()));
            }
            return absl::OkStatus();
          }));
    }
  }
  return shard.Finish(t.world_rank());
}

// Every rank's bytes, in rank order (all-gathers the lengths, then the padded bytes).
absl::StatusOr<std::vector<std::string>> AllGatherBytes(parallel::Communicator& world,
                                                        const std::string& mine) {
  const int n = world.size();
  NF_ASSIGN_OR_RETURN(const Tensor length, Tensor::Zeros(DType::kI64, {1}));
  NF_ASSIGN_OR_RETURN(const Tensor lengths, Tensor::Zeros(DType::kI64, {n}));
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  NF_RETURN_IF_ERROR(world.AllGather(length, lengths));
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data<int64_t>()[r]);
  NF_ASSIGN_OR_RETURN(const Tensor bytes, Tensor::Zeros(DType::kU8, {longest}));
  NF_ASSIGN_OR_RETURN(const Tensor all, Tensor::Zeros(DType::kU8, {longest * n}));
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
  NF_ASSIGN_OR_RETURN(const Tensor flag, Tensor::Zeros(DType::kI32, {1}));
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

// The steps of the complete checkpoints in `checkpoints_dir` (iter_NNNNNNN directories).
std::vector<int64_t> CheckpointSteps(const fs::path& checkpoints_dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(checkpoints_dir, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (entry.is_directory() && name.size() == 12 && name.rfind("iter_", 0) == 0 &&
        absl::SimpleAtoi(name.substr(5), &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status ApplyRetention(const fs::path& checkpoints_dir, const RetentionPolicy& retention,
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
      return absl::UnavailableError(absl::StrCat("cannot remove old checkpoint ",
                                                 IterationDirName(step), ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string IterationDirName(int64_t step) { return absl::StrFormat("iter_%07d", step); }

absl::Status SaveCheckpoint(const fs::path& checkpoints_dir, const RankState& state,
                            const RunProgress& progress, parallel::Communicator& world,
                            const RetentionPolicy& retention) {
  const std::string name = IterationDirName(progress.step);
  const fs::path staging = checkpoints_dir / (name + ".tmp");
  absl::Status prepared;
  if (world.rank() == 0) {
    std::error_code error;
    fs::create_directories(checkpoints_dir, error);
    if (!error) fs::remove_all(staging, error);
    if (!error) fs::create_directory(staging, error);
    if (error) {
      prepared = absl::UnavailableError(
          absl::StrCat("cannot prepare ", staging.string(), ": ", error.message()));
    }
  }
  NF_ASSIGN_OR_RETURN(const bool not_prepared, AnyFailed(world, prepared.ok()));
  if (not_prepared) {
    return prepared.ok() ? absl::UnavailableError(absl::StrCat(
                               "checkpoint ", name, " not saved: rank 0 could not create ",
                               staging.string()))
                         : prepared;
  }

  absl::StatusOr<Manifest> fragment = WriteShard(staging, state);
  NF_ASSIGN_OR_RETURN(const bool write_failed, AnyFailed(world, fragment.ok()));
  if (write_failed) {
    return fragment.ok() ? absl::UnavailableError(absl::StrCat(
                               "checkpoint ", name, " not saved: another rank could not write "
                               "its shard (its own error says why); latest is unchanged"))
                         : fragment.status();
  }
  NF_ASSIGN_OR_RETURN(const std::vector<std::string> fragments,
                      AllGatherBytes(world, fragment->SerializeAsString()));

  absl::Status committed;
  if (world.rank() == 0) {
    committed = [&]() -> absl::Status {
      NF_ASSIGN_OR_RETURN(Manifest manifest, Merge(fragments));
      manifest.set_format_version(kFormatVersion);
      manifest.set_step(progress.step);
      manifest.set_consumed_samples(progress.consumed_samples);
      manifest.set_optimizer_updates(progress.optimizer_updates);
      manifest.set_skipped_total(progress.skipped_total);
      if (progress.loss_scaler) {
        LossScalerState* s = manifest.mutable_loss_scaler();
        s->set_scale(progress.loss_scaler->scale);
        s->set_growth_tracker(progress.loss_scaler->growth_tracker);
        s->set_hysteresis_tracker(progress.loss_scaler->hysteresis_tracker);
        s->set_skipped_steps(progress.loss_scaler->skipped_steps);
      }
      *manifest.mutable_model() = state.model;
      manifest.set_train_config(state.train_config);
      *manifest.mutable_layout() = state.layout;
      NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(staging / kManifestName));
      const std::string bytes = manifest.SerializeAsString();
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
      return ApplyRetention(checkpoints_dir, retention, progress.step);
    }();
  }
  NF_ASSIGN_OR_RETURN(const bool commit_failed, AnyFailed(world, committed.ok()));
  if (commit_failed && committed.ok()) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint ", name, " not committed: rank 0 failed (its error says why)"));
  }
  return committed;
}

}  // namespace nf::checkpoint
