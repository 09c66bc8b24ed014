// The communicators for device tensors of one rank of a multi-process GPU job. The process
// groups (process_groups.h) stay MPI and keep carrying host values (loss sums, the non-finite
// flag, squared norms, stop requests, checkpoint coordination); what lives on the GPU goes over
// NCCL communicators made from the same MPI groups:
//   tp          activations and their gradients inside the layers (vocab-parallel loss too)
//   dp          gradient buckets (all-reduce, or ZeRO-1's reduce-scatter and all-gather)
//   pp          the pipeline executor's activations and gradients, Evaluate's activations
//   embedding   the tied embedding's gradients (first and last pipeline stage)
// A group of one rank is a LocalCommunicator of the same name: NCCL is not needed for it.
#pragma once

#include <memory>

#include "core/device.h"
#include "parallel/communicator.h"
#include "parallel/process_groups.h"

namespace nf::parallel {

struct DeviceGroups {
  std::unique_ptr<Communicator> tp, dp, pp;
  std::unique_ptr<Communicator> embedding;  // null on middle pipeline stages, as in the groups
};

#if NF_WITH_CUDA
// NCCL communicators over `groups`' tp, dp, pp and embedding groups for tensors on `device` (a
// CUDA device), ordered after that device's compute stream (core/cuda/cuda_context.h), under
// each MPI group's watchdog options. Collective over the world: every rank creates its groups
// in the same order (tp, dp, pp, embedding), each NcclCommunicator::Create collective over its
// group, so a rank that cannot set up its device makes every member of its groups fail.
// Library nf_parallel_nccl (CUDA builds only).
absl::StatusOr<DeviceGroups> CreateDeviceGroups(const ProcessGroups& groups, Device device);
#endif

}  // namespace nf::parallel
