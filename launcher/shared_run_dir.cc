#include "launcher/shared_run_dir.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "checkpoint/durable_files.h"
#include "core/status.h"
#include "core/tensor.h"
#include "parallel/agreement.h"

namespace nf::launcher {
namespace {

constexpr char kCheckFile[] = ".shared-check";

// What this rank finds in the check file: its contents, "" when it cannot open it.
std::string ReadToken(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return "";
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

absl::Status CheckRunDirectoryShared(const std::filesystem::path& run_dir,
                                     parallel::Communicator& world,
                                     absl::Span<const std::string> hosts) {
  if (std::all_of(hosts.begin(), hosts.end(),
                  [&](const std::string& h) { return h == hosts[0]; })) {
    return absl::OkStatus();
  }
  const std::filesystem::path file = run_dir / kCheckFile;
  NF_ASSIGN_OR_RETURN(const Tensor token, Tensor::HostZeros(DType::kI64, {1}));
  absl::Status written = absl::OkStatus();
  if (world.rank() == 0) {
    std::random_device random;
    *token.data<int64_t>() = static_cast<int64_t>((uint64_t{random()} << 32) | random());
    written = checkpoint::ReplaceFileAtomically(file, absl::StrCat(*token.data<int64_t>()));
  }
  NF_RETURN_IF_ERROR(parallel::LowestRankError(written, world));
  NF_RETURN_IF_ERROR(world.Broadcast(token, /*root=*/0));
  const std::string expected = absl::StrCat(*token.data<int64_t>());
  absl::Status seen = absl::OkStatus();
  if (const std::string found = ReadToken(file); found != expected) {
    seen = absl::FailedPreconditionError(absl::StrCat(
        "run directory ", run_dir.string(), " is not shared by the nodes: rank ", world.rank(),
        " on ", hosts[world.rank()], found.empty() ? " does not find " : " reads another run's ",
        file.filename().string(), ", which rank 0 on ", hosts[0],
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
