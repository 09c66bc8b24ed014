// The one validation every model config goes through, wherever it comes from: a run's config
// (nf-launch), a checkpoint's manifest (load, verify, inspect, convert, export, nf-eval,
// nf-generate) and an imported file's metadata (nf-ckpt import). A config that passes can be
// built: every size is positive and below a bound no real model reaches (so that a corrupt or
// hostile number is a refusal naming the field, not an out-of-memory or a division by zero),
// and every probability is one.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "model/model_config.pb.h"

namespace nf::model {

// InvalidArgument naming the first bad field ("model.max_seq_len must be ...") and its value.
absl::Status ValidateModelConfig(const ModelConfig& model);

// OK for a causal LM; for a masked LM (model.objective MASKED_LM), FailedPrecondition saying that
// `what` (e.g. "nf-generate") needs a causal one.
absl::Status RequireCausalLm(const ModelConfig& model, absl::string_view what);

}  // namespace nf::model
