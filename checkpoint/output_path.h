// Where the tools may write: never over something that exists, never inside a checkpoint.
//
// A checkpoint directory is only as good as every byte in it: a file exported over its
// manifest.pb, or a directory converted into RUN/checkpoints/ under a checkpoint's name (which
// retention would then count, and rotate a real checkpoint away for), loses a run. Every tool
// that writes (nf-ckpt export, convert and import, nf-launch's run directory, nf-eval's report)
// checks its output path here first (CheckOutputPath or CheckNewOutput).
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nf::checkpoint {

// FailedPrecondition naming the checkpoint when `path`, or a directory above it (symbolic links
// resolved as far as the path exists), is a checkpoint (it holds manifest.pb, or is named
// iter_NNNNNNN or iter_NNNNNNN.tmp) or a run's checkpoints directory (its `latest` names a
// checkpoint); OK otherwise. `flag` names the option the path came from ("--out").
absl::Status CheckOutsideCheckpoints(const std::filesystem::path& path, absl::string_view flag);

// An input a tool reads, named by its flag ("--prompt-file"), for CheckOutputPath.
struct ToolInput {
  std::filesystem::path path;
  absl::string_view flag;
};

// The one check of every tool's output path: CheckOutsideCheckpoints, and InvalidArgument naming
// both flags when `path` is one of `inputs` (the same file or directory by any name: symbolic
// links and hard links resolved) or lies inside an input directory. Tools whose output may
// replace an existing file (a report, generated text) call this; the file itself is then written
// through core/files/atomic_file.h, which replaces the name, never what it links to.
absl::Status CheckOutputPath(const std::filesystem::path& path, absl::string_view flag,
                             absl::Span<const ToolInput> inputs = {});

// CheckOutputPath, and AlreadyExists when `path` exists (even as a dangling symbolic link): the
// tools that write checkpoints and exports write new files and directories and replace nothing.
// `writes` says what the command writes ("export writes a new file").
absl::Status CheckNewOutput(const std::filesystem::path& path, absl::string_view flag,
                            absl::string_view writes, absl::Span<const ToolInput> inputs = {});

}  // namespace nf::checkpoint
