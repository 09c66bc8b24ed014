#include "tests/emulation/devices.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {
namespace {

// Physical device p's UUID: fixed bytes with p in the last one, so that every process of a
// test sees the same UUID for the same device.
void UuidOf(int physical, unsigned char bytes[16]) {
  const unsigned char base[16] = {0x4e, 0x46, 0x45, 0x4d, 0x55, 0x00, 0x47, 0x50,
                                  0x55, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  std::memcpy(bytes, base, 16);
  bytes[15] = static_cast<unsigned char>(physical);
}

std::string UuidText(int physical) {
  unsigned char bytes[16];
  UuidOf(physical, bytes);
  std::string text = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += hex[bytes[i] >> 4];
    text += hex[bytes[i] & 15];
  }
  return text;
}

// The physical devices in visible order.
const std::vector<int>& Visible() {
  static const std::vector<int> visible = [] {
    const int physical = CurrentSettings().devices;
    std::vector<int> list;
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    if (env == nullptr) {
      for (int p = 0; p < physical; ++p) list.push_back(p);
      return list;
    }
    for (absl::string_view entry : absl::StrSplit(env, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      int p = -1;
      if (absl::StartsWith(entry, "GPU-")) {
        for (int q = 0; q < physical; ++q) {
          if (absl::StartsWith(UuidText(q), entry)) p = q;
        }
      } else if (!absl::SimpleAtoi(entry, &p) || p < 0 || p >= physical) {
        p = -1;
      }
      if (p < 0) break;
      for (int seen : list) {
        if (seen == p) return std::vector<int>();
      }
      list.push_back(p);
    }
    return list;
  }();
  return visible;
}

}  // namespace

int VisibleDeviceCount() { return static_cast<int>(Visible().size()); }

int& CurrentDevice() {
  thread_local int device = 0;
  return device;
}

int PhysicalDevice(int device) { return Visible()[device]; }

void FillProperties(int device, cudaDeviceProp* p) {
  std::memset(p, 0, sizeof(*p));
  std::strncpy(p->name, "NF emulated GPU (H100 limits)", sizeof(p->name) - 1);
  UuidOf(PhysicalDevice(device), reinterpret_cast<unsigned char*>(p->uuid.bytes));
  p->totalGlobalMem = CurrentSettings().device_memory_bytes;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->unifiedAddressing = 1;
  p->pciBusID = PhysicalDevice(device) + 1;
  p->l2CacheSize = 50 << 20;
  p->memoryBusWidth = 5120;
}

}  // namespace nf::emu
