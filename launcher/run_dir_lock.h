// One live nf-launch per run directory: a second one would interleave log records and race the
// first for checkpoints. The lock is an flock on RUN/.lock held for the life of the process
// (the kernel drops it when the process dies, however it dies), with the holder's pid inside
// for the error message.
//
// Taken in two steps, so that a launch refused by a later check leaves the directory as it was:
// Check, before anything else, takes the lock of a directory that already has one and creates
// or writes nothing; Take, once every check has passed, creates the directory and its .lock as
// needed, takes the lock if Check could not, and writes this process's pid.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace nf::launcher {

class RunDirLock {
 public:
  // FailedPrecondition naming the holder's pid when another process has the lock, Unavailable
  // when the directory could not be made (an existing part of the path is not a directory, or
  // cannot be written) or its .lock is not a plain file.
  static absl::StatusOr<RunDirLock> Check(const std::filesystem::path& run_dir);
  // Check, then Take: for callers with nothing to check in between.
  static absl::StatusOr<RunDirLock> Acquire(const std::filesystem::path& run_dir);

  absl::Status Take();

  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&&) = delete;
  ~RunDirLock();

 private:
  RunDirLock(std::filesystem::path run_dir, int fd) : run_dir_(std::move(run_dir)), fd_(fd) {}
  std::filesystem::path run_dir_;
  int fd_ = -1;  // the locked .lock, or -1 before Take when the directory had none
};

}  // namespace nf::launcher
