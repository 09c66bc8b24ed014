// A read-only, shared memory mapping of a whole file (the .bin and .idx of an indexed dataset),
// and what happens when the file shrinks under it.
//
// Reading a page of a mapping past the file's current end raises SIGBUS, which by default kills
// the process without a word. That is what truncating or rewriting a dataset under a running job
// does (an nf-preprocess run writing the same prefix, a copy over NFS, a full disk on the file
// server). Every mapping is therefore registered in a process-wide table, and a SIGBUS handler,
// installed with the first mapping, looks the faulting address up: inside a registered mapping
// it prints one line naming the file, the offset and what to do, and exits with status 1 (under
// mpirun the other ranks are then aborted); elsewhere it passes the signal on to the handler
// that was installed before it (or the default action), so other SIGBUS causes are unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace nf::data {

// The exit status of a process whose mapped file was truncated under it.
inline constexpr int kMappedFileTruncatedExitCode = 1;

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` whole. A directory or other non-regular file is refused by name; an empty file
  // has no mapping (data() is null, size() 0), since mmap rejects length 0.
  absl::Status Map(const std::string& path);

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace nf::data
