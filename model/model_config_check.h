// The one validation every model config goes through, wherever it comes from: a run's config
// (nf-launch), a checkpoint's manifest (load, verify, inspect, convert, export, nf-eval,
// nf-generate) and an imported file's metadata (nf-ckpt import). A config that passes can be
// built: every size is positive and below a bound no real model reaches (so that a corrupt or
// hostile number is a refusal naming the field, not an out-of-memory or a division by zero),
// and every probability is one.
#pragma once

#include "absl/status/status.h"
#include "model/model_config.pb.h"

namespace nf::model {

// InvalidArgument naming the first bad field ("model.max_seq_len must be ...") and its value.
absl::Status ValidateModelConfig(const ModelConfig& model);

}  // namespace nf::model
