#include "checkpoint/import_tensors.h"

#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest_file.h"
#include "core/non_finite.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

// The records of the checkpoint a one-rank run (tp = pp = dp = 1) would save of these
// parameters and a fresh optimizer: per parameter its value in the source's dtype, and fp32
// master weights and moments. Pieces are left out: the records are only read through
// ImportedTensors.
Manifest OneRankManifest(const ModelConfig& model, int64_t step,
                         const std::vector<model::ParamSpec>& specs, const ParamSource& params) {
  Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_step(step);
  manifest.set_consumed_samples(0);
  manifest.set_data_stream_samples(0);
  manifest.set_optimizer_updates(0);
  manifest.set_skipped_total(0);
  *manifest.mutable_model() = model;
  Layout* layout = manifest.mutable_layout();
  layout->set_tensor_parallel(1);
  layout->set_pipeline_parallel(1);
  layout->set_data_parallel(1);
  layout->set_virtual_stages(1);
  layout->set_distributed_optimizer(false);
  for (const model::ParamSpec& spec : specs) {
    const DType param_dtype = params.dtype(spec.name);
    for (const TensorRecord::Kind kind : {TensorRecord::PARAM, TensorRecord::MASTER,
                                          TensorRecord::EXP_AVG, TensorRecord::EXP_AVG_SQ}) {
      TensorRecord* record = manifest.add_tensors();
      record->set_name(spec.name);
      record->set_kind(kind);
      for (int64_t dim : spec.global_shape) record->add_global_shape(dim);
      record->set_dtype(
          std::string(DTypeName(kind == TensorRecord::PARAM ? param_dtype : DType::kF32)));
    }
  }
  return manifest;
}

// The whole tensors of OneRankManifest's records, made from the source as they are asked for
// (the four records of a parameter one after the other): the parameter read once and checked to
// be finite, master weights its fp32 copy, moments zero.
class ImportedTensors {
 public:
  explicit ImportedTensors(const ParamSource& params) : params_(params) {}

  absl::StatusOr<AssembledTensor> operator()(const TensorRecord& record) {
    if (record.name() != name_) {
      NF_ASSIGN_OR_RETURN(Tensor read, params_.read(record.name()));
      const NonFinite bad = FindNonFinite(read.raw_data(), read.numel(), read.dtype());
      if (bad.count > 0) {
        return absl::DataLossError(absl::StrCat(params_.where(record.name()), " holds ", bad.count,
                                                " non-finite values (the first at element ",
                                                bad.first, ")"));
      }
      name_ = record.name();
      param_ = std::move(read);
    }
    AssembledTensor whole{
        .global = param_,
        .shape = Shape(record.global_shape().begin(), record.global_shape().end())};
    if (record.kind() == TensorRecord::MASTER) {
      NF_ASSIGN_OR_RETURN(whole.global, Tensor::HostEmpty(DType::kF32, {param_.numel()}));
      NF_RETURN_IF_ERROR(ops::Cast(param_, whole.global));
    } else if (record.kind() != TensorRecord::PARAM) {
      // Both moments share one zero tensor (read only by the writer): with the next record read
      // ahead, two would be in memory at once.
      if (!zeros_.defined() || zeros_.numel() != param_.numel()) {
        NF_ASSIGN_OR_RETURN(zeros_, Tensor::HostZeros(DType::kF32, {param_.numel()}));
      }
      whole.global = zeros_;
    }
    return whole;
  }

 private:
  const ParamSource& params_;
  std::string name_;  // the parameter in param_
  Tensor param_;
  Tensor zeros_;  // f32 [numel of param_], or undefined
};

}  // namespace

absl::Status WriteImportedCheckpoint(const fs::path& source, const ModelConfig& model, int64_t step,
                                     const std::vector<model::ParamSpec>& specs,
                                     const ParamSource& params, const TargetLayout& layout,
                                     const fs::path& out) {
  ImportedTensors tensors(params);
  return WriteCheckpointForLayout(source, OneRankManifest(model, step, specs, params),
                                  std::ref(tensors), layout, out);
}

}  // namespace nf::checkpoint
