#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {
namespace {

std::mutex mutex;

Settings FromEnvironment() {
  Settings s;
  auto number = [](const char* name, uint64_t fallback) {
    const char* value = std::getenv(name);
    uint64_t parsed = 0;
    return value != nullptr && absl::SimpleAtoi(value, &parsed) ? parsed : fallback;
  };
  s.devices = static_cast<int>(number("NF_EMU_DEVICES", 2));
  s.device_memory_bytes = number("NF_EMU_DEVICE_MEMORY_MIB", 4096) << 20;
  s.stream_delay_seed = number("NF_EMU_STREAM_DELAYS", 0);
  s.serial_kernels = number("NF_EMU_SERIAL_KERNELS", 0) != 0;
  if (const char* order = std::getenv("NF_EMU_THREAD_ORDER")) {
    const std::string text = order;
    if (text == "reverse") s.thread_order.order = ThreadOrder::kReverse;
    if (absl::StartsWith(text, "shuffle")) {
      s.thread_order.order = ThreadOrder::kShuffle;
      uint64_t seed = 1;
      if (text.size() > 8 && absl::SimpleAtoi(text.substr(8), &seed)) s.thread_order.seed = seed;
    }
  }
  return s;
}

Settings& Current() {
  static Settings settings = FromEnvironment();
  return settings;
}

}  // namespace

Settings CurrentSettings() {
  std::lock_guard<std::mutex> lock(mutex);
  return Current();
}

void SetThreadOrder(const OrderSetting& order) {
  std::lock_guard<std::mutex> lock(mutex);
  Current().thread_order = order;
}

void SetStreamDelays(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex);
  Current().stream_delay_seed = seed;
}

void SetSerialKernels(bool on) {
  std::lock_guard<std::mutex> lock(mutex);
  Current().serial_kernels = on;
}

void SetHazardChecks(bool on) {
  std::lock_guard<std::mutex> lock(mutex);
  Current().hazard_checks = on;
}

}  // namespace nf::emu
