// The CUDA runtime API on the emulated GPUs: the functions normformer calls, defined against
// CUDA's own cuda_runtime_api.h (so their signatures are the real ones), with the error codes
// the real runtime returns. Every call sets the calling thread's last error when it fails
// (cudaGetLastError returns and clears it); a device's sticky error is returned by every call
// that touches the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/emulation/devices.h"
#include "tests/emulation/emulator.h"
#include "tests/emulation/kernel_launch.h"
#include "tests/emulation/streams.h"

namespace nf::emu {
namespace {

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t Note(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

bool ValidDevice(int device) { return device >= 0 && device < VisibleDeviceCount(); }

// The dynamic shared memory each kernel opted into (cudaFuncSetAttribute).
std::mutex attributes_mutex;
std::map<const void*, int>& MaxDynamicShared() {
  static auto* map = new std::map<const void*, int>();
  return *map;
}

constexpr size_t kDefaultSharedBytes = 48 << 10;
constexpr size_t kOptInSharedBytes = 227 << 10;  // sm_90

std::string Report(const KernelLaunch& launch, const std::string& what) {
  return absl::StrCat("kernel ", launch.site.kernel, " launched at ",
                      SourcePlace(launch.site.where), ": ", what);
}

cudaError_t RefuseLaunch(const KernelLaunch& launch, cudaError_t error, const std::string& why) {
  std::fprintf(stderr, "nf-emu: %s\n", Report(launch, why).c_str());
  return Note(error);
}

// NF_EMU_KERNEL_LOG=<file>: the names of the kernels this process launched, one per line,
// appended at exit (docs/design.md's table of kernels covered is made from them).
class KernelLog {
 public:
  ~KernelLog() {
    const char* path = std::getenv("NF_EMU_KERNEL_LOG");
    if (path == nullptr || names_.empty()) return;
    if (std::FILE* file = std::fopen(path, "a")) {
      for (const std::string& name : names_) std::fprintf(file, "%s\n", name.c_str());
      std::fclose(file);
    }
  }
  void Add(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    names_.insert(name);
  }

 private:
  std::mutex mutex_;
  std::set<std::string> names_;
};
KernelLog kernel_log;

}  // namespace

cudaError_t SubmitKernel(KernelLaunch launch) {
  kernel_log.Add(launch.site.kernel);
  const dim3 b = launch.block, g = launch.grid;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    return RefuseLaunch(launch, cudaErrorInvalidConfiguration,
                        absl::StrCat("block (", b.x, ",", b.y, ",", b.z,
                                     ") is outside CUDA's limits (1 to 1024 threads; x, y <= "
                                     "1024; z <= 64)"));
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    return RefuseLaunch(launch, cudaErrorInvalidConfiguration,
                        absl::StrCat("grid (", g.x, ",", g.y, ",", g.z,
                                     ") is outside CUDA's limits (x < 2^31; y, z <= 65535)"));
  }
  size_t shared_limit = kDefaultSharedBytes;
  {
    std::lock_guard<std::mutex> lock(attributes_mutex);
    auto it = MaxDynamicShared().find(launch.function);
    if (it != MaxDynamicShared().end()) shared_limit = static_cast<size_t>(it->second);
  }
  if (launch.dynamic_shared_bytes > shared_limit) {
    return RefuseLaunch(
        launch, cudaErrorInvalidValue,
        absl::StrCat(launch.dynamic_shared_bytes, " bytes of dynamic shared memory exceed the ",
                     shared_limit, " the kernel may use",
                     shared_limit == kDefaultSharedBytes
                         ? " (above 48 KiB only after cudaFuncSetAttribute("
                           "cudaFuncAttributeMaxDynamicSharedMemorySize))"
                         : ""));
  }
  Stream* stream = StreamOf(launch.stream);
  if (stream == nullptr) {
    return RefuseLaunch(launch, cudaErrorInvalidResourceHandle, "the stream is not a live stream");
  }
  if (StreamDevice(stream) != CurrentDevice()) {
    return RefuseLaunch(launch, cudaErrorInvalidResourceHandle,
                        absl::StrCat("the stream belongs to device ", StreamDevice(stream),
                                     " but the launching thread's current device is ",
                                     CurrentDevice(), " (cudaSetDevice on this thread)"));
  }
  Operation op;
  op.what = absl::StrCat("kernel ", launch.site.kernel, " (", SourcePlace(launch.site.where), ")");
  op.is_kernel = true;
  for (const PointerParam& p : launch.pointers) op.accesses.push_back({p.address, p.written});
  const int device = StreamDevice(stream);
  auto shared = std::make_shared<KernelLaunch>(std::move(launch));
  op.run = [shared, device] {
    const std::string error =
        RunGrid(shared->site, shared->grid, shared->block, shared->dynamic_shared_bytes,
                shared->body, CurrentSettings().thread_order);
    if (!error.empty()) FailDevice(device, cudaErrorLaunchFailure, error);
  };
  return Note(Enqueue(stream, std::move(op)));
}

}  // namespace nf::emu

