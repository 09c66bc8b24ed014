#include "checkpoint/load_parameters.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/assemble.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {

absl::Status LoadParameters(const std::filesystem::path& dir, const Manifest& manifest,
                            model::ParamTable& params, int tp_rank, int tp_size) {
  std::map<std::string, const TensorRecord*> records;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() == TensorRecord::PARAM) records[r.name()] = &r;
  }
  for (const model::ParamTable::Entry& e : params.entries()) {
    const auto record = records.find(e.spec.name);
    if (record == records.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir.string(), " has no parameter ", e.spec.name));
    }
    NF_ASSIGN_OR_RETURN(const AssembledTensor whole,
                        AssembleTensor(dir, manifest, *record->second));
    NF_ASSIGN_OR_RETURN(const Tensor shard,
                        CutShard(dir, whole, e.spec, e.value.numel(), tp_rank, tp_size));
    NF_ASSIGN_OR_RETURN(const Tensor target, e.value.Reshape({e.value.numel()}));
    // The shard is on the host in the checkpoint's dtype; the parameter may live on a GPU.
    Tensor converted = shard;
    if (shard.dtype() != target.dtype()) {
      NF_ASSIGN_OR_RETURN(converted, Tensor::HostEmpty(target.dtype(), shard.shape()));
      NF_RETURN_IF_ERROR(ops::Cast(shard, converted));
    }
    NF_RETURN_IF_ERROR(ops::Copy(converted, target));
  }
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
