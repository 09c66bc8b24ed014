#include "checkpoint/load.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/assemble.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/save.h"
#include "checkpoint/shard_mapping.h"
#include "core/files/durable_files.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

absl::Status Corrupt(const fs::path& dir, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", what));
}

// Every field of two messages of the same type that differs, as "prefix.field: a vs b".
void DiffFields(const pb::Message& a, const pb::Message& b, const std::string& prefix,
                std::vector<std::string>& out) {
  const pb::Descriptor* d = a.GetDescriptor();
  const pb::Reflection* ra = a.GetReflection();
  const pb::Reflection* rb = b.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const std::string name = prefix + f->name();
    if (f->is_repeated()) continue;  // ModelConfig has none
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      DiffFields(ra->GetMessage(a, f), rb->GetMessage(b, f), name + ".", out);
      continue;
    }
    std::string va, vb;
    pb::TextFormat::PrintFieldValueToString(a, f, -1, &va);
    pb::TextFormat::PrintFieldValueToString(b, f, -1, &vb);
    if (va != vb) out.push_back(absl::StrCat(name, " (checkpoint ", va, ", run ", vb, ")"));
  }
}

// The optimizer state `kind` of entry `e` into `buffer` (flat f32, indexed by the optimizer's
// state offsets): only the slices this rank holds.
absl::Status ReadOptimizerState(ShardReader& reader, const Manifest& manifest,
                                const TensorRecord& record, const model::ParamTable::Entry& e,
                                const parallel::DataParallelOptimizer& optimizer, int tp_rank,
                                int tp_size, const Tensor& buffer) {
  NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(reader.dir(), manifest, record));
  NF_RETURN_IF_ERROR(CheckShapeFits(reader.dir(), checked.shape, e.spec));
  const ShardPlace place = PlaceOf(e.spec, tp_rank, tp_size);
  const int64_t numel = e.value.numel();
  // Straight into the buffer when it is host f32 like the record; else staged in the record's
  // dtype (the whole local shard, only the held slices filled), converted and copied.
  const bool direct = buffer.device().type == DeviceType::kCpu && checked.dtype == DType::kF32;
  Tensor staged;
  if (!direct) {
    NF_ASSIGN_OR_RETURN(staged, Tensor::HostEmpty(checked.dtype, {numel}));
  }
  const int64_t element = static_cast<int64_t>(SizeOf(checked.dtype));
  std::vector<LocalRange> ranges;
  NF_RETURN_IF_ERROR(optimizer.ForEachHeldPiece(
      e.offset, numel, [&](int64_t full_offset, int64_t state_offset, int64_t count) {
        const int64_t begin = full_offset - e.offset;
        char* out = direct ? static_cast<char*>(buffer.raw_data()) + state_offset * element
                           : static_cast<char*>(staged.raw_data()) + begin * element;
        ranges.push_back({begin, begin + count, out});
        return absl::OkStatus();
      }));
  NF_RETURN_IF_ERROR(ReadLocalRanges(reader, record, checked, e.spec.global_shape, place, ranges));
  if (direct) return absl::OkStatus();
  Tensor staged32 = staged;
  if (staged.dtype() != DType::kF32) {
    NF_ASSIGN_OR_RETURN(staged32, Tensor::HostEmpty(DType::kF32, {numel}));
    NF_RETURN_IF_ERROR(ops::Cast(staged, staged32));
  }
  return optimizer.ForEachHeldPiece(
      e.offset, numel,
      [&](int64_t full_offset, int64_t state_offset, int64_t count) -> absl::Status {
        NF_ASSIGN_OR_RETURN(const Tensor from, staged32.Slice(full_offset - e.offset, count));
        NF_ASSIGN_OR_RETURN(const Tensor to, buffer.Slice(state_offset, count));
        return ops::Copy(from, to);
      });
}

}  // namespace

