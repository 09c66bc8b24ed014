#include "checkpoint/output_path.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_names.h"
#include "core/files/durable_files.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace fs = std::filesystem;

namespace {

// A directory named as a checkpoint or as one being staged (iter_NNNNNNN, iter_NNNNNNN.tmp).
bool NamedAsCheckpoint(const fs::path& dir) {
  std::string name = dir.filename().string();
  if (absl::EndsWith(name, ".tmp")) name.resize(name.size() - 4);
  int64_t step = 0;
  return ParseIterationDirName(name, step);
}

// A run's checkpoints directory: its `latest` file names a checkpoint.
bool HoldsCheckpoints(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_regular_file(dir / kLatestName, error)) return false;
  // A checkpoint's name and a newline: anything longer names none (and is not read whole).
  constexpr uintmax_t kLongestLatest = 64;
  if (fs::file_size(dir / kLatestName, error) > kLongestLatest || error) return false;
  const absl::StatusOr<std::string> named = ReadWholeFile(dir / kLatestName);
  int64_t step = 0;
  return named.ok() && ParseIterationDirName(std::string(absl::StripAsciiWhitespace(*named)), step);
}

// `path` absolute, with the existing part's symbolic links and ".." resolved (weakly_canonical
// keeps the rest as written); a path the OS cannot resolve is taken as written, made absolute
// where that works.
fs::path Resolved(const fs::path& path) {
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  if (error) absolute = path;
  fs::path canonical = fs::weakly_canonical(absolute, error);
  return error ? absolute.lexically_normal() : canonical;
}

// Whether `path` lies below `dir` (both resolved).
bool Contains(const fs::path& dir, const fs::path& path) {
  const fs::path relative = path.lexically_relative(dir);
  return !relative.empty() && *relative.begin() != ".." && relative != ".";
}

}  // namespace

absl::Status CheckOutsideCheckpoints(const fs::path& path, absl::string_view flag) {
  const fs::path resolved = Resolved(path);
  for (fs::path dir = resolved; !dir.empty(); dir = dir.parent_path()) {
    std::error_code ignored;
    const bool is_dir = fs::is_directory(dir, ignored);
    if (NamedAsCheckpoint(dir) || (is_dir && fs::exists(dir / kManifestName, ignored))) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, " ", path.string(), " is inside checkpoint ", dir.string(),
                       ": writing there would damage it; choose a path outside every checkpoint"));
    }
    if (is_dir && HoldsCheckpoints(dir)) {
      return absl::FailedPreconditionError(absl::StrCat(
          flag, " ", path.string(), " is inside the checkpoints directory ", dir.string(),
          ", which only training writes (retention counts and removes what is there); choose "
          "a path outside it"));
    }
    if (dir == dir.parent_path()) break;  // the root
  }
  return absl::OkStatus();
}

absl::Status CheckOutputPath(const fs::path& path, absl::string_view flag,
                             absl::Span<const ToolInput> inputs) {
  NF_RETURN_IF_ERROR(CheckOutsideCheckpoints(path, flag));
  const fs::path resolved = Resolved(path);
  for (const ToolInput& input : inputs) {
    if (input.path.empty()) continue;
    std::error_code error;
    const bool same_file = fs::equivalent(path, input.path, error) && !error;
    const fs::path input_resolved = Resolved(input.path);
    const bool inside =
        !same_file && fs::is_directory(input.path, error) && Contains(input_resolved, resolved);
    if (same_file || resolved == input_resolved || inside) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", path.string(),
                       same_file || resolved == input_resolved ? " is " : " is inside ", input.flag,
                       " ", input.path.string(),
                       ", which this command reads: writing there would destroy its input; "
                       "choose another path"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNewOutput(const fs::path& path, absl::string_view flag, absl::string_view writes,
                            absl::Span<const ToolInput> inputs) {
  NF_RETURN_IF_ERROR(CheckOutputPath(path, flag, inputs));
  std::error_code error;
  if (fs::exists(fs::symlink_status(path, error))) {
    return absl::AlreadyExistsError(
        absl::StrCat(flag, " ", path.string(), " exists: ", writes, ", choose another"));
  }
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
