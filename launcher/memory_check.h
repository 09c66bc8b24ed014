// nf-launch's memory check: before a run allocates anything, every rank compares the memory
// estimate of its share (memory_estimate.h) with what it can have: the host memory of its
// node, which all the node's ranks share (so their estimates add up), and on train.device
// CUDA also the free memory of its GPU. A model too big for the machine is then refused at once,
// with the figures and the config fields that drive them, instead of growing until the OOM
// killer ends it without a word. nf-launch --skip-memory-check starts anyway.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "core/host_memory.h"
#include "launcher/memory_estimate.h"
#include "launcher/train_config.pb.h"
#include "parallel/process_groups.h"

namespace nf::launcher {

// What the ranks sharing one memory (a node's host memory, or one GPU) need, and what it has.
struct MemoryDemand {
  std::string memory;       // e.g. "host memory of node n1" or "cuda:0 of node n1"
  int ranks = 1;            // the ranks sharing it
  double needed_bytes = 0;  // their estimates, summed
  std::string parts;        // one rank's estimate in parts, e.g. "parameters 1.20 GiB, ..."
  AvailableMemory available;
};

// The GPU runtime's parts of a rank's estimate, for messages: "cuBLASLt workspace 0.03 GiB,
// NCCL buffers 0.57 GiB, cuDNN attention backward workspace 0.50 GiB" (the last only where
// attention runs on cuDNN).
std::string RuntimeParts(const PipelineRankMemory& r);

// OK when the demand fits, else ResourceExhausted: one line with the estimate and its parts,
// what is available and where that figure comes from, the fields to change and the override.
absl::Status CompareWithAvailable(const MemoryDemand& demand);

// The check for this rank of a job (groups: null for a job of one process, which needs no
// MPI). Collective over the world otherwise: every rank returns the same status, the refusal
// of the lowest rank that has one.
absl::Status CheckMemoryFits(const TrainConfig& config, const parallel::ProcessGroups* groups);

}  // namespace nf::launcher