absl::StatusOr<fs::path> LatestCheckpoint(const fs::path& checkpoints_dir) {
  const fs::path latest = checkpoints_dir / kLatestName;
  std::error_code error;
  if (!fs::exists(latest, error)) {
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read ", latest.string(), ": ", error.message()));
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", checkpoints_dir.string()));
  }
  NF_ASSIGN_OR_RETURN(std::string name, ReadWholeFile(latest));
  name = std::string(absl::StripAsciiWhitespace(name));
  int64_t step = 0;
  if (!ParseIterationDirName(name, step)) {
    return absl::DataLossError(
        absl::StrCat(latest.string(), " does not name a checkpoint ('", name.substr(0, 40), "')"));
  }
  return checkpoints_dir / name;
}

std::vector<int64_t> CheckpointSteps(const fs::path& checkpoints_dir) {
  std::vector<int64_t> steps = IterationDirSteps(checkpoints_dir);
  std::erase_if(steps, [&](int64_t step) {
    return !ReadManifest(checkpoints_dir / IterationDirName(step)).ok();
  });
  return steps;
}

absl::StatusOr<ResumePoint> FindResumePoint(const fs::path& checkpoints_dir) {
  // Every directory under a checkpoint's name, readable or not: one that fails is reported,
  // and never a reason to start afresh over it.
  const std::vector<int64_t> steps = IterationDirSteps(checkpoints_dir);
  const absl::StatusOr<fs::path> latest = LatestCheckpoint(checkpoints_dir);
  std::string latest_problem;
  if (latest.ok()) {
    absl::StatusOr<Manifest> manifest = ReadManifest(*latest);
    if (manifest.ok())
      return ResumePoint{.dir = *latest, .manifest = *std::move(manifest), .warning = ""};
    latest_problem =
        absl::StrCat((checkpoints_dir / kLatestName).string(), " names ",
                     latest->filename().string(), ", which fails: ", manifest.status().message());
  } else if (absl::IsNotFound(latest.status())) {
    if (steps.empty()) return latest.status();  // a fresh run
    latest_problem = absl::StrCat((checkpoints_dir / kLatestName).string(), " is missing");
  } else {
    latest_problem = std::string(latest.status().message());
  }
  // Newest first: the most recent state that checks out.
  std::vector<std::string> failures;
  for (auto step = steps.rbegin(); step != steps.rend(); ++step) {
    const fs::path dir = checkpoints_dir / IterationDirName(*step);
    if (latest.ok() && dir == *latest) continue;
    absl::StatusOr<Manifest> manifest = ReadManifest(dir);
    if (manifest.ok()) {
      return ResumePoint{.dir = dir,
                         .manifest = *std::move(manifest),
                         .warning = absl::StrCat(latest_problem, "; resuming from ", dir.string(),
                                                 ", the newest checkpoint that verifies")};
    }
    failures.push_back(std::string(manifest.status().message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      latest_problem, ", and no other checkpoint in ", checkpoints_dir.string(), " verifies",
      failures.empty() ? "" : absl::StrCat(" (", absl::StrJoin(failures, "; "), ")"),
      ": not starting afresh over them; move them away to start a new run"));
}

absl::StatusOr<Manifest> ReadManifest(const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  std::error_code error;
  if (!fs::exists(dir, error) && !error) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), " does not exist"));
  }
  if (!fs::exists(path, error)) {
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read ", path.string(), ": ", error.message()));
    }
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), " has no ", kManifestName,
                                            ": it is incomplete or not a checkpoint"));
  }
  NF_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  NF_ASSIGN_OR_RETURN(
      Manifest manifest,
      DecodeManifest(bytes, absl::StrCat("checkpoint ", dir.string(), ": ", kManifestName)));
  // A directory named for a step holds that step (a renamed or mixed-up directory would resume
  // at the wrong step); a copy under another name is taken at its manifest's word.
  const std::string name =
      dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  int64_t named_step = 0;
  if (ParseIterationDirName(name, named_step) && named_step != manifest.step()) {
    return Corrupt(dir, absl::StrCat("the manifest holds step ", manifest.step(),
                                     ", the directory is named for step ", named_step));
  }
  for (const ShardFile& f : manifest.files()) {
    const auto size = fs::file_size(dir / f.name(), error);
    if (error) {
      return Corrupt(dir, absl::StrCat("shard file ", f.name(), " is missing or unreadable (",
                                       error.message(), ")"));
    }
    if (static_cast<int64_t>(size) != f.size()) {
      return Corrupt(dir, absl::StrCat("shard file ", f.name(), " has ", size, " bytes, ", f.size(),
                                       " were written (truncated or replaced)"));
    }
  }
  return manifest;
}

