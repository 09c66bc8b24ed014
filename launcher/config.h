// The run configuration: a TrainConfig read from protobuf text format, adjusted by
// `--set field.path=value` overrides, validated, and written back out in full for the run
// directory. Every error is one line a user can act on without reading this code.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

// Reads `path` (protobuf text format), applies `overrides` in order (see ApplyOverride) and
// validates the result (see ValidateTrainConfig). Errors: NotFound or FailedPrecondition naming
// the path when the file cannot be read; InvalidArgument "PATH:LINE:COL: message" for a parse
// error, "--set OVERRIDE: ..." for a bad override, or the validation error.
absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                            const std::vector<std::string>& overrides);

// Sets one singular scalar field of `message` from "field.path=value": the path walks nested
// messages by field name (creating them), and the value is parsed for the field's type (decimal
// integers within the type's range; finite floating-point numbers; true/false/1/0; enum value
// names; strings verbatim). InvalidArgument "--set OVERRIDE: ..." naming the bad component and
// what would be accepted there (the message's field names, the enum's value names) otherwise.
absl::Status ApplyOverride(const std::string& override_text, google::protobuf::Message* message);

// OK, or InvalidArgument with a one-line message naming the first offending field, its value
// and what would work.
absl::Status ValidateTrainConfig(const TrainConfig& config);

// `config` in protobuf text format with every field written out, unset ones at their defaults,
// so that the copy kept with a run documents it completely even if defaults change later.
// Parsing it back gives a message equivalent to `config`.
std::string ResolvedConfigText(const TrainConfig& config);

}  // namespace nf::launcher
