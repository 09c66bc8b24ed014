#include "core/files/durable_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf {
namespace {

absl::Status Errno(absl::string_view what, const std::filesystem::path& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path.string(), ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<DurableWriter> DurableWriter::Create(const std::filesystem::path& path) {
  // O_EXCL: never an existing file, and (with O_CREAT) never through a symbolic link either.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat("cannot create ", path.string(),
                                                 ": it exists (writers create new files only)"));
  }
  if (fd < 0) return Errno("cannot create", path);
  return DurableWriter(path, fd);
}

DurableWriter::DurableWriter(DurableWriter&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      size_(other.size_),
      handed_to_disk_(other.handed_to_disk_) {
  other.fd_ = -1;
}

DurableWriter::~DurableWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status DurableWriter::Append(const void* data, int64_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(size));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path_);
    }
    p += n;
    size -= n;
    size_ += n;
  }
  if (size_ - handed_to_disk_ >= kWritebackBytes) {
    // Only a hint: where it fails (a file system without it), fsync still writes everything,
    // and an I/O error surfaces there.
    ::sync_file_range(fd_, handed_to_disk_, size_ - handed_to_disk_, SYNC_FILE_RANGE_WRITE);
    handed_to_disk_ = size_;
  }
  return absl::OkStatus();
}

absl::Status DurableWriter::Close() {
  if (::fsync(fd_) != 0) return Errno("cannot fsync", path_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Errno("cannot close", path_);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

std::filesystem::path DirectoryOf(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

std::filesystem::path NearestExistingDirectory(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::path dir = std::filesystem::absolute(path, error);
  if (error) dir = path;
  while (!std::filesystem::is_directory(dir, error) && dir.has_relative_path()) {
    dir = dir.parent_path();
  }
  return dir;
}

absl::StatusOr<int> OpenForAppend(const std::filesystem::path& path, int access_mode,
                                  const std::string& what, bool create) {
  const int fd = ::open(
      path.c_str(), access_mode | O_APPEND | (create ? O_CREAT : 0) | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT && !create) {
    return absl::NotFoundError(absl::StrCat("no ", what, " ", path.string()));
  }
  if (fd < 0 && errno == ELOOP) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path.string(),
                     " is a symbolic link: appending would write where it points; "
                     "remove it (a new one is created)"));
  }
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", what, " ", path.string(),
                                                      " for appending: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const absl::Status failed = Errno(absl::StrCat("cannot stat ", what), path);
    ::close(fd);
    return failed;
  }
  if (S_ISREG(st.st_mode) && st.st_nlink == 1) return fd;
  ::close(fd);
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path.string(),
                   S_ISREG(st.st_mode) ? absl::StrCat(" has ", st.st_nlink, " names (hard links)")
                                       : std::string(" is not a regular file"),
                   ": appending would change another file too; remove it (a new one is created)"));
}

absl::Status ReadRange(const std::filesystem::path& path, int64_t offset, int64_t length,
                       void* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const absl::Status status = ReadRangeAt(fd, path, offset, length, out);
  ::close(fd);
  return status;
}

absl::Status ReadRangeAt(int fd, const std::filesystem::path& path, int64_t offset, int64_t length,
                         void* out) {
  char* p = static_cast<char*>(out);
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, p + done, static_cast<size_t>(length - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) {
      return absl::OutOfRangeError(
          absl::StrCat(path.string(), " is truncated: bytes [", offset, ", ", offset + length,
                       ") were expected, the file ends at ", offset + done));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) {
    const std::string message = absl::StrCat("cannot read ", path.string(), ": ", error.message());
    return error == std::errc::no_such_file_or_directory ? absl::NotFoundError(message)
                                                         : absl::FailedPreconditionError(message);
  }
  std::string contents(size, '\0');
  NF_RETURN_IF_ERROR(ReadRange(path, 0, static_cast<int64_t>(size), contents.data()));
  return contents;
}

}  // namespace nf