using nf::emu::CurrentDevice;
using nf::emu::MemoryKind;
using nf::emu::Note;
using nf::emu::StreamOf;

// ---- Errors -----------------------------------------------------------------------------------

cudaError_t cudaGetLastError() {
  const cudaError_t error = nf::emu::last_error;
  nf::emu::last_error = cudaSuccess;
  const cudaError_t sticky = nf::emu::StickyError(CurrentDevice());
  return sticky != cudaSuccess ? sticky : error;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = nf::emu::StickyError(CurrentDevice());
  return sticky != cudaSuccess ? sticky : nf::emu::last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    default:
      return "unknown error";
  }
}

// ---- Devices ----------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Note(cudaErrorInvalidValue);
  *count = nf::emu::VisibleDeviceCount();
  return *count == 0 ? Note(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!nf::emu::ValidDevice(device)) return Note(cudaErrorInvalidDevice);
  CurrentDevice() = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Note(cudaErrorInvalidValue);
  *device = CurrentDevice();
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (properties == nullptr) return Note(cudaErrorInvalidValue);
  if (!nf::emu::ValidDevice(device)) return Note(cudaErrorInvalidDevice);
  nf::emu::FillProperties(device, properties);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return Note(nf::emu::SynchronizeDevice(CurrentDevice())); }

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;  // an H100's range
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attribute, int value) {
  if (func == nullptr) return Note(cudaErrorInvalidDeviceFunction);
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > nf::emu::kOptInSharedBytes) {
      return Note(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(nf::emu::attributes_mutex);
    nf::emu::MaxDynamicShared()[func] = value;
  }
  return cudaSuccess;
}

// ---- Memory -----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  return Note(nf::emu::AllocateDevice(CurrentDevice(), bytes, ptr));
}

cudaError_t cudaFree(void* ptr) { return Note(nf::emu::FreeDevice(ptr)); }

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int /*flags*/) {
  return Note(nf::emu::AllocatePinned(bytes, ptr));
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return Note(nf::emu::AllocatePinned(bytes, ptr));
}

cudaError_t cudaFreeHost(void* ptr) { return Note(nf::emu::FreePinned(ptr)); }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const size_t total = nf::emu::CurrentSettings().device_memory_bytes;
  const size_t used = nf::emu::AllocatedBytes(CurrentDevice());
  if (free_bytes != nullptr) *free_bytes = total - used;
  if (total_bytes != nullptr) *total_bytes = total;
  return cudaSuccess;
}

namespace nf::emu {
namespace {

// The end of the allocation `ptr` is in must hold `bytes` from it; pageable memory is the
// caller's business, as on a real machine.
bool FitsAllocation(const void* ptr, size_t bytes, MemoryKind kind);

cudaError_t CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      cudaStream_t handle, bool wait) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  Stream* stream = StreamOf(handle);
  if (stream == nullptr) return cudaErrorInvalidResourceHandle;
  const MemoryKind from = KindOf(src), to = KindOf(dst);
  const bool host_src = from != MemoryKind::kDevice, host_dst = to != MemoryKind::kDevice;
  const bool kind_ok = kind == cudaMemcpyDefault ||
                       (kind == cudaMemcpyHostToDevice && host_src && !host_dst) ||
                       (kind == cudaMemcpyDeviceToHost && !host_src && host_dst) ||
                       (kind == cudaMemcpyDeviceToDevice && !host_src && !host_dst) ||
                       (kind == cudaMemcpyHostToHost && host_src && host_dst);
  if (!kind_ok || !FitsAllocation(src, bytes, from) || !FitsAllocation(dst, bytes, to)) {
    return cudaErrorInvalidValue;
  }
  Operation op;
  op.what = "cudaMemcpyAsync";
  if (from != MemoryKind::kPageable) op.accesses.push_back({src, false});
  if (to != MemoryKind::kPageable) op.accesses.push_back({dst, true});
  if (from == MemoryKind::kPageable && !host_dst) {
    // Pageable to device: staged at the call, which returns once the source may be reused.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    op.run = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    // Pinned memory is read (written) when the stream reaches the copy.
    op.run = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
  }
  const cudaError_t queued = Enqueue(stream, std::move(op));
  if (queued != cudaSuccess) return queued;
  // Into pageable memory the call returns once the data is there.
  if (wait || to == MemoryKind::kPageable) return SynchronizeStream(stream);
  return cudaSuccess;
}

