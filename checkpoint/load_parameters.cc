#include "checkpoint/load_parameters.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/piece_reader.h"
#include "core/status.h"

namespace nf::checkpoint {

absl::Status LoadParameters(const std::filesystem::path& dir, const Manifest& manifest,
                            model::ParamTable& params, int tp_rank, int tp_size) {
  std::map<std::string, const TensorRecord*> records;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() == TensorRecord::PARAM) records[r.name()] = &r;
  }
  ShardReader reader(dir);
  for (const model::ParamTable::Entry& e : params.entries()) {
    const auto record = records.find(e.spec.name);
    if (record == records.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir.string(), " has no parameter ", e.spec.name));
    }
    NF_ASSIGN_OR_RETURN(const Tensor target, e.value.Reshape({e.value.numel()}));
    NF_RETURN_IF_ERROR(
        ReadParameterShard(reader, manifest, *record->second, e.spec, tp_rank, tp_size, target));
  }
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
