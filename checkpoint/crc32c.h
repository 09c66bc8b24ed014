// CRC-32C (Castagnoli), the checksum of every piece of a checkpoint: SSE4.2's CRC32 instruction
// where the CPU has it (chosen at run time; three independent streams at once, ~3x one stream),
// else a table-driven loop eight bytes per step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nf::checkpoint {

// The CRC-32C of `size` bytes at `data`, continuing from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// The table-driven path alone (what CPUs without SSE4.2 run), for tests to compare with.
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

}  // namespace nf::checkpoint
