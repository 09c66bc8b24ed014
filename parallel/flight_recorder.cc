#include "parallel/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "parallel/watchdog.h"

namespace nf::parallel {
namespace {

// Copies `from` into the fixed-size `to`, cut to fit and NUL-terminated.
template <size_t N>
void CopyName(absl::string_view from, char (&to)[N]) {
  const size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

}  // namespace

absl::string_view FlightStateName(FlightState state) {
  switch (state) {
    case FlightState::kIssued:
      return "issued";
    case FlightState::kWaiting:
      return "waiting";
    case FlightState::kCompleted:
      return "completed";
  }
  return "unknown";
}

int64_t WallClockNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

FlightRecorder::FlightRecorder() : ring_(kDefaultCapacity) {}

FlightRecorder& FlightRecorder::Get() {
  // Never destroyed: communicators destroyed by static destructors may still record.
  static FlightRecorder* recorder = new FlightRecorder();
  return *recorder;
}

void FlightRecorder::SetCapacity(int64_t entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.assign(static_cast<size_t>(std::max<int64_t>(0, entries)), FlightEntry{});
}

int64_t FlightRecorder::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(ring_.size());
}

void FlightRecorder::RegisterGroup(FlightGroup group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(std::move(group));
}

uint64_t FlightRecorder::Issued(absl::string_view group, absl::string_view backend, int64_t seq,
                                CommOp op, int peer, int64_t bytes, DType dtype) {
  const int64_t now = WallClockNanos();
  const int64_t step = CurrentStep();
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.empty()) return 0;
  const uint64_t id = next_id_++;
  FlightEntry& e = ring_[(id - 1) % ring_.size()];
  e = FlightEntry{};
  e.id = id;
  CopyName(group, e.group);
  CopyName(backend, e.backend);
  e.seq = seq;
  e.op = op;
  e.peer = peer;
  e.bytes = bytes;
  e.dtype = dtype;
  e.step = step;
  e.issued_ns = now;
  return id;
}

FlightEntry* FlightRecorder::Find(uint64_t id) {
  if (id == 0 || ring_.empty()) return nullptr;
  FlightEntry& e = ring_[(id - 1) % ring_.size()];
  return e.id == id ? &e : nullptr;
}

void FlightRecorder::Waiting(uint64_t id) {
  if (id == 0) return;
  const int64_t now = WallClockNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* e = Find(id); e != nullptr && e->state == FlightState::kIssued) {
    e->state = FlightState::kWaiting;
    e->waiting_ns = now;
  }
}

void FlightRecorder::Completed(uint64_t id) {
  if (id == 0) return;
  const int64_t now = WallClockNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* e = Find(id); e != nullptr && e->state != FlightState::kCompleted) {
    e->state = FlightState::kCompleted;
    e->completed_ns = now;
  }
}

std::vector<FlightEntry> FlightRecorder::Entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FlightEntry> entries;
  if (ring_.empty()) return entries;
  const uint64_t last = next_id_ - 1;
  const uint64_t first = last > ring_.size() ? last - ring_.size() + 1 : 1;
  for (uint64_t id = first; id <= last; ++id) {
    const FlightEntry& e = ring_[(id - 1) % ring_.size()];
    if (e.id == id) entries.push_back(e);
  }
  return entries;
}

int64_t FlightRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t issued = next_id_ - 1;
  return issued > ring_.size() ? static_cast<int64_t>(issued - ring_.size()) : 0;
}

std::vector<FlightGroup> FlightRecorder::Groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_;
}

}  // namespace nf::parallel
