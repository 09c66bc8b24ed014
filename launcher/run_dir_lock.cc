#include "launcher/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace nf::launcher {

absl::StatusOr<RunDirLock> RunDirLock::Acquire(const std::filesystem::path& run_dir) {
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create run directory ", run_dir.string(), ": ", error.message()));
  }
  const std::filesystem::path path = run_dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write in run directory ", run_dir.string(),
                                               ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    const std::string pid = n > 0 ? std::string(absl::StripAsciiWhitespace(holder)) : "?";
    return absl::FailedPreconditionError(
        absl::StrCat("run directory ", run_dir.string(), " is in use by another nf-launch (pid ",
                     pid, "): wait for it to end or choose another --run-dir"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int reason = errno;  // before close() can change it
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path.string(), ": ", std::strerror(reason)));
  }
  return RunDirLock(fd);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace nf::launcher
