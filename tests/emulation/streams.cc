#include "tests/emulation/streams.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/emulation/devices.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {

// ---- Vector clocks --------------------------------------------------------------------------

// clock[s]: the number of operations of stream s known to have happened before.
class VectorClock {
 public:
  uint64_t Get(int stream) const { return stream < static_cast<int>(v_.size()) ? v_[stream] : 0; }
  void Set(int stream, uint64_t value) {
    if (stream >= static_cast<int>(v_.size())) v_.resize(stream + 1, 0);
    v_[stream] = value;
  }
  void Join(const VectorClock& other) {
    if (other.v_.size() > v_.size()) v_.resize(other.v_.size(), 0);
    for (size_t i = 0; i < other.v_.size(); ++i) v_[i] = std::max(v_[i], other.v_[i]);
  }

 private:
  std::vector<uint64_t> v_;
};

namespace {

// One access of an allocation: which operation of which stream.
struct Epoch {
  int stream;
  uint64_t seq;
  std::string what;
};

struct Allocation {
  size_t bytes;
  int device;  // -1: pinned host memory
  std::optional<Epoch> last_write;
  std::vector<Epoch> reads;  // since the last write, one per stream
};

struct QueuedOp {
  Operation op;
  uint64_t seq = 0;
  Stream* wait_stream = nullptr;  // a wait: until wait_stream has completed wait_seq
  uint64_t wait_seq = 0;
  uint64_t ticket = 0;  // serial kernels: the op's place in the device's kernel order
};

struct DeviceState {
  cudaError_t sticky = cudaSuccess;
  uint64_t next_ticket = 1, running_ticket = 1;
  std::map<uint64_t, std::pair<Stream*, uint64_t>> ticket_owner;  // ticket -> stream, seq
  Stream* legacy = nullptr;
  size_t allocated = 0;
};

}  // namespace

class Stream {
 public:
  Stream(int id, int device, unsigned flags, int priority, bool legacy)
      : id(id), device(device), flags(flags), priority(priority), legacy(legacy) {}

  std::string Name() const {
    return absl::StrCat("stream ", id, " of device ", device, legacy ? " (legacy default)" : "",
                        priority != 0 ? absl::StrCat(" (priority ", priority, ")") : "");
  }

  const int id, device;
  const unsigned flags;
  const int priority;
  const bool legacy;
  // Guarded by the emulator's mutex:
  std::deque<QueuedOp> queue;
  uint64_t enqueued = 0, completed = 0;
  VectorClock clock;
  const QueuedOp* blocked = nullptr;  // the wait the worker is blocked in, for deadlock reports
  Stream* blocked_on = nullptr;
  uint64_t blocked_on_seq = 0;
  bool stop = false;
  std::thread worker;
};

struct Event {
  int device = 0;
  unsigned flags = 0;
  Stream* stream = nullptr;  // of the last record; nullptr: never recorded
  uint64_t seq = 0;
  VectorClock clock;
  std::chrono::steady_clock::time_point time;  // when the stream reached the record
};

