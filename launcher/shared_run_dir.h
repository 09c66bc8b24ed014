// A job across nodes keeps one run directory: its checkpoints are one directory that every rank
// writes its shard into and that rank 0 commits, and every rank resumes from what `latest`
// names there. On node-local disks each node would see a different directory (the first save
// fails, or a restart resumes from different checkpoints on different nodes), so the launcher
// checks at start-up that every rank sees what rank 0 wrote.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "parallel/communicator.h"

namespace nf::launcher {

// Collective over `world` (hosts: each rank's, by world rank). Rank 0 writes a fresh random
// token to .shared-check in the run directory, or, before a fresh run has made it, in the nearest
// directory above it that rank 0 sees (where rank 0 will create it), broadcasts that path and the
// token, and every rank reads the file back; the file is removed afterwards, so the run
// directory is left as it was (a refused run changes nothing there). FailedPrecondition on every
// rank, naming the lowest rank that did not see the token and its host, when the directory is not
// shared. Ranks on one host are not checked (they share its file system).
absl::Status CheckRunDirectoryShared(const std::filesystem::path& run_dir,
                                     parallel::Communicator& world,
                                     absl::Span<const std::string> hosts);

}  // namespace nf::launcher
