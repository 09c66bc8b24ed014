// Durable file operations: data reaches the disk (fsync) before a rename makes it visible, and
// the rename itself is made durable by syncing the directory. Errors name the path and the
// system's reason.
//
// Every path a user can hand in is hostile: a symbolic or hard link planted where a tool writes
// could point at a checkpoint's manifest.pb. So no writer here opens an existing file: files are
// created new and exclusive (O_CREAT | O_EXCL | O_NOFOLLOW), and the one kind of file that must
// be reopened, an append-only log, is refused when it is a link (OpenForAppend). Files that
// replace others are written under a temporary name of their own (atomic_file.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace nf {

// A new file being written sequentially; Close() fsyncs it. Appends start the disk writing what
// they wrote every kWritebackBytes (sync_file_range), so that the disk works while the writer
// computes and copies, and Close's fsync waits only for the tail.
class DurableWriter {
 public:
  // Creates `path`, which must not exist (AlreadyExists naming it otherwise, also for a link).
  static absl::StatusOr<DurableWriter> Create(const std::filesystem::path& path);
  DurableWriter(DurableWriter&& other) noexcept;
  DurableWriter& operator=(DurableWriter&&) = delete;
  ~DurableWriter();

  absl::Status Append(const void* data, int64_t size);
  int64_t size() const { return size_; }
  absl::Status Close();

 private:
  DurableWriter(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  static constexpr int64_t kWritebackBytes = int64_t{8} << 20;
  std::filesystem::path path_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t handed_to_disk_ = 0;  // bytes whose writeback has been started
};

// fsync of a directory: makes renames and creations inside it durable.
absl::Status SyncDirectory(const std::filesystem::path& dir);

// The directory a path's file lies in ("." for a bare name).
std::filesystem::path DirectoryOf(const std::filesystem::path& path);

// Opens `path` for appending (created when missing) with `access_mode` (O_WRONLY, or O_RDWR for
// a lock file that is read too): FailedPrecondition naming it, and what to do, when it is a
// symbolic link, a hard link (a second name of another file) or not a regular file, so that
// appending never reaches a file this path is not the only name of. `what` names the file in errors
// ("log", "lock file").
// With `create` false a missing file is NotFound and nothing is created (a check that must
// change nothing yet: RunDirLock::Check).
absl::StatusOr<int> OpenForAppend(const std::filesystem::path& path, int access_mode,
                                  const std::string& what, bool create = true);

// `path` made absolute, or the nearest directory above it that exists: where a directory that
// is not there yet would be created.
std::filesystem::path NearestExistingDirectory(const std::filesystem::path& path);

// `length` bytes of `path` from `offset`; OutOfRange naming the file when it is shorter.
absl::Status ReadRange(const std::filesystem::path& path, int64_t offset, int64_t length,
                       void* out);

// The same from a file open as `fd` (`path` names it in errors).
absl::Status ReadRangeAt(int fd, const std::filesystem::path& path, int64_t offset, int64_t length,
                         void* out);

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path);

}  // namespace nf
