// The safetensors file format (Hugging Face's `safetensors` package): an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to its dtype, shape and byte range
// in the data section (and "__metadata__" to a string -> string map), then the data section:
// every tensor's raw little-endian row-major bytes, together covering it exactly.
//
// Both directions take f32, f16 and bf16 tensors ("F32", "F16", "BF16"). Reading trusts nothing
// in the file: the header is parsed strictly, every range is checked against the file and the
// tensor's shape and dtype, and any problem is an error naming the file and the tensor.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// Writes `out` through out.tmp and a rename (an existing file is replaced only by a complete
// one; the .tmp is removed on failure). Tensors are written in the given order, the data
// section 8-byte aligned (the header padded with spaces).
absl::Status WriteSafetensors(const std::filesystem::path& out, const SafetensorsMetadata& metadata,
                              const std::vector<NamedTensor>& tensors);

struct SafetensorsContents {
  SafetensorsMetadata metadata;      // in the header's order
  std::vector<NamedTensor> tensors;  // in the header's order
};

// Reads the whole file.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::filesystem::path& file);

}  // namespace nf::checkpoint
