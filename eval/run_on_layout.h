// How nf-eval and nf-generate run on their layout: one process, or the tensor x pipeline
// (x data) parallel groups of an MPI job.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "parallel/process_groups.h"

namespace nf::eval {

// Runs `body` on this process's groups and returns the program's exit code: 0 when it
// succeeds; 2 for a layout the world cannot hold (tp x pp > 1 without mpirun, or sizes that do
// not divide the world), said once by rank 0 with a pointer to `program --help`; 1 when `body`
// fails, which under MPI ends the whole job (other ranks may be waiting on this one).
int RunOnLayout(const char* program, parallel::ParallelSizes sizes,
                const std::function<absl::Status(parallel::ProcessGroups&)>& body);

}  // namespace nf::eval
