// Reading what one rank needs of a checkpoint tensor: only the pieces that hold elements of its
// shard (or of its optimizer slices), each read whole (its CRC-32C covers the piece) in blocks
// that are checksummed, checked for non-finite values and scattered into place while cached.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/tensor.h"
#include "model/param_table.h"

namespace nf::checkpoint {

// The shard files of one checkpoint, each opened once, and the bytes read from them.
class ShardReader {
 public:
  explicit ShardReader(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ~ShardReader();

  const std::filesystem::path& dir() const { return dir_; }
  absl::Status Read(const std::string& file, int64_t offset, int64_t length, void* out);
  // Asks the kernel to start reading a range that Read will want next (the disk works while
  // the blocks before it are checked); only a hint.
  void ReadAhead(const std::string& file, int64_t offset, int64_t length);
  int64_t bytes_read() const { return bytes_read_; }

 private:
  absl::StatusOr<int> Open(const std::string& file);

  std::filesystem::path dir_;
  std::map<std::string, int> fds_;
  int64_t bytes_read_ = 0;
};

// Elements [begin, end) of a rank's shard, stored at `out` in the checkpoint's dtype, row-major,
// element `begin` first.
struct LocalRange {
  int64_t begin;
  int64_t end;
  char* out;
};

// Fills `ranges` of the shard that `place` holds of a tensor of global shape `want` from the
// pieces of `record` (CheckRecord's `checked`) that hold any of their elements, and reads no
// other piece. Elements beyond the checkpoint's tensor (padding rows of a larger vocabulary
// table) are zero. A piece that fails its checksum or holds a non-finite value is a DataLoss
// error naming the tensor and the file.
absl::Status ReadLocalRanges(ShardReader& reader, const TensorRecord& record,
                             const CheckedRecord& checked, const Shape& want,
                             const ShardPlace& place, const std::vector<LocalRange>& ranges);

// The shard of parameter `spec` that tensor-parallel rank tp_rank of tp_size holds, from
// `record`, into `target` ([numel] of the shard, any dtype, host or device).
absl::Status ReadParameterShard(ShardReader& reader, const Manifest& manifest,
                                const TensorRecord& record, const model::ParamSpec& spec,
                                int tp_rank, int tp_size, const Tensor& target);

// Checks `record` as a load would, without holding it: CheckRecord's checks, then every piece
// read in blocks of 1 MiB, its CRC-32C verified and its values checked finite (what
// `nf-ckpt verify` runs: one block in memory, whatever the tensor's size). DataLoss naming the
// tensor, the piece and the file; else the record's number of elements.
absl::StatusOr<int64_t> VerifyRecord(ShardReader& reader, const Manifest& manifest,
                                     const TensorRecord& record);

// The place of parameter `spec`'s shard on tensor-parallel rank tp_rank of tp_size.
ShardPlace PlaceOf(const model::ParamSpec& spec, int tp_rank, int tp_size);

}  // namespace nf::checkpoint
