#include "launcher/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/files/durable_files.h"
#include "core/status.h"

namespace nf::launcher {
namespace fs = std::filesystem;

namespace {

// Locks `fd` (closing it when another process holds the lock: FailedPrecondition with its pid).
absl::Status LockOrName(int fd, const fs::path& run_dir) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return absl::OkStatus();
  char holder[32] = {};
  const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
  ::close(fd);
  const std::string pid = n > 0 ? std::string(absl::StripAsciiWhitespace(holder)) : "?";
  return absl::FailedPreconditionError(
      absl::StrCat("run directory ", run_dir.string(), " is in use by another nf-launch (pid ", pid,
                   "): wait for it to end or choose another --run-dir"));
}

// Unavailable when `run_dir` (not a directory yet) could not be created: something that is not
// a directory stands where its first missing directory would go, or the nearest directory above
// it is not one this process may create entries in.
absl::Status CheckCreatable(const fs::path& run_dir) {
  const fs::path existing = NearestExistingDirectory(run_dir);
  const fs::path first_missing =
      existing / *fs::absolute(run_dir).lexically_relative(existing).begin();
  std::error_code error;
  const char* reason = nullptr;
  if (fs::exists(fs::symlink_status(first_missing, error))) {
    reason = std::strerror(ENOTDIR);
  } else if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    reason = std::strerror(errno);
  }
  if (reason == nullptr) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cannot create run directory ", run_dir.string(), ": ", reason));
}

}  // namespace

absl::StatusOr<RunDirLock> RunDirLock::Check(const fs::path& run_dir) {
  std::error_code error;
  if (!fs::is_directory(run_dir, error)) {
    NF_RETURN_IF_ERROR(CheckCreatable(run_dir));
    return RunDirLock(run_dir, -1);
  }
  // An existing .lock only (never through a link): opened without O_CREAT or O_TRUNC, so
  // nothing changes yet.
  absl::StatusOr<int> fd = OpenForAppend(run_dir / ".lock", O_RDWR, "lock file", /*create=*/false);
  if (absl::IsNotFound(fd.status())) {
    if (::access(run_dir.c_str(), W_OK | X_OK) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot write in run directory ", run_dir.string(),
                                                 ": ", std::strerror(errno)));
    }
    return RunDirLock(run_dir, -1);
  }
  NF_RETURN_IF_ERROR(fd.status());
  NF_RETURN_IF_ERROR(LockOrName(*fd, run_dir));
  return RunDirLock(run_dir, *fd);
}

absl::StatusOr<RunDirLock> RunDirLock::Acquire(const fs::path& run_dir) {
  NF_ASSIGN_OR_RETURN(RunDirLock lock, Check(run_dir));
  NF_RETURN_IF_ERROR(lock.Take());
  return lock;
}

absl::Status RunDirLock::Take() {
  std::error_code error;
  fs::create_directories(run_dir_, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create run directory ", run_dir_.string(), ": ", error.message()));
  }
  if (fd_ < 0) {  // Check found no .lock: created now, never through a link
    const fs::path path = run_dir_ / ".lock";
    NF_ASSIGN_OR_RETURN(const int fd, OpenForAppend(path, O_RDWR, "lock file"));
    NF_RETURN_IF_ERROR(LockOrName(fd, run_dir_));
    fd_ = fd;
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", (run_dir_ / ".lock").string(), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept
    : run_dir_(std::move(other.run_dir_)), fd_(std::exchange(other.fd_, -1)) {}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace nf::launcher
