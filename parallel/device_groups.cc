#include "parallel/device_groups.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_context.h"
#include "core/status.h"
#include "parallel/local_communicator.h"
#include "parallel/nccl_communicator.h"

namespace nf::parallel {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> DeviceGroup(const Communicator& group, int device,
                                                          cudaStream_t compute) {
  if (group.size() == 1) return std::make_unique<LocalCommunicator>(group.name());
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&group);
  if (mpi == nullptr) {
    return absl::InternalError(absl::StrCat("device group ", group.name(), ": its ", group.size(),
                                            " ranks are not an MPI group, which NCCL needs"));
  }
  NF_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclCommunicator> nccl,
      NcclCommunicator::Create(*mpi, device, compute, {.watchdog = mpi->options().watchdog}));
  return std::unique_ptr<Communicator>(std::move(nccl));
}

}  // namespace

absl::StatusOr<DeviceGroups> CreateDeviceGroups(const ProcessGroups& groups, Device device) {
  if (device.type != DeviceType::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("device groups need a CUDA device, not ", device.ToString()));
  }
  NF_ASSIGN_OR_RETURN(cuda::CudaContext * context, cuda::CudaContext::ForDevice(device.index));
  DeviceGroups out;
  const std::pair<const std::unique_ptr<Communicator>*, std::unique_ptr<Communicator>*> kinds[] = {
      {&groups.tp, &out.tp},
      {&groups.dp, &out.dp},
      {&groups.pp, &out.pp},
      {&groups.embedding, &out.embedding}};
  for (const auto& [from, to] : kinds) {
    if (*from == nullptr) continue;
    NF_ASSIGN_OR_RETURN(*to, DeviceGroup(**from, device.index, context->stream()));
  }
  return out;
}

}  // namespace nf::parallel
