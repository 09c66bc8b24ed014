#include "core/files/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf {
namespace fs = std::filesystem;

namespace {

// Attempts at a fresh temporary name before giving up: each is taken only when nothing is at
// that name, so names others put there are skipped, never reused.
constexpr int kNameAttempts = 1000;

absl::Status Errno(absl::string_view what, const fs::path& path, int reason) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path.string(), ": ", std::strerror(reason)));
}

// "DIR/NAME.tmp-PID-N": unique within this process by N, across processes by the PID.
fs::path TemporaryName(const fs::path& target) {
  static std::atomic<uint64_t> counter{0};
  return DirectoryOf(target) /
         absl::StrCat(target.filename().string(), ".tmp-", ::getpid(), "-", counter.fetch_add(1));
}

// Makes something at a fresh temporary name beside `target` with `make`, which returns
// AlreadyExists when the name is taken (then the next name is tried).
template <typename Make>
absl::StatusOr<fs::path> CreateFresh(const fs::path& target, absl::string_view kind, Make make) {
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    const fs::path name = TemporaryName(target);
    const absl::Status made = make(name);
    if (made.ok()) return name;
    if (!absl::IsAlreadyExists(made)) return made;
  }
  return absl::UnavailableError(absl::StrCat("cannot create a temporary ", kind, " beside ",
                                             target.string(), ": ", kNameAttempts,
                                             " names of the form NAME.tmp-PID-N are all taken"));
}

// rename(2) that fails with EEXIST instead of replacing `to`. renameat2's RENAME_NOREPLACE where
// the file system has it; elsewhere a file is linked (link(2) never replaces) and its temporary
// name removed, and a directory is renamed after checking that nothing is at `to` (the one
// window left, on file systems without RENAME_NOREPLACE).
int RenameNoReplace(const fs::path& from, const fs::path& to, bool is_directory) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (!is_directory) {
    if (::link(from.c_str(), to.c_str()) != 0) return -1;
    return ::unlink(from.c_str());
  }
  struct stat st {};
  if (::lstat(to.c_str(), &st) == 0) {
    errno = EEXIST;
    return -1;
  }
  return std::rename(from.c_str(), to.c_str());
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const fs::path& target) {
  std::optional<DurableWriter> file;
  NF_ASSIGN_OR_RETURN(const fs::path temporary,
                      CreateFresh(target, "file", [&](const fs::path& name) -> absl::Status {
                        NF_ASSIGN_OR_RETURN(DurableWriter created, DurableWriter::Create(name));
                        file.emplace(std::move(created));
                        return absl::OkStatus();
                      }));
  return AtomicFileWriter(target, temporary, *std::move(file));
}

AtomicFileWriter::AtomicFileWriter(fs::path target, fs::path temporary, DurableWriter file)
    : target_(std::move(target)),
      temporary_(std::move(temporary)),
      file_(std::make_unique<DurableWriter>(std::move(file))) {}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : target_(std::move(other.target_)),
      temporary_(std::move(other.temporary_)),
      file_(std::move(other.file_)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ == nullptr) return;
  file_.reset();  // closes the descriptor before the name goes
  // A full disk must not be made fuller by what failed to fit. The name is our own: created
  // exclusively above.
  ::unlink(temporary_.c_str());
}

absl::Status AtomicFileWriter::Append(const void* data, int64_t size) {
  return file_->Append(data, size);
}

absl::Status AtomicFileWriter::Commit(OnCommit mode) {
  NF_RETURN_IF_ERROR(file_->Close());
  NF_RETURN_IF_ERROR(MoveIntoPlace(temporary_, target_, mode));
  file_.reset();  // committed: the destructor leaves the name alone
  return absl::OkStatus();
}

absl::Status MoveIntoPlace(const fs::path& from, const fs::path& to, OnCommit mode) {
  const int rc = mode == OnCommit::kReplace ? std::rename(from.c_str(), to.c_str())
                                            : RenameNoReplace(from, to, /*is_directory=*/false);
  if (rc != 0) {
    const int reason = errno;
    if (reason == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot rename onto ", to.string(), ": it appeared while writing"));
    }
    return Errno("cannot rename onto", to, reason);
  }
  return SyncDirectory(DirectoryOf(to));
}

absl::Status ReplaceFileAtomically(const fs::path& path, const std::string& contents) {
  NF_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  NF_RETURN_IF_ERROR(writer.Append(contents.data(), static_cast<int64_t>(contents.size())));
  return writer.Commit(OnCommit::kReplace);
}

absl::StatusOr<StagingDirectory> StagingDirectory::Create(const fs::path& target) {
  NF_ASSIGN_OR_RETURN(fs::path path,
                      CreateFresh(target, "directory", [](const fs::path& name) -> absl::Status {
                        if (::mkdir(name.c_str(), 0755) == 0) return absl::OkStatus();
                        if (errno == EEXIST) return absl::AlreadyExistsError(name.string());
                        return Errno("cannot create directory", name, errno);
                      }));
  return StagingDirectory(target, std::move(path));
}

StagingDirectory::StagingDirectory(StagingDirectory&& other) noexcept
    : target_(std::move(other.target_)), path_(std::exchange(other.path_, fs::path())) {}

StagingDirectory::~StagingDirectory() {
  if (path_.empty()) return;
  // Our own directory (mkdir made it), holding only what this writer's user put there.
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

absl::Status StagingDirectory::Commit() {
  NF_RETURN_IF_ERROR(SyncDirectory(path_));
  if (RenameNoReplace(path_, target_, /*is_directory=*/true) != 0) {
    const int reason = errno;
    if (reason == EEXIST || reason == ENOTEMPTY) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot rename ", path_.string(), " to ", target_.string(),
                       ": something appeared there while writing; it is left as it was"));
    }
    return Errno(absl::StrCat("cannot rename ", path_.string(), " to"), target_, reason);
  }
  path_.clear();
  return SyncDirectory(DirectoryOf(target_));
}

}  // namespace nf
