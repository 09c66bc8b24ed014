#include "eval/run_on_layout.h"

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "parallel/mpi_runtime.h"

namespace nf::eval {
namespace {

int LayoutError(const char* program, absl::string_view message) {
  if (parallel::PrintsSharedErrors()) {
    std::cerr << program << ": " << message << "\n(run " << program << " --help for usage)\n";
  }
  return 2;
}

}  // namespace

int RunOnLayout(const char* program, parallel::ParallelSizes sizes,
                const std::function<absl::Status(parallel::ProcessGroups&)>& body) {
  if (parallel::LauncherRank() < 0) {
    const int ranks = sizes.tp * sizes.pp;
    if (ranks > 1) {
      return LayoutError(program,
                         absl::StrCat("--tp ", sizes.tp, " x --pp ", sizes.pp, " needs ", ranks,
                                      " ranks: run mpirun -np ", ranks, " ", program, " ..."));
    }
    parallel::ProcessGroups groups = parallel::SingleProcessGroups();
    if (const absl::Status status = body(groups); !status.ok()) {
      std::cerr << program << ": " << status.message() << "\n";
      return 1;
    }
    return 0;
  }
  absl::StatusOr<parallel::ProcessGroups> groups = parallel::CreateProcessGroups(sizes);
  if (!groups.ok()) return LayoutError(program, groups.status().message());
  if (const absl::Status status = body(*groups); !status.ok()) {
    std::cerr << program << ": " << groups->topology.ToString() << ": " << status.message() << "\n";
    parallel::AbortJob(1);
  }
  return 0;
}

}  // namespace nf::eval
