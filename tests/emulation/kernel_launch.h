// The emulated build's side of core/cuda/launch.cuh: a kernel launch becomes a KernelLaunch
// submitted to the emulated runtime, which checks CUDA's launch limits at once (the error is
// what cudaGetLastError returns after the launch) and runs the grid when its stream reaches it.
//
// The kernel's parameters are converted to its parameter types and copied, as CUDA copies them
// at the launch. Every pointer parameter is recorded with whether the kernel may write through
// it (a pointer to non-const): the runtime checks that it points into memory the device can
// reach and tracks which stream reads and writes each allocation (streams.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/emulation/kernel_threads.h"

namespace nf::emu {

struct PointerParam {
  const void* address;
  bool written;  // a pointer to non-const: the kernel may write through it
};

struct KernelLaunch {
  LaunchSite site;
  const void* function = nullptr;  // the kernel (cudaFuncSetAttribute's key)
  dim3 grid, block;
  size_t dynamic_shared_bytes = 0;
  cudaStream_t stream = nullptr;
  KernelBody body;
  std::vector<PointerParam> pointers;
};

// Checks the launch and queues it on its stream; the result is also the thread's last error.
cudaError_t SubmitKernel(KernelLaunch launch);

template <auto Kernel>
std::string KernelName() {
  // "... [with auto Kernel = nf::cuda::{anonymous}::AddBiasKernel<float, float>; ...]"
  const std::string_view pretty = __PRETTY_FUNCTION__;
  const size_t start = pretty.find("Kernel = ") + 9;
  size_t end = pretty.find(';', start);
  if (end == std::string_view::npos) end = pretty.rfind(']');
  return std::string(pretty.substr(start, end - start));
}

template <typename F>
struct KernelParams;
template <typename... P>
struct KernelParams<void (*)(P...)> {
  using Tuple = std::tuple<std::decay_t<P>...>;
};

template <auto Kernel, typename Tuple>
void CallKernel(const void* params) {
  std::apply(Kernel, *static_cast<const Tuple*>(params));
}

template <typename P>
void RecordPointer(const P& param, std::vector<PointerParam>& pointers) {
  if constexpr (std::is_pointer_v<P>) {
    using Pointee = std::remove_pointer_t<P>;
    pointers.push_back({static_cast<const void*>(param), !std::is_const_v<Pointee>});
  }
}

}  // namespace nf::emu

// What launch.cuh's Launch<Kernel>(shape, args...) calls in the emulated build.
template <auto Kernel, typename... Args>
void NfEmulatedLaunch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                      std::source_location where, Args&&... args) {
  using Tuple = typename nf::emu::KernelParams<decltype(Kernel)>::Tuple;
  auto params = std::make_shared<const Tuple>(std::forward<Args>(args)...);
  nf::emu::KernelLaunch launch;
  launch.site = {nf::emu::KernelName<Kernel>(), where};
  launch.function = reinterpret_cast<const void*>(Kernel);
  launch.grid = grid;
  launch.block = block;
  launch.dynamic_shared_bytes = shared_bytes;
  launch.stream = stream;
  std::apply([&](const auto&... p) { (nf::emu::RecordPointer(p, launch.pointers), ...); }, *params);
  launch.body = {params, &nf::emu::CallKernel<Kernel, Tuple>};
  nf::emu::SubmitKernel(std::move(launch));
}
