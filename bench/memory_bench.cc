// nf-bench-memory: the memory estimate (nf-launch --dry-run, launcher/memory_estimate.h) of one
// layout against what the CPU allocator actually hands out, under mpirun. Each rank prints one
// row: the bytes its Trainer holds once created (parameters, gradients, optimizer state, the
// models' buffers, the data) next to the estimate's parameters + gradients + optimizer +
// buffers; the growth of the allocator's peak during the first training step (the activations
// of the micro-batches in flight, pooled for the later steps, and every temporary) next to the
// estimate's activations; and the two summed (the rank's peak) next to the estimate's device
// total. Allocator counts are exact and deterministic, so the comparison is too;
// bench/memory_layouts.sh runs it over a grid of layouts (docs/memory.md).
//
//   mpirun -np 4 build/bench/nf-bench-memory --config deploy/configs/tiny.pbtxt
//       --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true
//       [--max-error 0.1]
//
// --max-error E fails the run when a rank's |peak - estimated total| / estimated total exceeds
// E (a fraction).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/allocator_usage.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/memory_estimate.h"
#include "launcher/trainer.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"

namespace nf::bench {
namespace {

double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }

absl::Status Run(int argc, char** argv) {
  std::string config_path = "deploy/configs/tiny.pbtxt";
  std::vector<std::string> overrides;
  double max_error = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--config") {
      config_path = value;
    } else if (flag == "--set") {
      overrides.push_back(value);
    } else if (flag == "--max-error") {
      if (!absl::SimpleAtod(value, &max_error) || max_error < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--max-error: '", value, "' is not a fraction >= 0"));
      }
    } else {
      return absl::InvalidArgumentError("unknown flag " + flag);
    }
  }
  NF_ASSIGN_OR_RETURN(const launcher::TrainConfig config,
                      launcher::LoadTrainConfig(config_path, overrides));
  NF_ASSIGN_OR_RETURN(parallel::ProcessGroups groups,
                      parallel::CreateProcessGroups(launcher::ParallelSizesOf(config.parallel()),
                                                    {.watchdog = {.timeout = absl::Seconds(120)}}));
  const parallel::Topology& topology = groups.topology;
  NF_ASSIGN_OR_RETURN(const std::vector<launcher::PipelineRankMemory> estimates,
                      launcher::EstimateMemory(config, topology.world_size()));
  const launcher::PipelineRankMemory& estimate = estimates[topology.pp_rank()];

  const int64_t before = CpuAllocatorUsage().live_bytes;
  NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                      launcher::Trainer::Create(config, groups));
  const int64_t created = CpuAllocatorUsage().live_bytes;
  ResetCpuAllocatorPeak();
  NF_RETURN_IF_ERROR(trainer->TrainStep().status());
  const int64_t step_growth = CpuAllocatorUsage().peak_bytes - created;

  const double static_estimate = estimate.parameter_bytes + estimate.gradient_bytes +
                                 estimate.optimizer_bytes + estimate.buffer_bytes;
  const int64_t resident = created - before, peak = resident + step_growth;
  const double error =
      (static_cast<double>(peak) - estimate.device_bytes()) / estimate.device_bytes();
  const launcher::ParallelConfig& parallel = config.parallel();
  const std::string row = absl::StrFormat(
      "| %d | %d | %d%s | %s | %s | %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | "
      "%+.1f%% |",
      topology.tp(), topology.pp(), topology.dp(),
      parallel.distributed_optimizer() ? " ZeRO-1" : "",
      parallel.sequence_parallel() && topology.tp() > 1 ? "SP" : "-",
      launcher::TrainOptions::Recompute_Name(config.train().activation_recompute()
                                                 ? launcher::TrainOptions::FULL
                                                 : config.train().recompute()),
      config.train().micro_batch_size(), estimate.peak_in_flight, topology.world_rank(),
      MiB(static_estimate), MiB(static_cast<double>(resident)), MiB(estimate.activation_bytes),
      MiB(static_cast<double>(step_growth)), MiB(estimate.device_bytes()),
      MiB(static_cast<double>(peak)), 100 * error);
  for (int r = 0; r < topology.world_size(); ++r) {
    NF_RETURN_IF_ERROR(groups.world->Barrier());
    if (r == topology.world_rank()) {
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
    }
  }
  if (max_error >= 0 && std::abs(error) > max_error) {
    return absl::InternalError(absl::StrFormat(
        "rank %d: its allocations peaked at %.2f MiB, %+.1f%% off the estimated %.2f MiB, more "
        "than --max-error %.1f%%",
        topology.world_rank(), MiB(static_cast<double>(peak)), 100 * error,
        MiB(estimate.device_bytes()), 100 * max_error));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  const absl::Status status = nf::bench::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-memory: %s\n", std::string(status.message()).c_str());
    nf::parallel::AbortJob(1);
  }
  return 0;
}