bool FitsAllocation(const void* ptr, size_t bytes, MemoryKind kind) {
  if (kind == MemoryKind::kPageable) return true;
  return KindOf(static_cast<const char*>(ptr) + bytes - 1) == kind;
}

cudaError_t SetAsync(void* dst, int value, size_t bytes, cudaStream_t handle, bool wait) {
  if (bytes == 0) return cudaSuccess;
  Stream* stream = StreamOf(handle);
  if (stream == nullptr) return cudaErrorInvalidResourceHandle;
  if (KindOf(dst) != MemoryKind::kDevice || !FitsAllocation(dst, bytes, MemoryKind::kDevice)) {
    return cudaErrorInvalidValue;
  }
  Operation op;
  op.what = "cudaMemsetAsync";
  op.accesses.push_back({dst, true});
  op.run = [dst, value, bytes] { std::memset(dst, value, bytes); };
  const cudaError_t queued = Enqueue(stream, std::move(op));
  if (queued != cudaSuccess || !wait) return queued;
  return SynchronizeStream(stream);
}

}  // namespace
}  // namespace nf::emu

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return Note(nf::emu::CopyAsync(dst, src, bytes, kind, stream, false));
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return Note(nf::emu::CopyAsync(dst, src, bytes, kind, cudaStreamLegacy, true));
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return Note(nf::emu::SetAsync(dst, value, bytes, stream, false));
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  return Note(nf::emu::SetAsync(dst, value, bytes, cudaStreamLegacy, true));
}

// ---- Streams ----------------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return Note(nf::emu::CreateStream(stream, cudaStreamDefault, 0));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return Note(nf::emu::CreateStream(stream, flags, 0));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  return Note(nf::emu::CreateStream(stream, flags, std::clamp(priority, -5, 0)));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) { return Note(nf::emu::DestroyStream(stream)); }

cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr) return Note(cudaErrorInvalidResourceHandle);
  return Note(nf::emu::SynchronizeStream(stream));
}

cudaError_t cudaStreamQuery(cudaStream_t handle) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr) return Note(cudaErrorInvalidResourceHandle);
  const cudaError_t state = nf::emu::QueryStream(stream);
  return state == cudaErrorNotReady ? state : Note(state);  // not ready is not an error
}

cudaError_t cudaStreamGetFlags(cudaStream_t handle, unsigned int* flags) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr || flags == nullptr) return Note(cudaErrorInvalidResourceHandle);
  *flags = nf::emu::StreamFlags(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t handle, int* priority) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr || priority == nullptr) return Note(cudaErrorInvalidResourceHandle);
  *priority = nf::emu::StreamPriority(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t handle, int* device) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr || device == nullptr) return Note(cudaErrorInvalidResourceHandle);
  *device = nf::emu::StreamDevice(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t handle, cudaEvent_t event, unsigned int /*flags*/) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr) return Note(cudaErrorInvalidResourceHandle);
  return Note(nf::emu::StreamWaitEvent(stream, event));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t handle, cudaHostFn_t fn, void* data) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr) return Note(cudaErrorInvalidResourceHandle);
  if (fn == nullptr) return Note(cudaErrorInvalidValue);
  nf::emu::Operation op;
  op.what = "cudaLaunchHostFunc";
  op.run = [fn, data] { fn(data); };
  return Note(nf::emu::Enqueue(stream, std::move(op)));
}

// ---- Events -----------------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return Note(nf::emu::CreateEvent(event, cudaEventDefault));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return Note(nf::emu::CreateEvent(event, flags));
}

cudaError_t cudaEventDestroy(cudaEvent_t event) { return Note(nf::emu::DestroyEvent(event)); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t handle) {
  nf::emu::Stream* stream = StreamOf(handle);
  if (stream == nullptr) return Note(cudaErrorInvalidResourceHandle);
  return Note(nf::emu::RecordEvent(event, stream));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  const cudaError_t state = nf::emu::QueryEvent(event);
  return state == cudaErrorNotReady ? state : Note(state);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return Note(nf::emu::SynchronizeEvent(event));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return Note(nf::emu::EventElapsedMs(ms, start, end));
}
