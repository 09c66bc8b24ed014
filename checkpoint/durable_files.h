// Durable file operations for checkpoints: data reaches the disk (fsync) before a rename makes
// it visible, and the rename itself is made durable by syncing the directory. Errors name the
// path and the system's reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace nf::checkpoint {

// A file being written sequentially; Close() fsyncs it. Appends start the disk writing what
// they wrote every kWritebackBytes (sync_file_range), so that the disk works while the writer
// computes and copies, and Close's fsync waits only for the tail.
class DurableWriter {
 public:
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

// Writes `contents` to path.tmp, fsyncs it, renames it over `path` and syncs the directory:
// readers see the old file or the new one, never a mix. A failure (the OS's reason in the
// message) leaves no path.tmp behind.
absl::Status ReplaceFileAtomically(const std::filesystem::path& path, const std::string& contents);

// `length` bytes of `path` from `offset`; OutOfRange naming the file when it is shorter.
absl::Status ReadRange(const std::filesystem::path& path, int64_t offset, int64_t length,
                       void* out);

// The same from a file open as `fd` (`path` names it in errors).
absl::Status ReadRangeAt(int fd, const std::filesystem::path& path, int64_t offset, int64_t length,
                         void* out);

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path);

}  // namespace nf::checkpoint
