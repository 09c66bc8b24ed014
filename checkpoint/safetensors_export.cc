#include "checkpoint/safetensors_export.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/assemble.h"
#include "checkpoint/output_path.h"
#include "checkpoint/read_ahead.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {

namespace fs = std::filesystem;

Shape ExportedShape(const Manifest& manifest, const TensorRecord& record) {
  Shape shape(record.global_shape().begin(), record.global_shape().end());
  if (IsVocabularyTable(record.name()) && !shape.empty() &&
      shape[0] > manifest.model().vocab_size()) {
    shape[0] = manifest.model().vocab_size();  // drop the layout's padding rows
  }
  return shape;
}

absl::StatusOr<NamedTensor> ExportedParam(const fs::path& dir, const Manifest& manifest,
                                          const TensorRecord& record) {
  NF_ASSIGN_OR_RETURN(AssembledTensor a, AssembleTensor(dir, manifest, record));
  NamedTensor t{.name = record.name(), .shape = ExportedShape(manifest, record), .data = a.global};
  if (NumElements(t.shape) < a.global.numel()) {
    NF_ASSIGN_OR_RETURN(t.data, a.global.Slice(0, NumElements(t.shape)));
  }
  return t;
}

absl::Status ConvertForExport(NamedTensor& tensor, std::optional<DType> dtype) {
  if (!dtype || *dtype == tensor.data.dtype()) return absl::OkStatus();
  NF_ASSIGN_OR_RETURN(Tensor converted, Tensor::HostZeros(*dtype, {tensor.data.numel()}));
  NF_RETURN_IF_ERROR(ops::Cast(tensor.data, converted));
  tensor.data = converted;
  return absl::OkStatus();
}

absl::Status ExportSafetensors(const fs::path& dir, const Manifest& manifest, const fs::path& out,
                               std::optional<DType> dtype) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "export writes a new file"));
  std::vector<const TensorRecord*> params;
  std::vector<SafetensorsEntry> entries;
  for (const TensorRecord& record : manifest.tensors()) {
    if (record.kind() != TensorRecord::PARAM) continue;
    NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(dir, manifest, record));
    params.push_back(&record);
    entries.push_back({.name = record.name(),
                       .dtype = dtype.value_or(checked.dtype),
                       .shape = ExportedShape(manifest, record)});
  }
  NF_ASSIGN_OR_RETURN(
      SafetensorsWriter writer,
      SafetensorsWriter::Create(
          out,
          {{"format", "pt"}, {"producer", "normformer"}, {"step", absl::StrCat(manifest.step())}},
          std::move(entries)));
  NF_RETURN_IF_ERROR(ReadAhead<Tensor>(
      params.size(),
      [&](size_t i) -> absl::StatusOr<Tensor> {
        NF_ASSIGN_OR_RETURN(NamedTensor t, ExportedParam(dir, manifest, *params[i]));
        NF_RETURN_IF_ERROR(ConvertForExport(t, dtype));
        return t.data;
      },
      [&](size_t, Tensor& data) { return writer.Append(data); }));
  return writer.Commit();
}

}  // namespace nf::checkpoint