absl::Status CheckSameModel(const fs::path& dir, const Manifest& manifest,
                            const model::ModelConfig& model) {
  std::vector<std::string> differences;
  DiffFields(manifest.model(), model, "model.", differences);
  if (differences.empty()) return absl::OkStatus();
  // Runs begun before model.first_position existed numbered positions from 0, which their old
  // configs no longer say (checkpoint/manifest_model.h).
  const std::string numbering =
      manifest.model().first_position() == model.first_position()
          ? ""
          : absl::StrCat(" (--set model.first_position=", manifest.model().first_position(),
                         " continues it with the position numbering it was trained with)");
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", dir.string(),
      " was written for another model: ", absl::StrJoin(differences, ", "), numbering));
}

absl::StatusOr<RunProgress> LoadCheckpoint(const fs::path& dir, const Manifest& manifest,
                                           const RankState& state, LoadStats* stats) {
  std::map<std::pair<std::string, int>, const TensorRecord*> records;
  for (const TensorRecord& r : manifest.tensors()) {
    records[{r.name(), static_cast<int>(r.kind())}] = &r;
  }
  const auto find = [&](const std::string& name,
                        TensorRecord::Kind kind) -> absl::StatusOr<const TensorRecord*> {
    const auto it = records.find({name, static_cast<int>(kind)});
    if (it == records.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir.string(), " has no ", name, " (", TensorRecord::Kind_Name(kind), ")"));
    }
    return it->second;
  };
  const parallel::Topology& t = state.topology;
  ShardReader reader(dir);
  for (const ChunkState& chunk : state.chunks) {
    optim::MixedPrecisionAdamW& adamw = chunk.optimizer->adamw();
    const auto states = OptimizerStateBuffers(adamw);
    for (const model::ParamTable::Entry& e : chunk.params->entries()) {
      NF_ASSIGN_OR_RETURN(const TensorRecord* param, find(e.spec.name, TensorRecord::PARAM));
      NF_ASSIGN_OR_RETURN(const Tensor target, e.value.Reshape({e.value.numel()}));
      NF_RETURN_IF_ERROR(
          ReadParameterShard(reader, manifest, *param, e.spec, t.tp_rank(), t.tp(), target));
      for (const auto& [kind, tensor] : states) {
        NF_ASSIGN_OR_RETURN(const TensorRecord* record, find(e.spec.name, kind));
        NF_RETURN_IF_ERROR(ReadOptimizerState(reader, manifest, *record, e, *chunk.optimizer,
                                              t.tp_rank(), t.tp(), *tensor));
      }
    }
  }
  if (stats != nullptr) stats->bytes_read = reader.bytes_read();
  RunProgress progress{
      .step = manifest.step(),
      .consumed_samples = manifest.consumed_samples(),
      .data_stream_samples = manifest.data_stream_samples(),
      .optimizer_updates = manifest.optimizer_updates(),
      .skipped_total = manifest.skipped_total(),
      .loss_scaler = std::nullopt,
      .skipped_samples = {manifest.skipped_samples().begin(), manifest.skipped_samples().end()},
      .rollbacks = manifest.rollbacks(),
      .spike_losses = {manifest.spike_history().loss().begin(),
                       manifest.spike_history().loss().end()},
      .spike_grad_norms = {manifest.spike_history().grad_norm().begin(),
                           manifest.spike_history().grad_norm().end()}};
  if (manifest.has_loss_scaler()) {
    const LossScalerState& s = manifest.loss_scaler();
    progress.loss_scaler = optim::LossScalerState{.scale = s.scale(),
                                                  .growth_tracker = s.growth_tracker(),
                                                  .hysteresis_tracker = s.hysteresis_tracker(),
                                                  .skipped_steps = s.skipped_steps()};
  }
  return progress;
}

}  // namespace nf::checkpoint
