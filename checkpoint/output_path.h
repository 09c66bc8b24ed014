// Where the tools may write: never over something that exists, never inside a checkpoint.
//
// A checkpoint directory is only as good as every byte in it: a file exported over its
// manifest.pb, or a directory converted into RUN/checkpoints/ under a checkpoint's name (which
// retention would then count, and rotate a real checkpoint away for), loses a run. Every tool
// that writes (nf-ckpt export, convert and import, nf-launch's run directory, nf-eval's report)
// checks its output path here first.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace nf::checkpoint {

// FailedPrecondition naming the checkpoint when `path`, or a directory above it (symbolic links
// resolved as far as the path exists), is a checkpoint (it holds manifest.pb, or is named
// iter_NNNNNNN or iter_NNNNNNN.tmp) or a run's checkpoints directory (its `latest` names a
// checkpoint); OK otherwise. `flag` names the option the path came from ("--out").
absl::Status CheckOutsideCheckpoints(const std::filesystem::path& path, absl::string_view flag);

// CheckOutsideCheckpoints, and AlreadyExists when `path` exists (even as a dangling symbolic
// link): the tools write new files and directories and replace nothing. `writes` says what the
// command writes ("export writes a new file").
absl::Status CheckNewOutput(const std::filesystem::path& path, absl::string_view flag,
                            absl::string_view writes);

}  // namespace nf::checkpoint