namespace {

struct Emulator {
  std::mutex mu;
  std::condition_variable changed;  // any stream progressed, or a device failed
  std::map<uintptr_t, Allocation> allocations;
  std::set<Stream*> streams;
  std::set<Event*> events;
  std::map<int, DeviceState> devices;
  std::vector<std::string> reports;
  int next_stream_id = 1;
  int serial_turn_waits = 0;  // workers whose kernel waits for its turn (serial kernels)
};

Emulator& G() {
  static auto* emulator = new Emulator();  // lives for the process: workers may still run
  return *emulator;
}

thread_local VectorClock host_clock;

void FailDeviceLocked(int device, cudaError_t error, const std::string& report) {
  Emulator& g = G();
  DeviceState& d = g.devices[device];
  if (d.sticky == cudaSuccess) d.sticky = error;
  g.reports.push_back(report);
  std::fprintf(stderr, "nf-emu: %s\n", report.c_str());
  g.changed.notify_all();
}

Allocation* FindAllocationLocked(const void* ptr, uintptr_t* start = nullptr) {
  Emulator& g = G();
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = g.allocations.upper_bound(address);
  if (it == g.allocations.begin()) return nullptr;
  --it;
  if (address > it->first + it->second.bytes) return nullptr;  // one past the end is inside
  if (start != nullptr) *start = it->first;
  return &it->second;
}

// The hazard check of one access by operation `seq` of `stream`, whose clock is `clock`.
void RecordAccessLocked(Stream& stream, uint64_t seq, const VectorClock& clock, const Operation& op,
                        const MemoryAccess& access) {
  uintptr_t start = 0;
  Allocation* a = FindAllocationLocked(access.address, &start);
  if (a == nullptr) return;  // checked by the caller
  auto unordered = [&](const Epoch& e) {
    return e.stream != stream.id && clock.Get(e.stream) < e.seq;
  };
  auto report = [&](const Epoch& other, const char* kind) {
    FailDeviceLocked(
        stream.device, cudaErrorLaunchFailure,
        absl::StrCat("hazard (", kind, ") on the allocation at 0x", absl::Hex(start), " (",
                     a->bytes, " bytes): ", op.what, " on ", stream.Name(),
                     access.written ? " writes it" : " reads it", ", and ", other.what,
                     " on stream ", other.stream, " accessed it with no event ordering the two"));
  };
  if (a->last_write && unordered(*a->last_write)) {
    report(*a->last_write, access.written ? "write after write" : "read after write");
    return;
  }
  Epoch self{stream.id, seq, op.what};
  if (access.written) {
    for (const Epoch& r : a->reads) {
      if (unordered(r)) {
        report(r, "write after read");
        return;
      }
    }
    a->reads.clear();
    a->last_write = self;
  } else {
    auto it = std::find_if(a->reads.begin(), a->reads.end(),
                           [&](const Epoch& e) { return e.stream == stream.id; });
    if (it != a->reads.end()) {
      *it = self;
    } else {
      a->reads.push_back(self);
    }
  }
}

// Follows the chain of waits from `stream`: a cycle back to any stream on it is a deadlock.
void CheckDeadlockLocked(Stream& stream) {
  std::vector<Stream*> chain{&stream};
  Stream* at = &stream;
  while (at->blocked_on != nullptr && at->blocked_on->completed < at->blocked_on_seq) {
    Stream* next = at->blocked_on;
    if (std::find(chain.begin(), chain.end(), next) != chain.end()) {
      std::string cycle;
      for (Stream* s : chain) {
        absl::StrAppend(&cycle, cycle.empty() ? "" : "; ", s->Name(), " waits for ",
                        s->blocked_on->Name(), " to finish its operation ", s->blocked_on_seq, " (",
                        s->blocked != nullptr ? s->blocked->op.what : "", ")");
      }
      FailDeviceLocked(stream.device, cudaErrorLaunchFailure,
                       absl::StrCat("deadlock between streams: ", cycle));
      return;
    }
    chain.push_back(next);
    at = next;
  }
}

void Work(Stream* stream) {
  Emulator& g = G();
  std::unique_lock<std::mutex> lock(g.mu);
  while (true) {
    g.changed.wait(lock, [&] { return stream->stop || !stream->queue.empty(); });
    if (stream->queue.empty()) return;
    QueuedOp& op = stream->queue.front();
    DeviceState& device = g.devices[stream->device];
    if (const uint64_t seed = CurrentSettings().stream_delay_seed; seed != 0) {
      // The same pauses for the same seed, stream and operation.
      std::mt19937_64 delays(seed * 0x9e3779b97f4a7c15ull + (uint64_t(stream->id) << 32) + op.seq);
      const auto pause = std::chrono::microseconds(delays() % 400);
      lock.unlock();
      std::this_thread::sleep_for(pause);
      lock.lock();
    }
    if (op.wait_stream != nullptr) {
      stream->blocked = &op;
      stream->blocked_on = op.wait_stream;
      stream->blocked_on_seq = op.wait_seq;
      CheckDeadlockLocked(*stream);
      g.changed.wait(lock, [&] {
        return op.wait_stream->completed >= op.wait_seq || device.sticky != cudaSuccess;
      });
      stream->blocked_on = nullptr;
      stream->blocked = nullptr;
    }
    if (op.ticket != 0) {
      ++g.serial_turn_waits;
      g.changed.wait(lock, [&] {
        if (device.running_ticket == op.ticket || device.sticky != cudaSuccess) return true;
        // Waiting for the device's next kernel, on whichever stream it was issued.
        const auto [owner, seq] = device.ticket_owner.at(device.running_ticket);
        stream->blocked = &op;
        stream->blocked_on = owner;
        stream->blocked_on_seq = seq;
        CheckDeadlockLocked(*stream);
        return device.sticky != cudaSuccess;
      });
      --g.serial_turn_waits;
      stream->blocked_on = nullptr;
      stream->blocked = nullptr;
    }
    if (device.sticky == cudaSuccess && op.op.run) {
      lock.unlock();
      op.op.run();
      lock.lock();
    }
    if (op.ticket != 0) {
      device.ticket_owner.erase(op.ticket);
      ++device.running_ticket;
    }
    ++stream->completed;
    stream->queue.pop_front();
    g.changed.notify_all();
  }
}

Stream* NewStreamLocked(int device, unsigned flags, int priority, bool legacy) {
  Emulator& g = G();
  auto* stream = new Stream(g.next_stream_id++, device, flags, priority, legacy);
  stream->worker = std::thread(Work, stream);
  g.streams.insert(stream);
  return stream;
}

Stream* LegacyStreamLocked(int device) {
  DeviceState& d = G().devices[device];
  if (d.legacy == nullptr) d.legacy = NewStreamLocked(device, cudaStreamDefault, 0, true);
  return d.legacy;
}

uint64_t PushLocked(Stream& stream, QueuedOp op) {
  op.seq = ++stream.enqueued;
  stream.clock.Join(host_clock);
  stream.clock.Set(stream.id, op.seq);
  stream.queue.push_back(std::move(op));
  G().changed.notify_all();
  return stream.enqueued;
}

// The legacy default stream and the blocking streams of a device wait for each other.
void OrderWithLegacyLocked(Stream& stream) {
  Emulator& g = G();
  if (stream.legacy) {
    for (Stream* other : g.streams) {
      if (other == &stream || other->device != stream.device ||
          (other->flags & cudaStreamNonBlocking) != 0 || other->completed == other->enqueued) {
        continue;
      }
      QueuedOp wait;
      wait.op.what = absl::StrCat("the legacy default stream's wait for ", other->Name());
      wait.wait_stream = other;
      wait.wait_seq = other->enqueued;
      stream.clock.Join(other->clock);
      PushLocked(stream, std::move(wait));
    }
  } else if ((stream.flags & cudaStreamNonBlocking) == 0) {
    Stream* legacy = G().devices[stream.device].legacy;
    if (legacy != nullptr && legacy->completed < legacy->enqueued) {
      QueuedOp wait;
      wait.op.what = "a wait for the legacy default stream";
      wait.wait_stream = legacy;
      wait.wait_seq = legacy->enqueued;
      stream.clock.Join(legacy->clock);
      PushLocked(stream, std::move(wait));
    }
  }
}

}  // namespace

