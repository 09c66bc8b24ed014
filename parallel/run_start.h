// Which launch of a run a rank belongs to: rank 0's wall clock when the launch started, the same
// on every rank of the launch and different for the next one (a requeue, a resume). Each rank's
// flight record carries it (flight_dumps.h), so that nf-flight refuses records of two launches
// left in one RUN/flight instead of merging them into one job.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace nf::parallel {

// Collective over `world`: rank 0's WallClockNanos(), on every rank.
absl::StatusOr<int64_t> AgreeOnRunStart(Communicator& world);

}  // namespace nf::parallel
