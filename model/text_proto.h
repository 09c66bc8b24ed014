// Parsing protobuf text format with the first error as our own one-line message, instead of
// protobuf's log lines on stderr: for configs (nf-launch --config) and the model configs that
// files carry (a checkpoint's manifest, an imported file's metadata).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace nf::model {

// Parses `text` into `message`; InvalidArgument "WHERE:LINE:COL: what is wrong" (1-based, as
// editors count) at the first error, printing nothing.
absl::Status ParseTextProto(absl::string_view text, absl::string_view where,
                            google::protobuf::Message& message);

}  // namespace nf::model