Stream* StreamOf(cudaStream_t handle) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    return LegacyStreamLocked(CurrentDevice());
  }
  auto* stream = reinterpret_cast<Stream*>(handle);
  return g.streams.count(stream) != 0 ? stream : nullptr;
}

cudaError_t Enqueue(Stream* stream, Operation op) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.devices[stream->device].sticky != cudaSuccess) return g.devices[stream->device].sticky;
  for (const MemoryAccess& access : op.accesses) {
    if (access.address == nullptr) continue;
    Allocation* a = FindAllocationLocked(access.address);
    if (a == nullptr || (a->device != -1 && a->device != stream->device)) {
      FailDeviceLocked(
          stream->device, cudaErrorIllegalAddress,
          absl::StrCat(op.what, " on ", stream->Name(), " is given the address 0x",
                       absl::Hex(reinterpret_cast<uintptr_t>(access.address)),
                       a == nullptr ? ", which is not memory of any device"
                                    : absl::StrCat(", which is memory of device ", a->device)));
      return cudaErrorIllegalAddress;
    }
  }
  OrderWithLegacyLocked(*stream);
  QueuedOp queued;
  queued.op = std::move(op);
  const bool is_kernel = queued.op.is_kernel;
  const std::vector<MemoryAccess> accesses = queued.op.accesses;
  const Operation& described = queued.op;
  VectorClock clock = stream->clock;
  clock.Join(host_clock);
  const uint64_t seq = stream->enqueued + 1;
  clock.Set(stream->id, seq);
  if (CurrentSettings().hazard_checks) {
    for (const MemoryAccess& access : accesses) {
      if (access.address != nullptr) RecordAccessLocked(*stream, seq, clock, described, access);
    }
  }
  DeviceState& device = g.devices[stream->device];
  if (is_kernel && CurrentSettings().serial_kernels) {
    queued.ticket = device.next_ticket++;
    device.ticket_owner[queued.ticket] = {stream, seq};
  }
  PushLocked(*stream, std::move(queued));
  return device.sticky;
}

cudaError_t CreateStream(cudaStream_t* handle, unsigned flags, int priority) {
  if (handle == nullptr) return cudaErrorInvalidValue;
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  *handle =
      reinterpret_cast<cudaStream_t>(NewStreamLocked(CurrentDevice(), flags, priority, false));
  return cudaSuccess;
}

