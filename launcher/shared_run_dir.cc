#include "launcher/shared_run_dir.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/files/atomic_file.h"
#include "core/status.h"
#include "core/tensor.h"
#include "parallel/agreement.h"

namespace nf::launcher {
namespace {

// ".shared-check-TOKEN": named by the token, so that jobs starting at once under one directory
// never read each other's.
std::string CheckFileName(const Tensor& token) {
  return absl::StrCat(".shared-check-", static_cast<uint64_t>(*token.data<int64_t>()));
}

// What this rank finds in the check file: its contents, "" when it cannot open it.
std::string ReadToken(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return "";
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Rank 0's `text` on every rank.
absl::StatusOr<std::string> BroadcastFromRankZero(parallel::Communicator& world,
                                                  const std::string& text) {
  NF_ASSIGN_OR_RETURN(const Tensor length, Tensor::HostZeros(DType::kI64, {1}));
  *length.data<int64_t>() = static_cast<int64_t>(text.size());
  NF_RETURN_IF_ERROR(world.Broadcast(length, /*root=*/0));
  NF_ASSIGN_OR_RETURN(
      const Tensor bytes,
      Tensor::HostZeros(DType::kU8, {std::max<int64_t>(1, *length.data<int64_t>())}));
  if (world.rank() == 0) std::memcpy(bytes.raw_data(), text.data(), text.size());
  NF_RETURN_IF_ERROR(world.Broadcast(bytes, /*root=*/0));
  return std::string(static_cast<const char*>(bytes.raw_data()),
                     static_cast<size_t>(*length.data<int64_t>()));
}

}  // namespace

absl::Status CheckRunDirectoryShared(const std::filesystem::path& run_dir,
                                     parallel::Communicator& world,
                                     absl::Span<const std::string> hosts) {
  if (std::all_of(hosts.begin(), hosts.end(),
                  [&](const std::string& h) { return h == hosts[0]; })) {
    return absl::OkStatus();
  }
  NF_ASSIGN_OR_RETURN(const Tensor token, Tensor::HostZeros(DType::kI64, {1}));
  absl::Status written = absl::OkStatus();
  std::string where;
  if (world.rank() == 0) {
    where = NearestExistingDirectory(run_dir).string();
    std::random_device random;
    *token.data<int64_t>() = static_cast<int64_t>((uint64_t{random()} << 32) | random());
    written = ReplaceFileAtomically(std::filesystem::path(where) / CheckFileName(token),
                                    absl::StrCat(*token.data<int64_t>()));
  }
  NF_RETURN_IF_ERROR(parallel::LowestRankError(written, world));
  NF_RETURN_IF_ERROR(world.Broadcast(token, /*root=*/0));
  NF_ASSIGN_OR_RETURN(where, BroadcastFromRankZero(world, where));
  const std::filesystem::path file = std::filesystem::path(where) / CheckFileName(token);
  const std::string expected = absl::StrCat(*token.data<int64_t>());
  absl::Status seen = absl::OkStatus();
  if (const std::string found = ReadToken(file); found != expected) {
    seen = absl::FailedPreconditionError(absl::StrCat(
        "run directory ", run_dir.string(), " is not shared by the nodes: rank ", world.rank(),
        " on ", hosts[world.rank()], found.empty() ? " does not find " : " reads another run's ",
        file.filename().string(), " in ", where, ", which rank 0 on ", hosts[0],
        " just wrote there; the checkpoints need one run directory that every node sees (a "
        "shared file system)"));
  }
  const absl::Status agreed = parallel::LowestRankError(seen, world);
  if (world.rank() == 0) {
    std::error_code ignored;
    std::filesystem::remove(file, ignored);
  }
  return agreed;
}

}  // namespace nf::launcher
