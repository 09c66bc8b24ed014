// Agreeing on an error: a check that each rank makes for itself (its memory, its files) must
// end the same way on every rank, or the ranks that passed walk into a collective the others
// never join. The error travels to every rank, so rank 0 alone can print it once.
#pragma once

#include "absl/status/status.h"
#include "parallel/communicator.h"

namespace nf::parallel {

// Collective over `group`: OK on every rank when `local` is OK on every rank, else on every
// rank the error (code and message, the message cut at 4 KiB) of the lowest rank that has one.
// A failure to communicate is returned as it is.
absl::Status LowestRankError(const absl::Status& local, Communicator& group);

}  // namespace nf::parallel
