// Where a tensor's storage lives.
#pragma once

#include <string>

namespace nf {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // GPU ordinal for kCuda; always 0 for kCpu

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int index) { return {DeviceType::kCuda, index}; }

  bool operator==(const Device&) const = default;
  std::string ToString() const {
    return type == DeviceType::kCpu ? "cpu" : "cuda:" + std::to_string(index);
  }
};

}  // namespace nf