cudaError_t DestroyStream(cudaStream_t handle) {
  Emulator& g = G();
  Stream* stream;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    stream = reinterpret_cast<Stream*>(handle);
    if (g.streams.count(stream) == 0 || stream->legacy) return cudaErrorInvalidResourceHandle;
    // Work already queued still runs (cudaStreamDestroy returns at once).
    g.streams.erase(stream);
    stream->stop = true;
    g.changed.notify_all();
  }
  stream->worker.detach();  // the worker exits once its queue is empty; the Stream is leaked
  return cudaSuccess;       // deliberately: events may still name it in reports
}

cudaError_t SynchronizeStream(Stream* stream) {
  Emulator& g = G();
  std::unique_lock<std::mutex> lock(g.mu);
  const uint64_t target = stream->enqueued;
  const VectorClock clock = stream->clock;
  DeviceState& device = g.devices[stream->device];
  g.changed.wait(lock, [&] { return stream->completed >= target || device.sticky != cudaSuccess; });
  if (device.sticky != cudaSuccess) return device.sticky;
  host_clock.Join(clock);
  return cudaSuccess;
}

cudaError_t QueryStream(Stream* stream) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  const DeviceState& device = g.devices[stream->device];
  if (device.sticky != cudaSuccess) return device.sticky;
  if (stream->completed < stream->enqueued) return cudaErrorNotReady;
  host_clock.Join(stream->clock);
  return cudaSuccess;
}

unsigned StreamFlags(const Stream* stream) { return stream->flags; }
int StreamPriority(const Stream* stream) { return stream->priority; }
int StreamDevice(const Stream* stream) { return stream->device; }

cudaError_t CreateEvent(cudaEvent_t* handle, unsigned flags) {
  if (handle == nullptr) return cudaErrorInvalidValue;
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto* event = new Event();
  event->device = CurrentDevice();
  event->flags = flags;
  g.events.insert(event);
  *handle = reinterpret_cast<cudaEvent_t>(event);
  return cudaSuccess;
}

namespace {
Event* EventOfLocked(cudaEvent_t handle) {
  auto* event = reinterpret_cast<Event*>(handle);
  return G().events.count(event) != 0 ? event : nullptr;
}
}  // namespace

cudaError_t DestroyEvent(cudaEvent_t handle) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Event* event = EventOfLocked(handle);
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  g.events.erase(event);
  // A record still queued writes the event's time: the Event itself stays allocated.
  return cudaSuccess;
}

cudaError_t RecordEvent(cudaEvent_t handle, Stream* stream) {
  Emulator& g = G();
  std::unique_lock<std::mutex> lock(g.mu);
  Event* event = EventOfLocked(handle);
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (event->device != stream->device) return cudaErrorInvalidResourceHandle;
  if (g.devices[stream->device].sticky != cudaSuccess) return g.devices[stream->device].sticky;
  OrderWithLegacyLocked(*stream);
  QueuedOp record;
  record.op.what = "cudaEventRecord";
  record.op.run = [event] { event->time = std::chrono::steady_clock::now(); };
  const uint64_t seq = PushLocked(*stream, std::move(record));
  event->stream = stream;
  event->seq = seq;
  event->clock = stream->clock;
  return cudaSuccess;
}

cudaError_t StreamWaitEvent(Stream* stream, cudaEvent_t handle) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Event* event = EventOfLocked(handle);
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (g.devices[stream->device].sticky != cudaSuccess) return g.devices[stream->device].sticky;
  if (event->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  QueuedOp wait;
  wait.op.what =
      absl::StrCat("cudaStreamWaitEvent for ", event->stream->Name(), "'s operation ", event->seq);
  wait.wait_stream = event->stream;
  wait.wait_seq = event->seq;
  stream->clock.Join(event->clock);
  PushLocked(*stream, std::move(wait));
  return cudaSuccess;
}

cudaError_t QueryEvent(cudaEvent_t handle) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Event* event = EventOfLocked(handle);
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (event->stream == nullptr) return cudaSuccess;
  if (g.devices[event->device].sticky != cudaSuccess) return g.devices[event->device].sticky;
  if (event->stream->completed < event->seq) return cudaErrorNotReady;
  host_clock.Join(event->clock);
  return cudaSuccess;
}

cudaError_t SynchronizeEvent(cudaEvent_t handle) {
  Emulator& g = G();
  std::unique_lock<std::mutex> lock(g.mu);
  Event* event = EventOfLocked(handle);
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (event->stream == nullptr) return cudaSuccess;
  Stream* stream = event->stream;
  const uint64_t seq = event->seq;
  const VectorClock clock = event->clock;
  DeviceState& device = g.devices[event->device];
  g.changed.wait(lock, [&] { return stream->completed >= seq || device.sticky != cudaSuccess; });
  if (device.sticky != cudaSuccess) return device.sticky;
  host_clock.Join(clock);
  return cudaSuccess;
}

