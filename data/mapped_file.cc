#include "data/mapped_file.h"

#include <errno.h>  // program_invocation_short_name (GNU)
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace nf::data {
namespace {

// ---- The table of live mappings, read by the SIGBUS handler --------------------------------
//
// A fixed array of lock-free slots, because the handler may only read memory, never take a
// lock. Registration and removal (ordinary code) are serialized by a mutex; a slot is published
// by storing `begin` last (release) and retired by clearing `begin` first, so the handler sees
// either a whole entry or none. 4096 slots are two per dataset for 2048 blended datasets; a
// mapping beyond that works as before, only without the message.
struct Region {
  std::atomic<uintptr_t> begin{0};  // 0: the slot is free
  std::atomic<uintptr_t> end{0};
  std::atomic<const char*> path{nullptr};  // owned by the MappedFile, alive while mapped
};
constexpr int kMaxRegions = 4096;
Region regions[kMaxRegions];
std::mutex regions_mutex;
struct sigaction previous_sigbus_action;

// write(2) of a whole buffer, the only output a signal handler may do.
void WriteToStderr(const char* text, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, size);
    if (n <= 0) return;
    text += n;
    size -= static_cast<size_t>(n);
  }
}
void WriteToStderr(const char* text) { WriteToStderr(text, std::strlen(text)); }
void WriteToStderr(uint64_t value) {
  char digits[24];
  size_t at = sizeof(digits);
  do {
    digits[--at] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  WriteToStderr(digits + at, sizeof(digits) - at);
}

extern "C" void OnSigbus(int signal, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Region& region : regions) {
    const uintptr_t begin = region.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= region.end.load(std::memory_order_relaxed)) {
      continue;
    }
    // One line, so that it survives interleaving with the other ranks' output.
    WriteToStderr(program_invocation_short_name);
    WriteToStderr(": ");
    WriteToStderr(region.path.load(std::memory_order_relaxed));
    WriteToStderr(" was truncated or replaced while this process was reading it (SIGBUS at byte ");
    WriteToStderr(address - begin);
    WriteToStderr(" of the ");
    WriteToStderr(region.end.load(std::memory_order_relaxed) - begin);
    WriteToStderr(
        " bytes it had when opened); restore the file, or write a new dataset under another "
        "prefix, and resume from the last checkpoint\n");
    ::_exit(kMappedFileTruncatedExitCode);
  }
  // Not a mapped dataset: whatever handled SIGBUS before handles it now.
  if ((previous_sigbus_action.sa_flags & SA_SIGINFO) != 0) {
    previous_sigbus_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_sigbus_action.sa_handler != SIG_DFL &&
      previous_sigbus_action.sa_handler != SIG_IGN) {
    previous_sigbus_action.sa_handler(signal);
    return;
  }
  // The default action: reinstall it and raise; the signal is blocked inside this handler, so it
  // is delivered (and ends the process) as soon as the handler returns.
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(SIGBUS, &default_action, nullptr);
  ::raise(SIGBUS);
}

void InstallSigbusHandlerOnce() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_SIGINFO;
    ::sigaction(SIGBUS, &action, &previous_sigbus_action);
  });
}

void Register(const uint8_t* data, int64_t size, const std::string& path) {
  InstallSigbusHandlerOnce();
  const std::lock_guard<std::mutex> lock(regions_mutex);
  for (Region& region : regions) {
    if (region.begin.load(std::memory_order_relaxed) != 0) continue;
    region.path.store(path.c_str(), std::memory_order_relaxed);
    region.end.store(reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(size),
                     std::memory_order_relaxed);
    region.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return;
  }
}

void Unregister(const uint8_t* data) {
  const std::lock_guard<std::mutex> lock(regions_mutex);
  for (Region& region : regions) {
    if (region.begin.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(data)) {
      region.begin.store(0, std::memory_order_release);
      return;
    }
  }
}

absl::Status IoError(absl::string_view what, const std::string& path, int error) {
  const std::string message =
      absl::StrCat("indexed dataset: ", what, " ", path, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::FailedPreconditionError(message);
}

}  // namespace

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  Unregister(data_);
  ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

absl::Status MappedFile::Map(const std::string& path) {
  path_ = path;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open", path_, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return IoError("cannot stat", path_, error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("indexed dataset ", path_, ": not a regular file"));
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    // MAP_SHARED: every rank on a node shares one copy of the pages in the page cache.
    void* mapped = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return IoError("cannot mmap", path_, error);
    }
    data_ = static_cast<const uint8_t*>(mapped);
    Register(data_, size_, path_);
  }
  ::close(fd);  // the mapping keeps the file open
  return absl::OkStatus();
}

}  // namespace nf::data
