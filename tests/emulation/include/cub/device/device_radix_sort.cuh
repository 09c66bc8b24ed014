// cub::DeviceRadixSort on the emulated GPUs: SortPairs as core/cuda/embedding_loss.cu calls it,
// with cub's protocol (a first call with no temporary storage asks for its size; the second
// must be given at least that much) and result: the pairs stably sorted by the bits
// [begin_bit, end_bit) of their keys, signed keys in numeric order. Runs on the stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "tests/emulation/streams.h"

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value, typename Count>
  static cudaError_t SortPairs(void* temp_storage, size_t& temp_storage_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out,
                               Count num_items, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<Key>);
    const size_t n = static_cast<size_t>(num_items);
    // cub's own figure is of this order: the double buffers of keys and values, and counters.
    const size_t needed = 2 * n * (sizeof(Key) + sizeof(Value)) + 4096;
    if (temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (temp_storage_bytes < needed || begin_bit < 0 ||
        end_bit > static_cast<int>(sizeof(Key) * 8) || begin_bit >= end_bit) {
      return cudaErrorInvalidValue;
    }
    nf::emu::Stream* s = nf::emu::StreamOf(stream);
    if (s == nullptr) return cudaErrorInvalidResourceHandle;
    if (n == 0) return cudaSuccess;
    nf::emu::Operation op;
    op.what = "cub::DeviceRadixSort::SortPairs";
    op.accesses = {{keys_in, false},
                   {values_in, false},
                   {keys_out, true},
                   {values_out, true},
                   {temp_storage, true}};
    op.run = [=] {
      using Bits = std::make_unsigned_t<Key>;
      // cub flips the sign bit of signed keys so that their bits sort in numeric order.
      auto digit = [&](Key key) {
        Bits bits = static_cast<Bits>(key);
        if constexpr (std::is_signed_v<Key>) bits ^= Bits{1} << (sizeof(Key) * 8 - 1);
        const int width = end_bit - begin_bit;
        const Bits mask =
            width >= static_cast<int>(sizeof(Bits) * 8) ? ~Bits{0} : (Bits{1} << width) - 1;
        return static_cast<Bits>((bits >> begin_bit) & mask);
      };
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return digit(keys_in[a]) < digit(keys_in[b]); });
      std::vector<Key> keys(n);
      std::vector<Value> values(n);
      for (size_t i = 0; i < n; ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    };
    return nf::emu::Enqueue(s, std::move(op));
  }
};

}  // namespace cub
