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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/plan.h"

namespace nf::launcher {
namespace {

constexpr char kUsage[] =
    R"(usage: nf-plan --config FILE.pbtxt [--set field.path=value]... [options]

Lists the parallel layouts of FILE's model, batch and precision that fit the
cluster's GPUs, fastest first by a modelled step time (launcher/plan.h says how),
with their memory (the dry run's estimate) and time by part, and the --set flags
that run them with nf-launch.

options:
  --gpus-per-node N        GPUs in each node (default 8)
  --nodes N                nodes (default 1)
  --gpu h200|h100|a100     the GPU's figures, which the flags below override
                           (default h200: 141 GB, 4.8 TB/s; h100: 80 GB, 3.35 TB/s;
                           both 989 TFLOP/s dense bf16, 132 SMs, NVLink 450 GB/s per
                           direction, 50 GB/s InfiniBand per GPU; a100: 80 GB,
                           2.04 TB/s, 312 TFLOP/s, 108 SMs, NVLink 300, 25 GB/s)
  --gpu-memory-gb X        GPU memory, GB
  --peak-tflops X          dense fp16/bf16 peak per GPU
  --hbm-gbps X             GPU memory bandwidth, GB/s
  --nvlink-gbps X          NVLink GB/s per GPU and direction
  --network-gbps X         InfiniBand GB/s per GPU
  --gemm-efficiency X      share of the peak large matrix products reach (h100/h200
                           0.8, a100 0.86); smaller ones lose their last wave's idle SMs
  --attention-efficiency X share of the peak the blockwise attention kernels reach
                           (default 0.5)
  --attention KIND         blockwise (default: this project's kernels, cuDNN) or
                           materialized (the S x S scores in memory, as Megatron-LM
                           of 2021: for comparing with runs of that time)
  --latency-us X           each collective's and send's fixed cost (default 20)
  --top N                  how many layouts to print (default 5)
  --cpu                    the "GPUs" are ranks on this machine's cores: the peak is
                           the CPU GEMM rate measured now (NF_NUM_THREADS threads a
                           rank) shared when the ranks outnumber the cores
  --score                  print only the modelled step time of the layout FILE and
                           --set give, by part (bench/plan_check.sh)
)";

absl::StatusOr<double> Number(const std::string& flag, const char* value) {
  double x = 0;
  if (!absl::SimpleAtod(value, &x) || !(x > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", value, "' is not a positive number"));
  }
  return x;
}

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
  std::string config_path;
  std::vector<std::string> overrides;
  ClusterSpec cluster;
  double memory_gb = 0, peak_tflops = 0, hbm = 0, nvlink = 0, network = 0, latency_us = 0;
  double gemm_efficiency = 0, attention_efficiency = 0;
  std::string gpu = "h200";
  int top = 5;
  bool cpu = false, score = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--cpu" || flag == "--score") {
      (flag == "--cpu" ? cpu : score) = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "nf-plan: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const char* value = argv[++i];
    absl::StatusOr<double> number = 1.0;
    if (flag == "--config") {
      config_path = value;
    } else if (flag == "--set") {
      overrides.push_back(value);
    } else if (flag == "--gpu") {
      gpu = value;
    } else if (flag == "--attention") {
      const std::string kind = value;
      if (kind != "blockwise" && kind != "materialized") {
        std::fprintf(stderr, "nf-plan: --attention: '%s' is not blockwise or materialized\n",
                     value);
        return 2;
      }
      cluster.materialized_attention = kind == "materialized";
    } else if (flag == "--gpus-per-node" || flag == "--nodes" || flag == "--top") {
      int n = 0;
      if (!absl::SimpleAtoi(value, &n) || n < 1) {
        std::fprintf(stderr, "nf-plan: %s: '%s' is not a positive integer\n", flag.c_str(), value);
        return 2;
      }
      (flag == "--gpus-per-node" ? cluster.gpus_per_node
       : flag == "--nodes"       ? cluster.nodes
                                 : top) = n;
    } else if (flag == "--gpu-memory-gb" && (number = Number(flag, value)).ok()) {
      memory_gb = *number;
    } else if (flag == "--peak-tflops" && (number = Number(flag, value)).ok()) {
      peak_tflops = *number;
    } else if (flag == "--nvlink-gbps" && (number = Number(flag, value)).ok()) {
      nvlink = *number;
    } else if (flag == "--network-gbps" && (number = Number(flag, value)).ok()) {
      network = *number;
    } else if (flag == "--hbm-gbps" && (number = Number(flag, value)).ok()) {
      hbm = *number;
    } else if (flag == "--gemm-efficiency" && (number = Number(flag, value)).ok()) {
      gemm_efficiency = *number;
    } else if (flag == "--attention-efficiency" && (number = Number(flag, value)).ok()) {
      attention_efficiency = *number;
    } else if (flag == "--latency-us" && (number = Number(flag, value)).ok()) {
      latency_us = *number;
    } else {
      std::fprintf(stderr, "nf-plan: %s\n%s",
                   number.ok() ? absl::StrCat("unknown flag ", flag).c_str()
                               : std::string(number.status().message()).c_str(),
                   kUsage);
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "nf-plan: --config is required\n%s", kUsage);
    return 2;
  }
  // The preset (the last --gpu), then the figures given, whatever their order.
  if (const absl::Status known = ApplyGpuPreset(gpu, cluster); !known.ok()) {
    std::fprintf(stderr, "nf-plan: %s\n", std::string(known.message()).c_str());
    return 2;
  }
  if (memory_gb > 0) cluster.gpu_memory_bytes = memory_gb * 1e9;
  if (hbm > 0) cluster.hbm_bytes_per_second = hbm * 1e9;
  if (gemm_efficiency > 0) cluster.gemm_efficiency = gemm_efficiency;
  if (attention_efficiency > 0) cluster.attention_efficiency = attention_efficiency;
  if (peak_tflops > 0) cluster.peak_flops = peak_tflops * 1e12;
  if (nvlink > 0) cluster.nvlink_bytes_per_second = nvlink * 1e9;
  if (network > 0) cluster.network_bytes_per_second = network * 1e9;
  if (latency_us > 0) cluster.collective_latency_seconds = latency_us * 1e-6;
  if (cpu) {
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
  const absl::StatusOr<TrainConfig> config = LoadTrainConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "nf-plan: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (score) {
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
    return layouts.status().code() == absl::StatusCode::kNotFound ? 3 : 1;
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
