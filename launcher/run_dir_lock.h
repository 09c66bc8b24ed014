// One live nf-launch per run directory: a second one would interleave log records and race the
// first for checkpoints. The lock is an flock on RUN/.lock held for the life of the process
// (the kernel drops it when the process dies, however it dies), with the holder's pid inside
// for the error message.
#pragma once

#include <filesystem>

#include "absl/status/statusor.h"

namespace nf::launcher {

class RunDirLock {
 public:
  // Creates the run directory if needed and takes its lock; FailedPrecondition naming the
  // holder's pid when another process has it, Unavailable when the directory cannot be made
  // or written.
  static absl::StatusOr<RunDirLock> Acquire(const std::filesystem::path& run_dir);

  RunDirLock(RunDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&&) = delete;
  ~RunDirLock();

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace nf::launcher
