// nf-plan: the layouts of a model on a cluster that fit in GPU memory, ranked by a modelled
// step time (launcher/plan.h), with each one's memory and time breakdown and the --set flags
// that give it to nf-launch.
//
//   nf-plan --config deploy/configs/normformer-2.7b.pbtxt --nodes 8 [--gpu h200]
//
// Exit codes: 0 printed; 2 bad command line or configuration; 3 nothing fits.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/plan.h"
#include "launcher/plan_options.h"

namespace nf::launcher {
namespace {

std::string Row(int rank, const PlannedLayout& l) {
  const ParallelConfig& p = l.config.parallel();
  return absl::StrFormat(
      "| %d | %d | %d | %d | %s | %s | %s | %d | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | "
      "%.3f | %.3f | %.0f%% |",
      rank, p.tensor_parallel(), p.pipeline_parallel(), p.virtual_stages(),
      p.distributed_optimizer() ? "yes" : "no", p.sequence_parallel() ? "yes" : "no",
      TrainOptions::Recompute_Name(l.config.train().recompute()),
      l.config.train().micro_batch_size(), l.peak_device_bytes / 1e9, l.time.total(),
      l.time.compute, l.time.optimizer, l.time.bubble, l.time.tp, l.time.dp, l.time.dp_hidden,
      l.time.pp, 100 * l.mfu);
}

int Main(int argc, char** argv) {
  // Every refusal is one line naming the flag and what it accepts (plan_options.h).
  const absl::StatusOr<PlanOptions> options = ParsePlanOptions(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "nf-plan: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(PlanUsage().c_str(), stdout);
    return 0;
  }
  ClusterSpec cluster = options->cluster;
  const int top = options->top;
  if (options->cpu) {
    const absl::StatusOr<double> gemm = MeasureGemmFlops(Device::Cpu(), DType::kF32);
    if (!gemm.ok()) {
      std::fprintf(stderr, "nf-plan: %s\n", std::string(gemm.status().message()).c_str());
      return 1;
    }
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    cluster.peak_flops = *gemm * std::min(1.0, cores / cluster.world_size());
    // A CPU's products and attention run at the GEMM rate; no SM waves, and the memory-bound
    // work is not modelled.
    cluster.attention_efficiency = cluster.gemm_efficiency;
    cluster.sm_count = 0;
    cluster.hbm_bytes_per_second = 0;
  }
  const absl::StatusOr<TrainConfig> config =
      LoadTrainConfig(options->config_path, options->overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "nf-plan: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (options->score) {
    const absl::StatusOr<StepTime> time = ModelStepTime(*config, cluster);
    if (!time.ok()) {
      std::fprintf(stderr, "nf-plan: %s\n", std::string(time.status().message()).c_str());
      return 2;
    }
    std::printf(
        "modelled step s: %.6f (compute %.6f, optimizer %.6f, bubble %.6f, tp %.6f, dp %.6f, pp "
        "%.6f; dp hidden behind the backward %.6f; peak %.3g FLOP/s a GPU)\n",
        time->total(), time->compute, time->optimizer, time->bubble, time->tp, time->dp, time->pp,
        time->dp_hidden, cluster.peak_flops);
    return 0;
  }
  const absl::StatusOr<std::vector<PlannedLayout>> layouts = PlanLayouts(*config, cluster);
  if (!layouts.ok()) {
    std::fprintf(stderr, "nf-plan: %s\n", std::string(layouts.status().message()).c_str());
    return layouts.status().code() == absl::StatusCode::kNotFound ? 3 : 2;
  }
  const TrainOptions& train = config->train();
  std::printf(
      "%d GPUs (%d nodes x %d), %.0f GB each (%.0f%% planned), %.0f TFLOP/s peak (large GEMMs "
      "at %.0f%%, attention at %.0f%%), HBM %.2f TB/s, NVLink %.0f GB/s, network %.0f GB/s per "
      "GPU; global batch %d x %d tokens, %s; %zu layouts fit\n\n",
      cluster.world_size(), cluster.nodes, cluster.gpus_per_node, cluster.gpu_memory_bytes / 1e9,
      100 * cluster.memory_headroom, cluster.peak_flops / 1e12, 100 * cluster.gemm_efficiency,
      100 * cluster.attention_efficiency, cluster.hbm_bytes_per_second / 1e12,
      cluster.nvlink_bytes_per_second / 1e9, cluster.network_bytes_per_second / 1e9,
      train.global_batch_size(), train.seq_len(),
      TrainOptions::Precision_Name(train.precision()).c_str(), layouts->size());
  std::printf(
      "| # | tp | pp | v | ZeRO-1 | SP | recompute | micro-batch | GB (fullest GPU) | step s | "
      "compute | optimizer | bubble | tp comm | dp comm | dp hidden | pp comm | MFU |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const int shown = std::min<int>(top, static_cast<int>(layouts->size()));
  for (int k = 0; k < shown; ++k) std::printf("%s\n", Row(k + 1, (*layouts)[k]).c_str());
  std::printf("\n");
  for (int k = 0; k < shown; ++k) {
    std::printf("#%d: --set %s\n", k + 1,
                absl::StrJoin((*layouts)[k].overrides, " --set ").c_str());
  }
  return 0;
}

}  // namespace
}  // namespace nf::launcher

int main(int argc, char** argv) { return nf::launcher::Main(argc, argv); }
