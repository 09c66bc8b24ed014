// Maps a device to the backend that runs ops on it.
#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/ops/backend.h"

namespace nf::ops {

absl::StatusOr<Backend*> BackendFor(Device device) {
  if (device.type == DeviceType::kCpu) {
    static cpu::CpuBackend* cpu_backend = new cpu::CpuBackend();
    return cpu_backend;
  }
  return absl::UnimplementedError(absl::StrCat(
      "no backend for ", device.ToString(),
      " in this build; the CUDA backend is built with -DNF_CUDA=ON on a machine with nvcc"));
}

}  // namespace nf::ops
