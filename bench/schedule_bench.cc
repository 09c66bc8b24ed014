// nf-bench-schedules: every pipeline schedule's step time in the unit-time model (a forward 1,
// a backward 2) under three sets of rules, as a Markdown table for docs/parallelism.md:
//   ideal  sends never wait (buffered), the schedule's own bound;
//   MPI    rendezvous sends waited for as PipelineExecutor waits (SimulateSchedules with its
//          send windows): what the MPI path runs;
//   NCCL   the executor's transfer plan under NCCL's rules (SimulateUnderNcclRules): groups
//          run in issue order and complete only when every transfer's other end has started.
// Each cell is "ideal / MPI / NCCL"; a layout that deadlocks says so instead of a time. Exits 1
// if NCCL's time differs from the ideal anywhere. Usage: nf-bench-schedules [--max-p N].
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/transfer_plan.h"

namespace nf::parallel {
namespace {

std::string Time(const absl::StatusOr<SimulationResult>& result) {
  return result.ok() ? absl::StrCat(result->makespan) : "deadlock";
}

// "ideal / MPI / NCCL" for one layout; counts the layouts where NCCL's time is not the ideal.
std::string Cell(const absl::StatusOr<std::vector<std::vector<Action>>>& lists,
                 const std::vector<int>& windows, int& off_ideal) {
  if (!lists.ok()) return "-";
  const SimulationOptions timing = {.forward_time = kPlanForwardTime,
                                    .backward_time = kPlanBackwardTime};
  const auto ideal = SimulateSchedules(*lists, timing);
  SimulationOptions rendezvous = timing;
  rendezvous.send_windows = windows;
  const auto mpi = SimulateSchedules(*lists, rendezvous);
  const auto plans = BuildTransferPlans(*lists);
  const auto nccl = plans.ok() ? SimulateUnderNcclRules(*plans, {.send_windows = windows})
                               : absl::StatusOr<SimulationResult>(plans.status());
  if (!ideal.ok() || !nccl.ok() || nccl->makespan != ideal->makespan) ++off_ideal;
  return absl::StrCat(Time(ideal), " / ", Time(mpi), " / ", Time(nccl));
}

int Main(int argc, char** argv) {
  int max_p = 16;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-p") == 0 && i + 1 < argc) {
      max_p = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: nf-bench-schedules [--max-p N]\n");
      return 2;
    }
  }
  std::printf(
      "| p | m | GPipe | 1F1B | interleaved v 2 | interleaved v 4 | forward-only | "
      "forward-only v 2 |\n|---|---|---|---|---|---|---|---|\n");
  int off_ideal = 0, layouts = 0;
  for (int p = 2; p <= max_p; p *= 2) {
    std::vector<int> ms = {p, 4 * p};
    if (p == 8) ms = {8, 16, 32, 64};
    for (int m : ms) {
      std::vector<std::string> cells;
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        cells.push_back(Cell(BuildAllSchedules(kind, p, m), SendWindows(kind, p), off_ideal));
      }
      for (int v : {2, 4}) {
        const ScheduleKind kind = ScheduleKind::kInterleavedOneFOneB;
        cells.push_back(Cell(BuildAllSchedules(kind, p, m, v), SendWindows(kind, p, v), off_ideal));
      }
      for (int v : {1, 2}) {
        cells.push_back(Cell(BuildAllForwardOnlySchedules(p, m, v),
                             std::vector<int>(p, kForwardOnlySendWindow), off_ideal));
      }
      layouts += static_cast<int>(cells.size());
      std::printf("| %d | %d |", p, m);
      for (const std::string& cell : cells) std::printf(" %s |", cell.c_str());
      std::printf("\n");
    }
  }
  std::printf("\n%d layouts; NCCL's rules slower than the ideal in %d\n", layouts, off_ideal);
  return off_ideal == 0 ? 0 : 1;
}

}  // namespace
}  // namespace nf::parallel

int main(int argc, char** argv) { return nf::parallel::Main(argc, argv); }
