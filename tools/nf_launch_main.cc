// nf-launch: trains a NormFormer language model.
//
//   nf-launch --config deploy/configs/tiny.pbtxt [--set field.path=value]... --run-dir DIR
//   mpirun -np N nf-launch ...   (parallel.* says how the N ranks share the work)
//
// Exit codes: 0 finished; 1 a runtime error; 2 bad command line, configuration or run
// directory; 3 stopped early with a checkpoint saved (resume by running the same command).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "checkpoint/output_path.h"
#include "core/ops/op_timing.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "generate/training_samples.h"
#include "launcher/batch_source.h"
#include "launcher/config.h"
#include "launcher/dry_run.h"
#include "launcher/fault_injection.h"
#include "launcher/memory_check.h"
#include "launcher/run_dir_lock.h"
#include "launcher/shared_run_dir.h"
#include "launcher/stop_requests.h"
#include "launcher/train_loop.h"
#include "launcher/trainer.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"
#include "parallel/watchdog.h"

namespace {

using ::nf::parallel::LauncherRank;
using ::nf::parallel::LauncherSize;
using ::nf::parallel::PrintsSharedErrors;

constexpr char kUsage[] =
    R"(usage: nf-launch --config FILE.pbtxt [--set field.path=value]... --run-dir DIR

Trains a NormFormer language model as FILE.pbtxt (protobuf text format, schema
launcher/train_config.proto) describes, writing into DIR:
  config.pbtxt  the resolved configuration, every field written out
  log.jsonl     one JSON object per step: step, loss, ppl, lr, loss_scale,
                grad_norm, skipped, skipped_total, tokens, seconds; a skipped
                step adds skip_reason: nonfinite_grads or update_overflow

Under mpirun every rank trains its share (parallel.tensor_parallel,
parallel.pipeline_parallel; data parallelism takes the remaining ranks) and
rank 0 writes the files and the progress lines.

options:
  --config FILE      the run configuration (deploy/configs/ has examples)
  --set PATH=VALUE   override one field, e.g. --set train.optimizer.lr=6e-4
                     --set model.normformer.scale_attn=false; repeatable, applied in order
  --run-dir DIR      where the run writes its files (created if missing)
  --dry-run          print the resolved configuration, the layout, FLOPs per step and
                     per pipeline rank the parameters and memory (parameters, gradients,
                     optimizer state, activations), then exit; refuses a layout that
                     cannot run with the reason (--run-dir not needed)
  --world-size N     the number of ranks --dry-run plans for (default: mpirun's, else
                     tensor_parallel x pipeline_parallel x data_parallel)
  --skip-memory-check  start even when --dry-run's memory estimate for a rank's share
                     exceeds what its node (CPU; the node's ranks together) or its GPU has
                     available, which nf-launch otherwise refuses with exit code 2
  --help             this text

The Pre-LN GPT baseline of any config: --set model.normformer.scale_attn=false
  --set model.normformer.scale_heads=false --set model.normformer.scale_fc=false
  --set model.normformer.scale_resids=false

Stopping early: SIGTERM or SIGUSR1 (e.g. Slurm's --signal), train.exit_duration_mins or
train.exit_interval make every rank stop at the next step boundary, save a checkpoint and
exit with code 3; running the same command again resumes from RUN/checkpoints/latest.
Non-finite gradients, and updates that would overflow the model dtype (fp16: a weight
past 65504, e.g. from too large an lr), skip the step without changing anything and stop
the run (fp16: after train.max_consecutive_skipped in a row) without saving, so the last
checkpoint stays the last good state.

NF_OP_TIMING=1 times every op (CUDA events on a GPU) and prints rank 0's time per op at
the end of the run.

exit codes: 0 done, 1 runtime error, 2 bad command line, configuration or run directory
(unwritable, or in use by another nf-launch), 3 stopped early with a checkpoint: run the
same command to resume
)";

// Rank 0 alone holds the run directory (the others never write in it), checked only once every
// refusal of the config is behind it and taken by the training once its resume has loaded: a
// refused launch leaves nothing in the run directory.
absl::StatusOr<std::optional<nf::launcher::RunDirLock>> HoldRunDirectory(
    const std::string& run_dir) {
  if (LauncherRank() > 0) return std::nullopt;
  NF_ASSIGN_OR_RETURN(nf::launcher::RunDirLock lock, nf::launcher::RunDirLock::Check(run_dir));
  return std::optional<nf::launcher::RunDirLock>(std::move(lock));
}

int ExitCode(nf::launcher::RunEnd end) {
  return end == nf::launcher::RunEnd::kFinished ? 0 : nf::launcher::kExitResume;
}

// The environment variables that steer a run: a misspelt value is refused, not ignored.
absl::Status CheckEnvironment() {
  NF_RETURN_IF_ERROR(nf::ops::CheckOpTimingEnvironment());
  return nf::ThreadPool::CheckEnvironment();
}

int UsageError(const std::string& message) {
  if (PrintsSharedErrors()) {
    std::cerr << "nf-launch: " << message << "\n(run nf-launch --help for usage)\n";
  }
  return 2;
}

}  // namespace

int Run(int argc, char** argv) {
  // First of all: a scheduler's SIGTERM/SIGUSR1 that arrives while the job is still starting
  // must stop it at its first step boundary, not kill it.
  nf::launcher::InstallStopSignalHandlers();
  std::string config_path, run_dir;
  bool dry_run = false;
  bool check_memory = true;
  int world_size = 0;  // --dry-run only; 0: the launcher's, else tp x pp x max(dp, 1)
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--dry-run") {
      dry_run = true;
      continue;
    }
    if (arg == "--skip-memory-check") {
      check_memory = false;
      continue;
    }
    const bool takes_value =
        arg == "--config" || arg == "--set" || arg == "--run-dir" || arg == "--world-size";
    if (!takes_value) return UsageError("unknown argument '" + arg + "'");
    if (i + 1 >= argc) return UsageError(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--config") config_path = value;
    if (arg == "--set") overrides.push_back(value);
    if (arg == "--run-dir") run_dir = value;
    if (arg == "--world-size" && (!absl::SimpleAtoi(value, &world_size) || world_size < 1)) {
      return UsageError("--world-size takes a positive integer, not '" + value + "'");
    }
  }
  if (config_path.empty()) return UsageError("--config is required");
  if (const absl::Status environment = CheckEnvironment(); !environment.ok()) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << environment.message() << "\n";
    return 2;
  }
  if (run_dir.empty() && !dry_run) return UsageError("--run-dir is required");
  if (!dry_run) {
    if (const absl::Status outside = nf::checkpoint::CheckOutsideCheckpoints(run_dir, "--run-dir");
        !outside.ok()) {
      if (PrintsSharedErrors()) std::cerr << "nf-launch: " << outside.message() << "\n";
      return 2;
    }
  }

  const auto config = nf::launcher::LoadTrainConfig(config_path, overrides);
  if (!config.ok()) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << config.status().message() << "\n";
    return 2;
  }
  // The fault-injection variables against this run: before the run directory is touched.
  if (const absl::Status injected =
          nf::launcher::CheckFaultInjection(*config, std::max(1, LauncherSize()));
      !injected.ok() && !dry_run) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << injected.message() << "\n";
    return 2;
  }
  if (const absl::Status data = nf::launcher::CheckDataFilesExist(*config); !data.ok()) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << data.message() << "\n";
    return 2;
  }
  if (const absl::Status device = nf::launcher::CheckDeviceAvailable(config->train());
      !device.ok() && !dry_run) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << device.message() << "\n";
    return 2;
  }
  if (dry_run) {
    const nf::parallel::ParallelSizes sizes = nf::launcher::ParallelSizesOf(config->parallel());
    if (world_size == 0) world_size = LauncherSize();
    if (world_size == 0) world_size = sizes.tp * sizes.pp * std::max(sizes.dp, 1);
    if (!PrintsSharedErrors()) return 0;  // under mpirun, rank 0 alone reports
    const absl::Status status = nf::launcher::DryRun(*config, world_size, std::cout);
    if (!status.ok()) {
      std::cerr << "nf-launch: " << status.message() << "\n";
      return 2;
    }
    return 0;
  }
  // train.samples: its prompts tokenized, and rank 0's decoder started, before MPI starts.
  const auto samples =
      nf::generate::TrainingSamples::Prepare(*config, run_dir, PrintsSharedErrors());
  if (!samples.ok()) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << samples.status().message() << "\n";
    return samples.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  nf::launcher::AfterValidation after_validation;
  if (*samples) {
    after_validation = [&samples](int64_t step, nf::launcher::Trainer& trainer) {
      return (*samples)->Write(step, trainer);
    };
  }
  const nf::parallel::ParallelSizes sizes = nf::launcher::ParallelSizesOf(config->parallel());
  if (LauncherRank() < 0) {
    const int needed = sizes.tp * sizes.pp * std::max(sizes.dp, 1);
    if (needed > 1) {
      std::cerr << "nf-launch: parallel.tensor_parallel " << sizes.tp
                << " x parallel.pipeline_parallel " << sizes.pp << " x parallel.data_parallel "
                << std::max(sizes.dp, 1) << " needs " << needed << " ranks: run mpirun -np "
                << needed << " nf-launch ...\n";
      return 2;
    }
    if (check_memory) {
      if (const absl::Status memory = nf::launcher::CheckMemoryFits(*config, nullptr);
          !memory.ok()) {
        std::cerr << "nf-launch: " << memory.message() << "\n";
        return 2;
      }
    }
    auto lock = HoldRunDirectory(run_dir);
    if (!lock.ok()) {
      std::cerr << "nf-launch: " << lock.status().message() << "\n";
      return 2;
    }
    const auto end =
        nf::launcher::RunTraining(*config, run_dir, std::cout, nullptr, after_validation, &**lock);
    if (!end.ok()) {
      std::cerr << "nf-launch: " << end.status().message() << "\n";
      return 1;
    }
    return ExitCode(*end);
  }
  auto groups = nf::parallel::CreateProcessGroups(
      sizes,
      {.watchdog = {.timeout = absl::Seconds(config->parallel().collective_timeout_seconds())}});
  if (!groups.ok()) {  // refused alike on every rank, before any communication
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << groups.status().message() << "\n";
    return 2;
  }
  // The global batch over the data-parallel size the world left: a config error, the same on
  // every rank, so said once and refused like the others (not a failure of every rank's run).
  if (const auto micro_batches =
          nf::launcher::MicroBatchesPerRank(config->train(), groups->topology.dp());
      !micro_batches.ok()) {
    if (PrintsSharedErrors()) {
      std::cerr << "nf-launch: " << micro_batches.status().message() << "\n";
    }
    return 2;
  }
  if (check_memory) {
    if (const absl::Status memory = nf::launcher::CheckMemoryFits(*config, &*groups);
        !memory.ok()) {
      if (PrintsSharedErrors()) std::cerr << "nf-launch: " << memory.message() << "\n";
      return 2;
    }
  }
  auto lock = HoldRunDirectory(run_dir);
  if (!lock.ok()) {
    // Rank 0 alone knows: the others are already on their way into the run's first collective.
    std::cerr << "nf-launch: " << lock.status().message() << "\n";
    nf::parallel::AbortJob(2);
  }
  if (const absl::Status shared =
          nf::launcher::CheckRunDirectoryShared(run_dir, *groups->world, groups->hosts);
      !shared.ok()) {  // the same error on every rank
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << shared.message() << "\n";
    return 1;
  }
  const auto end = nf::launcher::RunTraining(*config, run_dir, std::cout, &*groups,
                                             after_validation, *lock ? &**lock : nullptr);
  if (!end.ok()) {
    // Other ranks may be waiting on this one: end the whole job.
    std::cerr << "nf-launch: " << groups->topology.ToString() << ": " << end.status().message()
              << "\n";
    nf::parallel::AbortJob(1);
  }
  return ExitCode(*end);
}

int main(int argc, char** argv) {
  return nf::parallel::RunCatchingExceptions("nf-launch", Run, argc, argv);
}
