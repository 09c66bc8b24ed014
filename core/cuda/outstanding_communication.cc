#include "core/cuda/outstanding_communication.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>

namespace nf::cuda {
namespace {

// Per device; a device beyond the table shares its last slot. Never freed: communicators may
// still count while the process exits.
constexpr int kMaxCountedDevices = 64;
struct Counts {
  std::array<std::atomic<int64_t>, kMaxCountedDevices> outstanding{};
  // Signalled when a device's count reaches 0; the waiter checks the count under `mutex`.
  std::mutex mutex;
  std::condition_variable drained;
};
Counts& TheCounts() {
  static auto* counts = new Counts();
  return *counts;
}
std::atomic<int64_t>& Slot(int device) {
  return TheCounts().outstanding[std::clamp(device, 0, kMaxCountedDevices - 1)];
}

}  // namespace

void AddOutstandingCommunication(int device, int64_t delta) {
  if (Slot(device).fetch_add(delta, std::memory_order_acq_rel) + delta == 0) {
    // Taking the mutex orders this after a waiter's check of the count, so no wake-up is lost.
    std::lock_guard<std::mutex> lock(TheCounts().mutex);
    TheCounts().drained.notify_all();
  }
}

int64_t OutstandingCommunication(int device) {
  return Slot(device).load(std::memory_order_acquire);
}

bool WaitForNoOutstandingCommunication(int device, std::chrono::milliseconds limit) {
  Counts& counts = TheCounts();
  std::unique_lock<std::mutex> lock(counts.mutex);
  return counts.drained.wait_for(lock, limit,
                                 [&] { return OutstandingCommunication(device) <= 0; });
}

}  // namespace nf::cuda
