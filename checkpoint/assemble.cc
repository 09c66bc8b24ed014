#include "checkpoint/assemble.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/shard_mapping.h"
#include "core/files/durable_files.h"
#include "core/non_finite.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

absl::Status Corrupt(const fs::path& dir, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", what));
}

std::string ShapeText(const Shape& shape) { return ShapeToString(shape); }

}  // namespace

absl::StatusOr<CheckedRecord> CheckRecord(const fs::path& dir, const Manifest& manifest,
                                          const TensorRecord& record) {
  CheckedRecord checked;
  checked.what = absl::StrCat(record.name(), " (", TensorRecord::Kind_Name(record.kind()), ")");
  const std::string& what = checked.what;
  absl::StatusOr<DType> dtype = ParseDType(record.dtype());
  if (!dtype.ok())
    return Corrupt(dir, absl::StrCat(what, " has unknown dtype '", record.dtype(), "'"));
  checked.dtype = *dtype;
  Shape& shape = checked.shape;
  shape.assign(record.global_shape().begin(), record.global_shape().end());
  if (shape.empty() || shape.size() > 2 ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 1; })) {
    return Corrupt(dir, absl::StrCat(what, " has an invalid global shape ", ShapeText(shape)));
  }
  const int64_t numel = NumElements(shape);
  const int64_t element = static_cast<int64_t>(SizeOf(*dtype));
  std::vector<std::pair<int64_t, int64_t>> runs;  // (global index, count) covered
  std::map<std::string, int64_t> file_sizes;
  for (const ShardFile& f : manifest.files()) file_sizes[f.name()] = f.size();
  for (const Piece& p : record.pieces()) {
    const ShardPlace place{.sharding = ShardingFromProto(p.sharding()),
                           .tp_rank = p.tp_rank(),
                           .tp_size = p.tp_size()};
    const auto size = file_sizes.find(p.file());
    const bool split = place.sharding != model::Sharding::kReplicated;
    const int64_t split_dim = place.sharding == model::Sharding::kSplitCols ? 1 : 0;
    if (size == file_sizes.end() || p.tp_size() < 1 || p.tp_rank() < 0 ||
        p.tp_rank() >= p.tp_size() ||
        (split && (static_cast<int64_t>(shape.size()) <= split_dim ||
                   shape[split_dim] % p.tp_size() != 0))) {
      return Corrupt(dir, absl::StrCat(what, ": a piece names an unknown file '", p.file(),
                                       "' or an impossible shard"));
    }
    const int64_t local_numel = NumElements(LocalShape(shape, place));
    if (p.begin() < 0 || p.begin() > p.end() || p.end() > local_numel ||
        p.length() != (p.end() - p.begin()) * element || p.offset() < 0 ||
        p.offset() + p.length() > size->second) {
      return Corrupt(dir, absl::StrCat(what, ": a piece in ", p.file(),
                                       " lies outside its shard or its file"));
    }
    ForEachGlobalRun(shape, place, p.begin(), p.end(),
                     [&](int64_t, int64_t global_index, int64_t count) {
                       runs.emplace_back(global_index, count);
                     });
    checked.places.push_back(place);
  }
  // Exactly once: sorted by start, the runs must neither overlap nor leave gaps.
  std::sort(runs.begin(), runs.end());
  int64_t next = 0;
  for (const auto& [start, count] : runs) {
    if (start < next) return Corrupt(dir, absl::StrCat(what, ": pieces overlap"));
    if (start > next) break;
    next = start + count;
  }
  if (next != numel) {
    return Corrupt(dir, absl::StrCat(what, " is incomplete: elements from ", next, " of ", numel,
                                     " are in no piece"));
  }
  return checked;
}

absl::StatusOr<AssembledTensor> AssembleTensor(const fs::path& dir, const Manifest& manifest,
                                               const TensorRecord& record) {
  NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(dir, manifest, record));
  AssembledTensor a;
  a.shape = checked.shape;
  const int64_t numel = NumElements(a.shape);
  // Uninitialised: CheckRecord proved every element covered by a piece.
  NF_ASSIGN_OR_RETURN(a.global, Tensor::HostEmpty(checked.dtype, {numel}));
  // The whole tensor is the one shard of a replicated place: each piece read in blocks that
  // are checked and scattered while in the cache (piece_reader.h), not read whole and then
  // gone over three times (in a VM whose memory copies are slow that was most of an export).
  ShardReader reader(dir);
  NF_RETURN_IF_ERROR(ReadLocalRanges(
      reader, record, checked, a.shape, ShardPlace{},
      {{.begin = 0, .end = numel, .out = static_cast<char*>(a.global.raw_data())}}));
  return a;
}

bool IsVocabularyTable(const std::string& name) {
  return name == "decoder.embed_tokens.weight" || name == "decoder.output_projection.weight" ||
         name == "decoder.lm_head.bias";
}

absl::Status CheckShapeFits(const fs::path& dir, const Shape& shape, const model::ParamSpec& spec) {
  const Shape& want = spec.global_shape;
  // Only the row count may differ: [rows, d] tables, or the [rows] bias.
  const bool rows_only = want.size() == shape.size() && !want.empty() &&
                         std::equal(want.begin() + 1, want.end(), shape.begin() + 1);
  if (want != shape && !(IsVocabularyTable(spec.name) && rows_only)) {
    return Corrupt(dir, absl::StrCat(spec.name, " has global shape ", ShapeText(shape),
                                     "; the model needs ", ShapeText(want)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CutShard(const fs::path& dir, const AssembledTensor& a,
                                const model::ParamSpec& spec, int64_t local_numel, int tp_rank,
                                int tp_size) {
  NF_RETURN_IF_ERROR(CheckShapeFits(dir, a.shape, spec));
  const Shape& want = spec.global_shape;
  const int64_t element = static_cast<int64_t>(SizeOf(a.global.dtype()));
  const ShardPlace place{.sharding = spec.sharding,
                         .tp_rank = spec.sharding == model::Sharding::kReplicated ? 0 : tp_rank,
                         .tp_size = spec.sharding == model::Sharding::kReplicated ? 1 : tp_size};
  if (want == a.shape && (place.tp_size == 1)) return a.global;  // the shard is the whole tensor
  const int64_t available = NumElements(a.shape);
  NF_ASSIGN_OR_RETURN(Tensor local, Tensor::HostZeros(a.global.dtype(), {local_numel}));
  const char* from = static_cast<const char*>(a.global.raw_data());
  char* to = static_cast<char*>(local.raw_data());
  ForEachGlobalRun(
      want, place, 0, local_numel, [&](int64_t local_index, int64_t global_index, int64_t count) {
        // Global indices of `want` and of the checkpoint agree while rows exist in
        // both (equal column counts); the rest stays zero.
        const int64_t n = std::clamp<int64_t>(available - global_index, 0, count);
        std::memcpy(to + local_index * element, from + global_index * element, n * element);
      });
  return local;
}

}  // namespace nf::checkpoint
