// What the process-wide CPU allocator (allocator.h) has handed out: the bytes of tensor storage
// not yet taken back (as requested, before alignment), now and at most since the process started
// or the last ResetCpuAllocatorPeak. The memory estimate is checked against it
// (bench/memory_bench.cc); counting costs two relaxed atomic operations per allocation.
#pragma once

#include <cstdint>

namespace nf {

struct AllocatorUsage {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
AllocatorUsage CpuAllocatorUsage();
void ResetCpuAllocatorPeak();  // peak = live

}  // namespace nf
