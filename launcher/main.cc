// nf-launch: trains a NormFormer language model.
//
//   nf-launch --config deploy/configs/tiny.pbtxt [--set field.path=value]... --run-dir DIR
//   mpirun -np N nf-launch ...   (parallel.* says how the N ranks share the work)
//
// Exit codes: 0 finished; 1 a runtime error; 2 bad command line or configuration.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "launcher/config.h"
#include "launcher/train_loop.h"
#include "launcher/trainer.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"
#include "parallel/watchdog.h"

namespace {

constexpr char kUsage[] =
    R"(usage: nf-launch --config FILE.pbtxt [--set field.path=value]... --run-dir DIR

Trains a NormFormer language model as FILE.pbtxt (protobuf text format, schema
launcher/train_config.proto) describes, writing into DIR:
  config.pbtxt  the resolved configuration, every field written out
  log.jsonl     one JSON object per step: step, loss, ppl, lr, loss_scale,
                grad_norm, skipped, skipped_total, tokens, seconds

Under mpirun every rank trains its share (parallel.tensor_parallel,
parallel.pipeline_parallel; data parallelism takes the remaining ranks) and
rank 0 writes the files and the progress lines.

options:
  --config FILE      the run configuration (deploy/configs/ has examples)
  --set PATH=VALUE   override one field, e.g. --set train.optimizer.lr=6e-4
                     --set model.normformer.scale_attn=false; repeatable, applied in order
  --run-dir DIR      where the run writes its files (created if missing)
  --help             this text

The Pre-LN GPT baseline of any config: --set model.normformer.scale_attn=false
  --set model.normformer.scale_heads=false --set model.normformer.scale_fc=false
  --set model.normformer.scale_resids=false

exit codes: 0 done, 1 runtime error, 2 bad command line or configuration
)";

// This process's rank as an MPI launcher (mpirun, srun with PMI/PMIx) announces it before MPI
// starts; -1 when no launcher started it.
int LauncherRank() {
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(variable)) return std::atoi(value);
  }
  return -1;
}

// Errors every rank hits alike (command line, configuration) are printed by rank 0 only.
bool PrintsSharedErrors() { return LauncherRank() <= 0; }

int UsageError(const std::string& message) {
  if (PrintsSharedErrors()) {
    std::cerr << "nf-launch: " << message << "\n(run nf-launch --help for usage)\n";
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, run_dir;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    const bool takes_value = arg == "--config" || arg == "--set" || arg == "--run-dir";
    if (!takes_value) return UsageError("unknown argument '" + arg + "'");
    if (i + 1 >= argc) return UsageError(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--config") config_path = value;
    if (arg == "--set") overrides.push_back(value);
    if (arg == "--run-dir") run_dir = value;
  }
  if (config_path.empty()) return UsageError("--config is required");
  if (run_dir.empty()) return UsageError("--run-dir is required");

  const auto config = nf::launcher::LoadTrainConfig(config_path, overrides);
  if (!config.ok()) {
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << config.status().message() << "\n";
    return 2;
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
    const absl::Status status = nf::launcher::RunTraining(*config, run_dir, std::cout);
    if (!status.ok()) {
      std::cerr << "nf-launch: " << status.message() << "\n";
      return 1;
    }
    return 0;
  }
  auto groups = nf::parallel::CreateProcessGroups(
      sizes,
      {.watchdog = {.timeout = absl::Seconds(config->parallel().collective_timeout_seconds())}});
  if (!groups.ok()) {  // refused alike on every rank, before any communication
    if (PrintsSharedErrors()) std::cerr << "nf-launch: " << groups.status().message() << "\n";
    return 2;
  }
  const absl::Status status = nf::launcher::RunTraining(*config, run_dir, std::cout, &*groups);
  if (!status.ok()) {
    // Other ranks may be waiting on this one: end the whole job.
    std::cerr << "nf-launch: " << groups->topology.ToString() << ": " << status.message() << "\n";
    nf::parallel::AbortJob(1);
  }
  return 0;
}
