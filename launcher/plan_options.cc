#include "launcher/plan_options.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace nf::launcher {
namespace {

// A cluster figure a flag sets: the flag's value x scale is the field, in (0, max] x scale. The
// upper limits are far beyond any GPU announced (a B200: 192 GB, 2.25 PFLOP/s dense fp16, 8 TB/s,
// NVLink 5 at 900 GB/s a direction) and only keep the arithmetic finite and meaningful; the
// efficiencies are shares of a peak, so at most 1.
struct FigureFlag {
  const char* flag;
  double ClusterSpec::*field;
  double scale;  // field = value x scale
  double max;    // in the flag's unit
  const char* unit;
  bool zero_allowed = false;  // in a ClusterSpec only: 0 = not modelled (--cpu sets it)
};
constexpr FigureFlag kFigureFlags[] = {
    {"--gpu-memory-gb", &ClusterSpec::gpu_memory_bytes, 1e9, 1e5, "GB"},
    {"--peak-tflops", &ClusterSpec::peak_flops, 1e12, 1e5, "TFLOP/s"},
    {"--hbm-gbps", &ClusterSpec::hbm_bytes_per_second, 1e9, 1e6, "GB/s", true},
    {"--nvlink-gbps", &ClusterSpec::nvlink_bytes_per_second, 1e9, 1e5, "GB/s"},
    {"--network-gbps", &ClusterSpec::network_bytes_per_second, 1e9, 1e5, "GB/s"},
    {"--gemm-efficiency", &ClusterSpec::gemm_efficiency, 1, 1, ""},
    {"--attention-efficiency", &ClusterSpec::attention_efficiency, 1, 1, ""},
    {"--nvlink-efficiency", &ClusterSpec::nvlink_efficiency, 1, 1, ""},
    {"--latency-us", &ClusterSpec::collective_latency_seconds, 1e-6, 1e6, "us"},
};

// "(0, 1]" or "(0, 100000] TFLOP/s".
std::string Range(double max, const char* unit) {
  return absl::StrCat("(0, ", absl::StrFormat("%g", max), "]", *unit ? " " : "", unit);
}

absl::Status OutOfRange(const std::string& flag, const std::string& value,
                        const std::string& accepted) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": '", value, "' is out of range: ", accepted));
}

absl::StatusOr<double> ParseFigure(const FigureFlag& f, const std::string& value) {
  double x = 0;
  // SimpleAtod takes "inf" and "nan"; neither is a figure.
  if (!absl::SimpleAtod(value, &x) || !std::isfinite(x)) {
    return absl::InvalidArgumentError(absl::StrCat(f.flag, ": '", value, "' is not a number: a ",
                                                   "number in ", Range(f.max, f.unit)));
  }
  if (!(x > 0 && x <= f.max)) {
    return OutOfRange(f.flag, value, absl::StrCat("a number in ", Range(f.max, f.unit)));
  }
  return x;
}

absl::StatusOr<int> ParseCount(const std::string& flag, const std::string& value, int max) {
  int64_t n = 0;
  const std::string accepted = absl::StrCat("an integer from 1 to ", max);
  if (!absl::SimpleAtoi(value, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", value, "' is not an integer: ", accepted));
  }
  if (n < 1 || n > max) return OutOfRange(flag, value, accepted);
  return static_cast<int>(n);
}

}  // namespace