cudaError_t EventElapsedMs(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  Event* a = EventOfLocked(start);
  Event* b = EventOfLocked(end);
  if (a == nullptr || b == nullptr) return cudaErrorInvalidResourceHandle;
  if ((a->flags & cudaEventDisableTiming) != 0 || (b->flags & cudaEventDisableTiming) != 0) {
    return cudaErrorInvalidResourceHandle;
  }
  if (a->stream == nullptr || b->stream == nullptr) return cudaErrorInvalidResourceHandle;
  if (a->stream->completed < a->seq || b->stream->completed < b->seq) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

cudaError_t SynchronizeDevice(int device) {
  Emulator& g = G();
  std::unique_lock<std::mutex> lock(g.mu);
  std::vector<std::pair<Stream*, uint64_t>> targets;
  for (Stream* s : g.streams) {
    if (s->device == device) targets.emplace_back(s, s->enqueued);
  }
  DeviceState& d = g.devices[device];
  g.changed.wait(lock, [&] {
    if (d.sticky != cudaSuccess) return true;
    for (const auto& [s, seq] : targets) {
      if (s->completed < seq) return false;
    }
    return true;
  });
  if (d.sticky != cudaSuccess) return d.sticky;
  for (const auto& [s, seq] : targets) host_clock.Join(s->clock);
  return cudaSuccess;
}

cudaError_t AllocateDevice(int device, size_t bytes, void** ptr) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  DeviceState& d = g.devices[device];
  if (d.sticky != cudaSuccess) return d.sticky;
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  if (d.allocated + rounded > CurrentSettings().device_memory_bytes) {
    *ptr = nullptr;
    return cudaErrorMemoryAllocation;
  }
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return cudaErrorMemoryAllocation;
  // Fresh device memory is not zero on a GPU either: 0xff bytes read as NaN.
  std::memset(memory, 0xff, rounded);
  d.allocated += rounded;
  g.allocations[reinterpret_cast<uintptr_t>(memory)] = Allocation{bytes, device, {}, {}};
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t FreeDevice(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  int device = -1;
  if (KindOf(ptr, &device) != MemoryKind::kDevice) return cudaErrorInvalidValue;
  // cudaFree waits for the device: no kernel may still use the memory.
  const cudaError_t synced = SynchronizeDevice(device);
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g.allocations.end()) return cudaErrorInvalidValue;  // not the start of one
  g.devices[device].allocated -= std::max<size_t>(256, (it->second.bytes + 255) / 256 * 256);
  g.allocations.erase(it);
  std::free(ptr);
  return synced;
}

cudaError_t AllocatePinned(size_t bytes, void** ptr) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  void* memory = std::aligned_alloc(4096, std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096));
  if (memory == nullptr) return cudaErrorMemoryAllocation;
  g.allocations[reinterpret_cast<uintptr_t>(memory)] = Allocation{bytes, -1, {}, {}};
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t FreePinned(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (KindOf(ptr) != MemoryKind::kPinned) return cudaErrorInvalidValue;
  // cudaFreeHost synchronises like cudaFree: every device's work may read the buffer.
  for (int device = 0; device < VisibleDeviceCount(); ++device) SynchronizeDevice(device);
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g.allocations.end()) return cudaErrorInvalidValue;
  g.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

MemoryKind KindOf(const void* ptr, int* device) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  const Allocation* a = FindAllocationLocked(ptr);
  if (a == nullptr) return MemoryKind::kPageable;
  if (device != nullptr) *device = a->device;
  return a->device == -1 ? MemoryKind::kPinned : MemoryKind::kDevice;
}

size_t AllocatedBytes(int device) {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.devices[device].allocated;
}

void AddReport(const std::string& report) {
  std::lock_guard<std::mutex> lock(G().mu);
  G().reports.push_back(report);
  std::fprintf(stderr, "nf-emu: %s\n", report.c_str());
}

void FailDevice(int device, cudaError_t error, const std::string& report) {
  std::lock_guard<std::mutex> lock(G().mu);
  FailDeviceLocked(device, error, report);
}

cudaError_t StickyError(int device) {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().devices[device].sticky;
}

int SerialTurnWaits() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().serial_turn_waits;
}

std::vector<std::string> Reports() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().reports;
}

void ClearReportsAndErrors() {
  Emulator& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  g.reports.clear();
  for (auto& [device, state] : g.devices) state.sticky = cudaSuccess;
  for (auto& [start, a] : g.allocations) {
    a.last_write.reset();
    a.reads.clear();
  }
}

}  // namespace nf::emu
