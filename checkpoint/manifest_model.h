// The model config as a manifest records it: every field set explicitly. A field added to
// ModelConfig after checkpoints were written can have a default for new configs that differs
// from what those checkpoints were trained with (first_position: 2, fairseq's numbering;
// checkpoints before it numbered positions from 0). A manifest that lacks such a field was
// written before it existed and reads as the older behaviour, never as the new default; an
// explicit record keeps every later default change from reinterpreting a checkpoint.
#pragma once

#include "model/model_config.pb.h"

namespace nf::checkpoint {

// For writing: every unset field of `model` set to the value the run uses, its default.
void RecordModelFieldsExplicitly(model::ModelConfig& model);

// For reading: every field older checkpoints lack set to what they were trained with
// (first_position 0), then every other unset field to its default.
void ReadUnrecordedModelFieldsAsLegacy(model::ModelConfig& model);

}  // namespace nf::checkpoint
