#include "checkpoint/piece_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "core/files/durable_files.h"
#include "core/non_finite.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

absl::Status Corrupt(const fs::path& dir, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", what));
}

// A run of the wanted elements, contiguous in the global tensor, and where it goes.
struct Target {
  int64_t global;
  int64_t count;
  char* out;
};

// Calls fn(target, from, until) for each target overlapping global elements
// [global, global + count); `targets` are sorted and disjoint.
template <typename Fn>
void ForEachOverlap(const std::vector<Target>& targets, int64_t global, int64_t count, Fn fn) {
  auto it = std::upper_bound(targets.begin(), targets.end(), global,
                             [](int64_t g, const Target& t) { return g < t.global + t.count; });
  for (; it != targets.end() && it->global < global + count; ++it) {
    fn(*it, std::max(global, it->global), std::min(global + count, it->global + it->count));
  }
}

// Reads a piece in blocks of about 1 MiB: each is checksummed, scanned and scattered while
// it is in the cache, rather than read whole into memory and gone over three times.
absl::Status ReadPiece(ShardReader& reader, const Piece& p, const CheckedRecord& checked,
                       const ShardPlace& place, const std::vector<Target>& targets,
                       std::vector<char>& block) {
  const int64_t element = static_cast<int64_t>(SizeOf(checked.dtype));
  const int64_t block_elements = std::max<int64_t>(1, (int64_t{1} << 20) / element);
  reader.ReadAhead(p.file(), p.offset(), p.length());
  uint32_t crc = 0;
  NonFinite bad;
  for (int64_t first = p.begin(); first < p.end(); first += block_elements) {
    const int64_t n = std::min(block_elements, p.end() - first);
    block.resize(static_cast<size_t>(n * element));
    NF_RETURN_IF_ERROR(reader.Read(p.file(), p.offset() + (first - p.begin()) * element,
                                   n * element, block.data()));
    crc = Crc32c(block.data(), block.size(), crc);
    const NonFinite found = FindNonFinite(block.data(), n, checked.dtype);
    if (found.count > 0 && bad.count == 0) bad.first = first + found.first;
    bad.count += found.count;
    ForEachGlobalRun(
        checked.shape, place, first, first + n, [&](int64_t local, int64_t global, int64_t count) {
          ForEachOverlap(targets, global, count, [&](const Target& t, int64_t from, int64_t until) {
            std::memcpy(t.out + (from - t.global) * element,
                        block.data() + (local - first + from - global) * element,
                        static_cast<size_t>((until - from) * element));
          });
        });
  }
  if (crc != p.crc32c()) {
    return Corrupt(reader.dir(),
                   absl::StrCat(checked.what, ": the piece at byte ", p.offset(), " of ", p.file(),
                                " fails its checksum (the file is corrupt)"));
  }
  if (bad.count > 0) {
    return Corrupt(
        reader.dir(),
        absl::StrCat(checked.what, " holds ", bad.count, " non-finite values in the piece at byte ",
                     p.offset(), " of ", p.file(), " (the first at element ", bad.first,
                     " of its shard): not a state to train from"));
  }
  return absl::OkStatus();
}

}  // namespace

ShardReader::~ShardReader() {
  for (const auto& [file, fd] : fds_) ::close(fd);
}

absl::StatusOr<int> ShardReader::Open(const std::string& file) {
  const auto it = fds_.find(file);
  if (it != fds_.end()) return it->second;
  const fs::path path = dir_ / file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path.string(), ": ", std::strerror(errno)));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint: larger read-ahead
  fds_.emplace(file, fd);
  return fd;
}

absl::Status ShardReader::Read(const std::string& file, int64_t offset, int64_t length, void* out) {
  NF_ASSIGN_OR_RETURN(const int fd, Open(file));
  NF_RETURN_IF_ERROR(ReadRangeAt(fd, dir_ / file, offset, length, out));
  bytes_read_ += length;
  return absl::OkStatus();
}

void ShardReader::ReadAhead(const std::string& file, int64_t offset, int64_t length) {
  const absl::StatusOr<int> fd = Open(file);
  if (fd.ok()) ::posix_fadvise(*fd, offset, length, POSIX_FADV_WILLNEED);
}

