#include "checkpoint/manifest_file.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/manifest_model.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/model_config_check.h"
#include "model/normformer_params.h"
#include "model/vocab.h"

namespace nf::checkpoint {
namespace {

constexpr char kMagic[8] = {'N', 'F', 'M', 'A', 'N', 'I', 'F', '\x02'};
constexpr size_t kHeaderBytes = 20;  // magic, length, checksum

void PutLittleEndian(uint64_t value, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

absl::Status Corrupt(absl::string_view where, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(where, ": ", what));
}

// The dtypes a checkpoint holds, by the spelling save.cc writes (DTypeName).
bool IsCheckpointDType(const std::string& name, int64_t& element_bytes) {
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == DTypeName(dtype)) {
      element_bytes = static_cast<int64_t>(SizeOf(dtype));
      return true;
    }
  }
  return false;
}

// Elements of a tensor-parallel shard of `shape`: the whole tensor when replicated.
bool ShardElements(const TensorRecord& record, const Piece& piece, int64_t& elements) {
  int64_t numel = 1;
  for (const int64_t dim : record.global_shape()) {
    if (dim < 1 || __builtin_mul_overflow(numel, dim, &numel)) return false;
  }
  if (piece.tp_size() < 1 || piece.tp_rank() < 0 || piece.tp_rank() >= piece.tp_size()) {
    return false;
  }
  if (piece.sharding() == REPLICATED) {
    elements = numel;
    return piece.tp_size() == 1;
  }
  const int split_dim = piece.sharding() == SPLIT_COLS ? 1 : 0;
  if (record.global_shape_size() <= split_dim ||
      record.global_shape(split_dim) % piece.tp_size() != 0) {
    return false;
  }
  elements = numel / piece.tp_size();
  return true;
}

}  // namespace

std::string EncodeManifest(const Manifest& manifest) {
  Manifest recorded = manifest;
  if (recorded.has_model()) RecordModelFieldsExplicitly(*recorded.mutable_model());
  return FrameManifestPayload(recorded.SerializeAsString());
}

std::string FrameManifestPayload(absl::string_view payload) {
  std::string out(kMagic, sizeof(kMagic));
  PutLittleEndian(payload.size(), 8, out);
  PutLittleEndian(Crc32c(payload.data(), payload.size()), 4, out);
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes, absl::string_view where) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 7) != 0) {
    // Format 1 was the bare message: say so rather than call an older build's file corrupt.
    Manifest first;
    if (first.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) &&
        first.format_version() == 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          where,
          ": manifest format 1, written by an older build without a manifest checksum; "
          "this build reads format ",
          kFormatVersion, " (resume or export it with that build)"));
    }
    return Corrupt(where, "not a normformer manifest (bad magic: the file is corrupt)");
  }
  if (bytes[7] != kMagic[7]) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": manifest format ", static_cast<int>(bytes[7]),
                     "; this build reads format ", kFormatVersion));
  }
  const uint64_t length = GetLittleEndian(bytes.data() + 8, 8);
  if (length != bytes.size() - kHeaderBytes) {
    return Corrupt(where,
                   absl::StrCat("the header says ", length, " bytes of manifest, the file has ",
                                bytes.size() - kHeaderBytes, " (truncated or corrupt)"));
  }
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  if (Crc32c(payload.data(), payload.size()) != GetLittleEndian(bytes.data() + 16, 4)) {
    return Corrupt(where, "fails its checksum (the file is corrupt)");
  }
  Manifest manifest;
  if (!manifest.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Corrupt(where, "does not parse although its checksum matches (written by a bad build?)");
  }
  if (manifest.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": format version ", manifest.format_version(),
                     "; this build reads version ", kFormatVersion));
  }
  if (absl::Status valid = ValidateManifest(manifest, where); !valid.ok()) return valid;
  if (manifest.has_model()) {
    ReadUnrecordedModelFieldsAsLegacy(*manifest.mutable_model());
    // The same validation as a run's config: a model that cannot be built (max_seq_len 0, a
    // dropout of 5) is refused here, for every reader, not met as a crash in one of them.
    if (absl::Status model = model::ValidateModelConfig(manifest.model()); !model.ok()) {
      return Corrupt(where, absl::StrCat("its model config is invalid: ", model.message()));
    }
    NF_RETURN_IF_ERROR(CheckTensorsFollowModel(manifest, where));
  }
  return manifest;
}

