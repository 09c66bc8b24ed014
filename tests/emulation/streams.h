// The emulated GPUs' streams, events and memory: what the CUDA runtime double
// (cuda_runtime_api.cc), the cuBLASLt, cub and NCCL doubles enqueue their work on.
//
// Every stream has a host thread of its own that runs its operations in issue order, so
// streams run asynchronously to the host and to each other, as on a device. Events capture a
// stream's position; cudaStreamWaitEvent makes a stream wait for it. Two stress modes, each a
// switch (emulator.h, or the environment):
//   NF_EMU_STREAM_DELAYS=<seed>  a random pause (0-400 us) before every operation of every
//                                stream, so that unordered work interleaves differently;
//   NF_EMU_SERIAL_KERNELS=1      CUDA's minimum guarantee: the kernels of one device run one
//                                at a time, in the order they were issued, whatever their
//                                streams (a stream whose next kernel is not the device's next
//                                waits).
// A stream that waits on work that can never happen (a cycle of streams waiting on each other,
// through events or the serial order) is a deadlock: it is reported naming the streams and
// their operations, the device's work is failed with a sticky error, and waiting host calls
// return it.
//
// Memory hazards between streams are found from the order the program establishes, not from
// timing: each stream carries a vector clock (advanced by its operations, joined by
// cudaStreamWaitEvent and, for the host thread, by every synchronisation it observes), and
// each allocation remembers its last writer and its readers since. An operation that writes
// an allocation another stream reads or writes, or reads one another stream writes, with no
// order between them, is a hazard: reported like a deadlock. Kernels read through their
// pointer-to-const parameters and write through the others; copies, cuBLASLt and NCCL say what
// they read and write.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace nf::emu {

class Stream;

// What an operation does to memory: the allocation is found from any address inside it.
struct MemoryAccess {
  const void* address;
  bool written;
};

struct Operation {
  std::string what;           // "kernel X (core/cuda/y.cu:12)", "cudaMemcpyAsync", ...
  std::function<void()> run;  // on the stream's thread, when the stream reaches it
  std::vector<MemoryAccess> accesses;
  bool is_kernel = false;  // counts in the serial-kernels order
};

// The stream behind a handle (nullptr and cudaStreamLegacy: the current device's legacy default
// stream), or nullptr when the handle is not a live stream.
Stream* StreamOf(cudaStream_t handle);

// Queues `op` on the stream; returns cudaSuccess or the error the call must return (a sticky
// error of the device, an access to memory that is not the device's).
cudaError_t Enqueue(Stream* stream, Operation op);

cudaError_t CreateStream(cudaStream_t* handle, unsigned flags, int priority);
cudaError_t DestroyStream(cudaStream_t handle);
// Waits until everything queued on the stream so far has run.
cudaError_t SynchronizeStream(Stream* stream);
cudaError_t QueryStream(Stream* stream);
unsigned StreamFlags(const Stream* stream);
int StreamPriority(const Stream* stream);
int StreamDevice(const Stream* stream);

cudaError_t CreateEvent(cudaEvent_t* handle, unsigned flags);
cudaError_t DestroyEvent(cudaEvent_t handle);
cudaError_t RecordEvent(cudaEvent_t event, Stream* stream);
cudaError_t StreamWaitEvent(Stream* stream, cudaEvent_t event);
cudaError_t QueryEvent(cudaEvent_t event);
cudaError_t SynchronizeEvent(cudaEvent_t event);
cudaError_t EventElapsedMs(float* ms, cudaEvent_t start, cudaEvent_t end);

// Waits for all work of a device (cudaFree, cudaFreeHost, cudaDeviceSynchronize do).
cudaError_t SynchronizeDevice(int device);

// Memory the emulated devices know: device allocations and pinned host memory.
cudaError_t AllocateDevice(int device, size_t bytes, void** ptr);
cudaError_t FreeDevice(void* ptr);
cudaError_t AllocatePinned(size_t bytes, void** ptr);
cudaError_t FreePinned(void* ptr);
enum class MemoryKind { kDevice, kPinned, kPageable };
// The kind of memory `ptr` points into, and for device memory its device.
MemoryKind KindOf(const void* ptr, int* device = nullptr);
size_t AllocatedBytes(int device);

// Prints and records a report that fails nothing (a misuse the program survives).
void AddReport(const std::string& report);

// Makes every later call on the device return `error` (CUDA's sticky errors) and prints the
// report; the first report of the process is kept for Reports().
void FailDevice(int device, cudaError_t error, const std::string& report);
cudaError_t StickyError(int device);

}  // namespace nf::emu
