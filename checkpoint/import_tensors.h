// What the imports share (fairseq_import.h, hf_import.h): the checkpoint a one-rank run would
// save of imported parameters with a fresh optimizer, written straight into the target layout
// (no one-rank copy on disk: at 2.7B it would be 37 GB).
//
// The parameters are the source's, bit for bit, in the source's dtype, each checked to be
// finite. The optimizer state is a fresh run's: fp32 master weights equal to the parameters,
// both AdamW moments zero and no AdamW update yet (optimizer_updates 0, so the learning-rate
// schedule, which follows the updates, warms up again as fresh moments need). No sample has been
// consumed, so a run that loads it reads its data stream from the start.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/convert.h"
#include "core/tensor.h"
#include "model/model_config.pb.h"
#include "model/param_table.h"

namespace nf::checkpoint {

// Where an import's parameters come from, by checkpoint parameter name.
struct ParamSource {
  // The parameter's dtype in the source, which the checkpoint keeps.
  std::function<DType(const std::string& param)> dtype;
  // Its whole value: host [numel of its global shape] in that dtype. Asked for in the specs'
  // order, one parameter at a time, on a second thread.
  std::function<absl::StatusOr<Tensor>(const std::string& param)> read;
  // "FILE: TENSOR", where its values are, for messages.
  std::function<std::string(const std::string& param)> where;
};

// Writes the checkpoint of `specs` (the whole model's parameters, the vocabulary tables with
// vocab_size rows) to `out` for `layout` at step `step` (refused when `out` exists; staged and
// renamed when complete, removed on failure). `source` names the imported file or directory in
// errors.
absl::Status WriteImportedCheckpoint(const std::filesystem::path& source,
                                     const model::ModelConfig& model, int64_t step,
                                     const std::vector<model::ParamSpec>& specs,
                                     const ParamSource& params, const TargetLayout& layout,
                                     const std::filesystem::path& out);

}  // namespace nf::checkpoint
