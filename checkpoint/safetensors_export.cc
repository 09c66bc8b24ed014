#include "checkpoint/safetensors_export.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/assemble.h"
#include "checkpoint/durable_files.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::string("F32");
    case DType::kF16:
      return std::string("F16");
    case DType::kBF16:
      return std::string("BF16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors export takes f32, f16 or bf16, not ", DTypeName(dtype)));
  }
}

// JSON string contents: names and metadata are ASCII identifiers, but escape what JSON needs.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  return out;
}

struct Exported {
  std::string name;
  Shape shape;
  Tensor data;  // [numel] in the export dtype
};

}  // namespace

absl::Status ExportSafetensors(const fs::path& dir, const Manifest& manifest, const fs::path& out,
                               std::optional<DType> dtype) {
  std::vector<Exported> tensors;
  for (const TensorRecord& record : manifest.tensors()) {
    if (record.kind() != TensorRecord::PARAM) continue;
    NF_ASSIGN_OR_RETURN(AssembledTensor a, AssembleTensor(dir, manifest, record));
    Exported e{.name = record.name(), .shape = a.shape, .data = a.global};
    if (IsVocabularyTable(e.name) && e.shape[0] > manifest.model().vocab_size()) {
      e.shape[0] = manifest.model().vocab_size();  // drop the layout's padding rows
      NF_ASSIGN_OR_RETURN(e.data, a.global.Slice(0, NumElements(e.shape)));
    }
    const DType target = dtype.value_or(e.data.dtype());
    if (target != e.data.dtype()) {
      NF_ASSIGN_OR_RETURN(Tensor converted, Tensor::HostZeros(target, {e.data.numel()}));
      NF_RETURN_IF_ERROR(ops::Cast(e.data, converted));
      e.data = converted;
    }
    tensors.push_back(std::move(e));
  }
  std::vector<std::string> entries = {
      absl::StrCat("\"__metadata__\":{\"format\":\"pt\",\"producer\":\"normformer\",\"step\":\"",
                   manifest.step(), "\"}")};
  int64_t offset = 0;
  for (const Exported& e : tensors) {
    NF_ASSIGN_OR_RETURN(const std::string type, SafetensorsDType(e.data.dtype()));
    const int64_t bytes = static_cast<int64_t>(e.data.nbytes());
    entries.push_back(absl::StrCat("\"", JsonEscape(e.name), "\":{\"dtype\":\"", type,
                                   "\",\"shape\":[", absl::StrJoin(e.shape, ","),
                                   "],\"data_offsets\":[", offset, ",", offset + bytes, "]}"));
    offset += bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t header_size = header.size();
  char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((header_size >> (8 * i)) & 0xFF);

  const fs::path temporary = out.string() + ".tmp";
  const absl::Status written = [&]() -> absl::Status {
    NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(temporary));
    NF_RETURN_IF_ERROR(writer.Append(prefix, 8));
    NF_RETURN_IF_ERROR(writer.Append(header.data(), static_cast<int64_t>(header.size())));
    for (const Exported& e : tensors) {
      NF_RETURN_IF_ERROR(writer.Append(e.data.raw_data(), static_cast<int64_t>(e.data.nbytes())));
    }
    NF_RETURN_IF_ERROR(writer.Close());
    std::error_code error;
    fs::rename(temporary, out, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("cannot rename ", temporary.string(), " to ",
                                                 out.string(), ": ", error.message()));
    }
    return absl::OkStatus();
  }();
  if (!written.ok()) {
    // A full disk must not be made fuller by what failed to fit.
    std::error_code ignored;
    fs::remove(temporary, ignored);
  }
  return written;
}

}  // namespace nf::checkpoint