absl::Status CheckTensorsFollowModel(const Manifest& manifest, absl::string_view where) {
  const model::ModelConfig& model = manifest.model();
  const int tp = std::max(1, manifest.layout().tensor_parallel());
  std::map<std::string, Shape> shapes;
  for (model::ParamSpec& spec :
       model::NormFormerParamSpecs(model, model::PaddedVocabSize(model.vocab_size(), tp))) {
    shapes.emplace(std::move(spec.name), std::move(spec.global_shape));
  }
  for (const TensorRecord& record : manifest.tensors()) {
    const auto spec = shapes.find(record.name());
    const Shape recorded(record.global_shape().begin(), record.global_shape().end());
    if (spec == shapes.end() || spec->second != recorded) {
      return Corrupt(
          where,
          absl::StrCat("tensor ", record.name(), " [", absl::StrJoin(recorded, ", "), "] is not ",
                       spec == shapes.end()
                           ? "a parameter of its model config"
                           : absl::StrCat("the [", absl::StrJoin(spec->second, ", "),
                                          "] its model config gives (model.vocab_size ",
                                          model.vocab_size(), ", model.d_model ", model.d_model(),
                                          ", tensor_parallel ", tp, ")"),
                       ": the config and the tensors disagree"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateManifest(const Manifest& manifest, absl::string_view where) {
  if (manifest.step() < 0 || manifest.consumed_samples() < 0 ||
      manifest.data_stream_samples() < 0 || manifest.optimizer_updates() < 0 ||
      manifest.skipped_total() < 0 || manifest.rollbacks() < 0) {
    return Corrupt(where, "a progress counter is negative");
  }
  for (const SampleWindow& w : manifest.skipped_samples()) {
    if (w.begin() < 0 || w.begin() >= w.end()) {
      return Corrupt(where, absl::StrCat("lists a skipped sample window [", w.begin(), ", ",
                                         w.end(), ") that is empty or negative"));
    }
  }
  std::map<std::string, int64_t> file_sizes;
  for (const ShardFile& f : manifest.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos || f.name()[0] == '.' ||
        f.size() < 0) {
      return Corrupt(where, absl::StrCat("lists an invalid shard file '", f.name(), "'"));
    }
    if (!file_sizes.emplace(f.name(), f.size()).second) {
      return Corrupt(where, absl::StrCat("lists shard file ", f.name(), " twice"));
    }
  }
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> extents;  // file: (offset, end)
  for (const TensorRecord& record : manifest.tensors()) {
    const std::string what =
        absl::StrCat(record.name(), " (", TensorRecord::Kind_Name(record.kind()), ")");
    int64_t element_bytes = 0;
    if (record.name().empty() || !TensorRecord::Kind_IsValid(record.kind()) ||
        !IsCheckpointDType(record.dtype(), element_bytes) || record.global_shape_size() < 1 ||
        record.global_shape_size() > 2) {
      return Corrupt(where, absl::StrCat("tensor record ", what, " has an unknown kind, dtype '",
                                         record.dtype(), "' or an invalid shape"));
    }
    for (const Piece& piece : record.pieces()) {
      int64_t elements = 0, bytes = 0, end = 0;
      const auto file = file_sizes.find(piece.file());
      if (file == file_sizes.end() || !Sharding_IsValid(piece.sharding()) ||
          !ShardElements(record, piece, elements) || piece.begin() < 0 ||
          piece.begin() > piece.end() || piece.end() > elements ||
          __builtin_mul_overflow(piece.end() - piece.begin(), element_bytes, &bytes) ||
          piece.length() != bytes || piece.offset() < 0 ||
          __builtin_add_overflow(piece.offset(), piece.length(), &end) || end > file->second) {
        return Corrupt(where, absl::StrCat("a piece of ", what, " in '", piece.file(),
                                           "' lies outside its shard or its file"));
      }
      if (piece.length() > 0) extents[piece.file()].emplace_back(piece.offset(), end);
    }
  }
  for (const auto& [name, size] : file_sizes) {
    std::vector<std::pair<int64_t, int64_t>>& pieces = extents[name];
    std::sort(pieces.begin(), pieces.end());
    int64_t covered = 0;
    for (const auto& [offset, end] : pieces) {
      if (offset != covered) {
        return Corrupt(where, absl::StrCat("the pieces of ", name,
                                           offset < covered ? " overlap" : " leave a gap",
                                           " at byte ", std::min(offset, covered)));
      }
      covered = end;
    }
    if (covered != size) {
      return Corrupt(where, absl::StrCat("the pieces of ", name, " cover ", covered, " of its ",
                                         size, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