const std::string& PlanUsage() {
  static const std::string* const usage = new std::string(absl::StrFormat(
      R"(usage: nf-plan --config FILE.pbtxt [--set field.path=value]... [options]

Lists the parallel layouts of FILE's model, batch and precision that fit the
cluster's GPUs, fastest first by a modelled step time (launcher/plan.h says how),
with their memory (the dry run's estimate) and time by part, and the --set flags
that run them with nf-launch.

options (every number is checked against the range shown):
  --gpus-per-node N        GPUs in each node, 1 to %d (default 8)
  --nodes N                nodes, 1 to %d (default 1)
  --gpu h200|h100|a100     the GPU's figures, which the flags below override
                           (default h200: 141 GB, 4.8 TB/s; h100: 80 GB, 3.35 TB/s;
                           both 989 TFLOP/s dense bf16, 132 SMs, NVLink 450 GB/s per
                           direction, 50 GB/s InfiniBand per GPU; a100: 80 GB,
                           2.04 TB/s, 312 TFLOP/s, 108 SMs, NVLink 300, 25 GB/s)
  --gpu-memory-gb X        GPU memory, GB, in (0, 1e5]
  --peak-tflops X          dense fp16/bf16 peak per GPU, in (0, 1e5]
  --hbm-gbps X             GPU memory bandwidth, GB/s, in (0, 1e6]
  --nvlink-gbps X          NVLink GB/s per GPU and direction, in (0, 1e5]
  --network-gbps X         InfiniBand GB/s per GPU, in (0, 1e5]
  --gemm-efficiency X      share of the peak large matrix products reach, in (0, 1]
                           (h100/h200 0.8, a100 0.86); smaller ones lose their last
                           wave's idle SMs
  --attention-efficiency X share of the peak the blockwise attention kernels reach,
                           in (0, 1] (default 0.5)
  --attention KIND         blockwise (default: this project's kernels, cuDNN) or
                           materialized (the S x S scores in memory, as Megatron-LM
                           of 2021: for comparing with runs of that time)
  --nvlink-efficiency X    share of the NVLink line rate NCCL reaches, in (0, 1]
                           (default 0.8: its protocol's overhead)
  --latency-us X           each collective's and send's fixed cost, in (0, 1e6]
                           (default 20)
  --overlap KIND           full (default: this project's runtime, the backward's
                           tensor-parallel reductions behind its weight gradients,
                           the gradient reduction behind the last backward) or none
                           (every collective in line, as Megatron-LM of 2021)
  --top N                  how many layouts to print, 1 to %d (default 5)
  --cpu                    the "GPUs" are ranks on this machine's cores: the peak is
                           the CPU GEMM rate measured now (NF_NUM_THREADS threads a
                           rank) shared when the ranks outnumber the cores
  --score                  print only the modelled step time of the layout FILE and
                           --set give, by part (bench/plan_check.sh)

Time: the search does not grow with --nodes: it visits the tensor-parallel sizes
dividing --gpus-per-node and the heads, the pipeline sizes dividing the layers,
and 360 settings of the rest for each pair; only layouts whose data-parallel size
divides the global batch reach the memory estimate.
)",
      kMaxGpusPerNode, kMaxNodes, kMaxTop));
  return *usage;
}

absl::Status ValidateCluster(const ClusterSpec& c) {
  if (c.gpus_per_node < 1 || c.gpus_per_node > kMaxGpusPerNode) {
    return OutOfRange("--gpus-per-node", absl::StrCat(c.gpus_per_node),
                      absl::StrCat("an integer from 1 to ", kMaxGpusPerNode));
  }
  if (c.nodes < 1 || c.nodes > kMaxNodes) {
    return OutOfRange("--nodes", absl::StrCat(c.nodes),
                      absl::StrCat("an integer from 1 to ", kMaxNodes));
  }
  for (const FigureFlag& f : kFigureFlags) {
    const double x = c.*f.field / f.scale;
    if (f.zero_allowed && x == 0) continue;
    if (!(x > 0 && x <= f.max)) {  // NaN fails too
      return OutOfRange(f.flag, absl::StrFormat("%g", x),
                        absl::StrCat("a number in ", Range(f.max, f.unit)));
    }
  }
  // The figures no flag sets (a program's own ClusterSpec): shares in (0, 1], an SM count.
  for (const auto& [name, share] :
       {std::pair<const char*, double>{"memory_headroom", c.memory_headroom},
        {"memory_efficiency", c.memory_efficiency}}) {
    if (!(share > 0 && share <= 1)) {
      return OutOfRange(name, absl::StrFormat("%g", share), "a number in (0, 1]");
    }
  }
  if (c.sm_count < 0 || c.sm_count > 100000) {
    return OutOfRange("sm_count", absl::StrCat(c.sm_count),
                      "an integer from 0 (no wave quantisation) to 100000");
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanOptions> ParsePlanOptions(int argc, const char* const* argv) {
  PlanOptions options;
  std::string gpu = "h200";
  // The figures given, applied over the preset (the last --gpu) whatever their order.
  std::optional<double> figures[std::size(kFigureFlags)];
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      options.help = true;
      return options;
    }
    if (flag == "--cpu" || flag == "--score") {
      (flag == "--cpu" ? options.cpu : options.score) = true;
      continue;
    }
    const FigureFlag* figure = nullptr;
    for (const FigureFlag& f : kFigureFlags) {
      if (flag == f.flag) figure = &f;
    }
    const bool known = figure != nullptr || flag == "--config" || flag == "--set" ||
                       flag == "--gpu" || flag == "--attention" || flag == "--overlap" ||
                       flag == "--gpus-per-node" || flag == "--nodes" || flag == "--top";
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", flag, "' (nf-plan --help lists them)"));
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    }
    const std::string value = argv[++i];
    if (figure != nullptr) {
      absl::StatusOr<double> x = ParseFigure(*figure, value);
      if (!x.ok()) return x.status();
      figures[figure - kFigureFlags] = *x;
    } else if (flag == "--config") {
      options.config_path = value;
    } else if (flag == "--set") {
      options.overrides.push_back(value);
    } else if (flag == "--gpu") {
      gpu = value;
    } else if (flag == "--attention") {
      if (value != "blockwise" && value != "materialized") {
        return absl::InvalidArgumentError(
            absl::StrCat("--attention: '", value, "' is not blockwise or materialized"));
      }
      options.cluster.materialized_attention = value == "materialized";
    } else if (flag == "--overlap") {
      if (value != "full" && value != "none") {
        return absl::InvalidArgumentError(
            absl::StrCat("--overlap: '", value, "' is not full or none"));
      }
      options.cluster.overlap_communication = value == "full";
    } else {
      const int max = flag == "--gpus-per-node" ? kMaxGpusPerNode
                      : flag == "--nodes"       ? kMaxNodes
                                                : kMaxTop;
      absl::StatusOr<int> n = ParseCount(flag, value, max);
      if (!n.ok()) return n.status();
      (flag == "--gpus-per-node" ? options.cluster.gpus_per_node
       : flag == "--nodes"       ? options.cluster.nodes
                                 : options.top) = *n;
    }
  }
  if (options.config_path.empty()) {
    return absl::InvalidArgumentError("--config is required (nf-plan --help for the options)");
  }
  if (absl::Status preset = ApplyGpuPreset(gpu, options.cluster); !preset.ok()) return preset;
  for (size_t k = 0; k < std::size(kFigureFlags); ++k) {
    if (figures[k]) options.cluster.*kFigureFlags[k].field = *figures[k] * kFigureFlags[k].scale;
  }
  return options;
}

}  // namespace nf::launcher
