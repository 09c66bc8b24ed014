// The one way every tool writes a file or a directory that readers must see whole: written under
// a temporary name of its own and renamed into place at the end.
//
// The temporary is a new, unique name beside the target, "NAME.tmp-PID-N", created exclusively
// (a file with O_CREAT | O_EXCL | O_NOFOLLOW, a directory with mkdir), so a symbolic or hard
// link, or a user's own "NAME.tmp", found there is never opened, truncated or removed: the
// writer removes only what it created itself. A process killed mid-write leaves its
// "NAME.tmp-PID-N" behind (it cannot clean up), never a damaged target.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/files/durable_files.h"

namespace nf {

// Whether the rename at the end may replace what is at the target by then.
enum class OnCommit {
  kReplace,    // an existing file (or symbolic link) at the target is replaced (a log, `latest`)
  kNoReplace,  // AlreadyExists if the target appeared since the tool checked it (new outputs)
};

// A file written sequentially under a temporary name and renamed over `target` by Commit.
// Destroyed before Commit, it removes its temporary.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::filesystem::path& target);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, int64_t size);
  int64_t size() const { return file_->size(); }
  // fsyncs the file, renames it onto the target and syncs the directory. A failure removes the
  // temporary; the target is as it was.
  absl::Status Commit(OnCommit mode);

 private:
  AtomicFileWriter(std::filesystem::path target, std::filesystem::path temporary,
                   DurableWriter file);

  std::filesystem::path target_;
  std::filesystem::path temporary_;
  std::unique_ptr<DurableWriter> file_;  // null once committed or moved from
};

// Writes `contents` through an AtomicFileWriter that replaces `path`: readers see the old file
// or the new one, never a mix. A failure (the OS's reason in the message) leaves nothing behind.
absl::Status ReplaceFileAtomically(const std::filesystem::path& path, const std::string& contents);

// Renames `from` (a file this process wrote under a name of its own, e.g. in a
// StagingDirectory) to `to`, replacing what is there or not as `mode` says (AlreadyExists), and
// syncs the directory: for files a library writes itself (SentencePiece's trained model).
absl::Status MoveIntoPlace(const std::filesystem::path& from, const std::filesystem::path& to,
                           OnCommit mode);

// A directory filled under a temporary name (created by mkdir, so new) and renamed to `target` by
// Commit, which replaces nothing. Destroyed before Commit, it removes the temporary directory
// with what was written into it.
class StagingDirectory {
 public:
  static absl::StatusOr<StagingDirectory> Create(const std::filesystem::path& target);
  StagingDirectory(StagingDirectory&& other) noexcept;
  StagingDirectory& operator=(StagingDirectory&&) = delete;
  ~StagingDirectory();

  const std::filesystem::path& path() const { return path_; }
  // Syncs the directory, renames it to the target (AlreadyExists if something is there by then)
  // and syncs the parent.
  absl::Status Commit();

 private:
  StagingDirectory(std::filesystem::path target, std::filesystem::path path)
      : target_(std::move(target)), path_(std::move(path)) {}

  std::filesystem::path target_;
  std::filesystem::path path_;  // empty once committed or moved from
};

}  // namespace nf
