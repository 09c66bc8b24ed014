// The safetensors file format (Hugging Face's `safetensors` package): an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to its dtype, shape and byte range
// in the data section (and "__metadata__" to a string -> string map), then the data section:
// every tensor's raw little-endian row-major bytes, together covering it exactly.
//
// Both directions take f32, f16 and bf16 tensors ("F32", "F16", "BF16"). Reading trusts nothing
// in the file: the header is parsed strictly, every range is checked against the file and the
// tensor's shape and dtype, and any problem is an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/files/atomic_file.h"
#include "core/tensor.h"

namespace nf::checkpoint {

struct NamedTensor {
  std::string name;
  Shape shape;
  Tensor data;  // host, [numel] in the tensor's dtype
};

// Metadata entries in the order they are written (the header is deterministic: the same
// tensors and metadata give the same bytes).
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// One tensor of a safetensors file, as its header describes it.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};

// Writes a safetensors file tensor by tensor, so that no more than one tensor need be in memory:
// the header (every entry's name, dtype, shape and place) is written first, then each Append
// must bring the next entry's tensor, in order. The file is written under a temporary name of its
// own (core/files/atomic_file.h) and renamed to `out` by Commit once every tensor is there, never
// over a file that appeared there meanwhile; a writer destroyed before Commit removes its
// temporary. The data section starts 8-byte aligned
// (the header padded with spaces), and the same entries and metadata give the same bytes.
class SafetensorsWriter {
 public:
  static absl::StatusOr<SafetensorsWriter> Create(const std::filesystem::path& out,
                                                  const SafetensorsMetadata& metadata,
                                                  std::vector<SafetensorsEntry> entries);
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();

  // `data`: host, the next entry's dtype and number of elements.
  absl::Status Append(const Tensor& data);
  absl::Status Commit();

 private:
  SafetensorsWriter(std::filesystem::path out, std::vector<SafetensorsEntry> entries,
                    std::unique_ptr<AtomicFileWriter> file);

  std::filesystem::path out_;
  std::vector<SafetensorsEntry> entries_;
  std::unique_ptr<AtomicFileWriter> file_;  // null once committed or moved from
  size_t appended_ = 0;
};

// The whole file at once, through SafetensorsWriter.
absl::Status WriteSafetensors(const std::filesystem::path& out, const SafetensorsMetadata& metadata,
                              const std::vector<NamedTensor>& tensors);

// A safetensors file opened for reading tensor by tensor. Open reads and checks the header (the
// data section covered exactly, every range fitting its shape and dtype); Read reads one
// tensor's bytes, so that no more than the tensors asked for are in memory.
class SafetensorsReader {
 public:
  static absl::StatusOr<SafetensorsReader> Open(const std::filesystem::path& file);

  const std::filesystem::path& file() const { return file_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // header order
  // Null when the file has no tensor of that name.
  const SafetensorsEntry* Find(const std::string& name) const;
  // Host [numel] in the entry's dtype; NotFound naming the file for an unknown name.
  absl::StatusOr<Tensor> Read(const std::string& name) const;

 private:
  SafetensorsReader() = default;

  std::filesystem::path file_;
  SafetensorsMetadata metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::vector<int64_t> offsets_;  // each entry's first byte in the file
  std::map<std::string, size_t> index_;
};

struct SafetensorsContents {
  SafetensorsMetadata metadata;      // in the header's order
  std::vector<NamedTensor> tensors;  // in the header's order
};

// Reads the whole file.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::filesystem::path& file);

}  // namespace nf::checkpoint