absl::StatusOr<int64_t> VerifyRecord(ShardReader& reader, const Manifest& manifest,
                                     const TensorRecord& record) {
  NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(reader.dir(), manifest, record));
  std::vector<char> block;
  for (int i = 0; i < record.pieces_size(); ++i) {
    NF_RETURN_IF_ERROR(
        ReadPiece(reader, record.pieces(i), checked, checked.places[i], /*targets=*/{}, block));
  }
  return NumElements(checked.shape);
}

absl::Status ReadLocalRanges(ShardReader& reader, const TensorRecord& record,
                             const CheckedRecord& checked, const Shape& want,
                             const ShardPlace& place, const std::vector<LocalRange>& ranges) {
  const int64_t element = static_cast<int64_t>(SizeOf(checked.dtype));
  // Global indices of `want` and of the checkpoint's shape agree while rows exist in both
  // (CheckShapeFits: equal column counts).
  const int64_t available = NumElements(checked.shape);
  std::vector<Target> targets;
  for (const LocalRange& r : ranges) {
    ForEachGlobalRun(
        want, place, r.begin, r.end, [&](int64_t local, int64_t global, int64_t count) {
          char* out = r.out + (local - r.begin) * element;
          const int64_t present = std::clamp<int64_t>(available - global, 0, count);
          if (present > 0) targets.push_back({global, present, out});
          std::memset(out + present * element, 0, static_cast<size_t>((count - present) * element));
        });
  }
  std::sort(targets.begin(), targets.end(),
            [](const Target& a, const Target& b) { return a.global < b.global; });
  std::vector<char> block;
  for (int i = 0; i < record.pieces_size(); ++i) {
    const Piece& p = record.pieces(i);
    bool needed = false;
    ForEachGlobalRun(checked.shape, checked.places[i], p.begin(), p.end(),
                     [&](int64_t, int64_t global, int64_t count) {
                       ForEachOverlap(targets, global, count,
                                      [&](const Target&, int64_t, int64_t) { needed = true; });
                     });
    if (needed)
      NF_RETURN_IF_ERROR(ReadPiece(reader, p, checked, checked.places[i], targets, block));
  }
  return absl::OkStatus();
}

ShardPlace PlaceOf(const model::ParamSpec& spec, int tp_rank, int tp_size) {
  const bool replicated = spec.sharding == model::Sharding::kReplicated;
  return {.sharding = spec.sharding,
          .tp_rank = replicated ? 0 : tp_rank,
          .tp_size = replicated ? 1 : tp_size};
}

absl::Status ReadParameterShard(ShardReader& reader, const Manifest& manifest,
                                const TensorRecord& record, const model::ParamSpec& spec,
                                int tp_rank, int tp_size, const Tensor& target) {
  NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(reader.dir(), manifest, record));
  NF_RETURN_IF_ERROR(CheckShapeFits(reader.dir(), checked.shape, spec));
  const ShardPlace place = PlaceOf(spec, tp_rank, tp_size);
  const int64_t numel = target.numel();
  if (target.device().type == DeviceType::kCpu && target.dtype() == checked.dtype) {
    return ReadLocalRanges(reader, record, checked, spec.global_shape, place,
                           {{0, numel, static_cast<char*>(target.raw_data())}});
  }
  // Read on the host in the checkpoint's dtype, then converted and copied to the target.
  NF_ASSIGN_OR_RETURN(const Tensor staged, Tensor::HostEmpty(checked.dtype, {numel}));
  NF_RETURN_IF_ERROR(ReadLocalRanges(reader, record, checked, spec.global_shape, place,
                                     {{0, numel, static_cast<char*>(staged.raw_data())}}));
  if (target.device().type == DeviceType::kCpu) return ops::Cast(staged, target);
  Tensor converted = staged;
  if (staged.dtype() != target.dtype()) {
    NF_ASSIGN_OR_RETURN(converted, Tensor::HostEmpty(target.dtype(), staged.shape()));
    NF_RETURN_IF_ERROR(ops::Cast(staged, converted));
  }
  return ops::Copy(converted, target);
}

}  // namespace nf::checkpoint
