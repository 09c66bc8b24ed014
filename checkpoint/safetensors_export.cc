#include "checkpoint/safetensors_export.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/assemble.h"
#include "checkpoint/output_path.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {

namespace fs = std::filesystem;

absl::StatusOr<NamedTensor> ExportedParam(const fs::path& dir, const Manifest& manifest,
                                          const TensorRecord& record) {
  NF_ASSIGN_OR_RETURN(AssembledTensor a, AssembleTensor(dir, manifest, record));
  NamedTensor t{.name = record.name(), .shape = a.shape, .data = a.global};
  if (IsVocabularyTable(t.name) && t.shape[0] > manifest.model().vocab_size()) {
    t.shape[0] = manifest.model().vocab_size();  // drop the layout's padding rows
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
  std::vector<NamedTensor> tensors;
  for (const TensorRecord& record : manifest.tensors()) {
    if (record.kind() != TensorRecord::PARAM) continue;
    NF_ASSIGN_OR_RETURN(NamedTensor t, ExportedParam(dir, manifest, record));
    NF_RETURN_IF_ERROR(ConvertForExport(t, dtype));
    tensors.push_back(std::move(t));
  }
  return WriteSafetensors(
      out, {{"format", "pt"}, {"producer", "normformer"}, {"step", absl::StrCat(manifest.step())}},
      tensors);
}

}  // namespace nf::checkpoint
