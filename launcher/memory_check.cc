#include "launcher/memory_check.h"

#include <iostream>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/ops/backend.h"
#include "core/status.h"
#include "launcher/memory_estimate.h"
#include "launcher/trainer.h"
#include "parallel/agreement.h"
#include "parallel/placement.h"

namespace nf::launcher {
namespace {

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

// This rank's estimate from its pipeline rank's (tp 0, dp 0) row, which overstates the other
// data-parallel ranks' snapshots: dp rank 0 alone writes the parameters, and without ZeRO-1
// the optimizer state too.
PipelineRankMemory ThisRank(PipelineRankMemory row, const TrainConfig& config,
                            const parallel::Topology& topology) {
  if (topology.dp_rank() != 0) {
    row.snapshot_bytes =
        config.parallel().distributed_optimizer() ? row.snapshot_bytes - row.parameter_bytes : 0;
  }
  return row;
}

// Host memory, shared by the node's ranks: their estimates add up, and the tightest reading of
// what is available counts. Collective over `node` when there is one.
absl::StatusOr<MemoryDemand> HostDemand(double needed, std::string parts,
                                        parallel::Communicator* node) {
  MemoryDemand demand{.memory = absl::StrCat("host memory of node ", parallel::ThisHostName()),
                      .ranks = 1,
                      .needed_bytes = needed,
                      .parts = std::move(parts),
                      .available = {}};
  absl::StatusOr<AvailableMemory> available = AvailableHostMemory();
  if (!available.ok()) {
    // Not knowing is no reason to refuse a run: say so, and let it start.
    std::cerr << "nf-launch: warning: the memory check is skipped: " << available.status().message()
              << "\n";
    available = AvailableMemory{.bytes = std::numeric_limits<int64_t>::max(), .source = ""};
  }
  demand.available = *std::move(available);
  if (node == nullptr) return demand;
  NF_ASSIGN_OR_RETURN(const Tensor sum, Tensor::HostZeros(DType::kF64, {1}));
  NF_ASSIGN_OR_RETURN(const Tensor least, Tensor::HostZeros(DType::kF64, {1}));
  *sum.data<double>() = demand.needed_bytes;
  *least.data<double>() = -static_cast<double>(demand.available.bytes);  // max of -x: min of x
  NF_RETURN_IF_ERROR(node->AllReduce(sum, parallel::ReduceOp::kSum));
  NF_RETURN_IF_ERROR(node->AllReduce(least, parallel::ReduceOp::kMax));
  demand.ranks = node->size();
  demand.needed_bytes = *sum.data<double>();
  demand.available.bytes = static_cast<int64_t>(-*least.data<double>());
  return demand;
}

// A GPU's memory: one rank per GPU (TrainingDevice refuses two), so nothing to add up.
absl::StatusOr<MemoryDemand> DeviceDemand(double needed, std::string parts, Device device) {
  NF_ASSIGN_OR_RETURN(const int64_t free_bytes, ops::FreeGpuMemory(device.index));
  return MemoryDemand{
      .memory = absl::StrCat(device.ToString(), " of node ", parallel::ThisHostName()),
      .ranks = 1,
      .needed_bytes = needed,
      .parts = std::move(parts),
      .available = {.bytes = free_bytes, .source = "the free memory cudaMemGetInfo reports"}};
}

}  // namespace

std::string RuntimeParts(const PipelineRankMemory& r) {
  std::string parts = absl::StrCat("cuBLASLt workspace ", Gib(r.gemm_workspace_bytes),
                                   ", NCCL buffers ", Gib(r.nccl_buffer_bytes));
  if (r.attention_workspace_bytes > 0) {
    absl::StrAppend(&parts, ", cuDNN attention backward workspace ",
                    Gib(r.attention_workspace_bytes));
  }
  return parts;
}

namespace {

// This rank's verdict: OK, a refusal, or an error finding out (a GPU that cannot be asked).
// Collective over `node` when there is one, whatever happens on the way.
absl::Status CheckThisRank(const TrainConfig& config, const PipelineRankMemory& r,
                           parallel::Communicator* node) {
  const std::string device_parts = absl::StrCat(
      "parameters ", Gib(r.parameter_bytes), ", gradients ", Gib(r.gradient_bytes), ", optimizer ",
      Gib(r.optimizer_bytes), ", activations ", Gib(r.activation_bytes));
  std::string host_parts = absl::StrCat("checkpoint snapshot ", Gib(r.snapshot_bytes));
  if (r.sample_index_bytes > 0) {
    absl::StrAppend(&host_parts, ", sample index ", Gib(r.sample_index_bytes),
                    " (train.train_iters x train.global_batch_size samples)");
  }
  absl::StrAppend(&host_parts, ", flight recorder ", Gib(r.flight_recorder_bytes));
  if (config.train().device() == TrainOptions::CPU) {
    NF_ASSIGN_OR_RETURN(
        const MemoryDemand host,
        HostDemand(r.cpu_total_bytes(), absl::StrCat(device_parts, ", ", host_parts), node));
    return CompareWithAvailable(host);
  }
  NF_ASSIGN_OR_RETURN(
      const MemoryDemand host,
      HostDemand(r.gpu_host_bytes(),
                 absl::StrCat(host_parts, " (the snapshot twice during a save)"), node));
  NF_RETURN_IF_ERROR(CompareWithAvailable(host));
  NF_ASSIGN_OR_RETURN(const Device device, TrainingDevice(config.train()));
  NF_ASSIGN_OR_RETURN(const MemoryDemand gpu,
                      DeviceDemand(r.device_bytes(),
                                   absl::StrCat(device_parts, ", buffers ", Gib(r.buffer_bytes),
                                                ", ", RuntimeParts(r)),
                                   device));
  return CompareWithAvailable(gpu);
}

}  // namespace

absl::Status CompareWithAvailable(const MemoryDemand& demand) {
  if (demand.needed_bytes <= static_cast<double>(demand.available.bytes)) {
    return absl::OkStatus();
  }
  const std::string who = demand.ranks == 1
                              ? "this rank needs"
                              : absl::StrCat("the ", demand.ranks, " ranks of this run on it need");
  return absl::ResourceExhaustedError(absl::StrCat(
      "not enough ", demand.memory, ": ", who, " an estimated ", Gib(demand.needed_bytes),
      " (one rank: ", demand.parts, "; --dry-run shows every pipeline rank) but ",
      Gib(demand.available.bytes), " is available (", demand.available.source,
      "). The parameters grow with model.d_model, model.ffn_dim, model.num_layers and "
      "model.vocab_size, the activations with train.micro_batch_size x train.seq_len; "
      "parallel.tensor_parallel, parallel.pipeline_parallel, parallel.distributed_optimizer, "
      "parallel.sequence_parallel and train.recompute (SELECTIVE, FULL) share or shrink them",
      demand.ranks > 1 ? ", and fewer ranks per node share the host's memory" : "",
      ". nf-launch --skip-memory-check starts anyway"));
}

absl::Status CheckMemoryFits(const TrainConfig& config, const parallel::ProcessGroups* groups) {
  NF_ASSIGN_OR_RETURN(const parallel::Topology topology,
                      groups
                          ? absl::StatusOr<parallel::Topology>(groups->topology)
                          : parallel::Topology::Create(1, 0, ParallelSizesOf(config.parallel())));
  // The same on every rank: a layout the estimate refuses is refused alike everywhere.
  NF_ASSIGN_OR_RETURN(const std::vector<PipelineRankMemory> rows,
                      EstimateMemory(config, topology.world_size()));
  const PipelineRankMemory mine = ThisRank(rows[topology.pp_rank()], config, topology);
  if (groups == nullptr) return CheckThisRank(config, mine, nullptr);
  NF_ASSIGN_OR_RETURN(const std::unique_ptr<parallel::MpiCommunicator> node,
                      parallel::CreateNodeGroup(
                          {.watchdog = {.timeout = absl::Seconds(
                                            config.parallel().collective_timeout_seconds())}}));
  return parallel::LowestRankError(CheckThisRank(config, mine, node.get()), *groups->world);
}

}  // namespace nf::launcher
