// Reading the next tensor while the current one is written: the checkpoint tools go through a
// checkpoint one tensor at a time, and on one thread the disk and the kernel's copies would
// wait for each other (reading, then writing, then reading). Two tensors are in memory at most.
#pragma once

#include <cstddef>
#include <functional>
#include <future>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace nf::checkpoint {

// make(0), make(1), ... make(count - 1) on a second thread, each started once the previous one
// has been handed over, and consume(i, make(i)'s result) in order on the calling thread, so that
// make(i + 1) runs beside consume(i). make calls never overlap each other, nor do consume calls.
// The first error of either is returned (a make in flight is waited for first).
template <typename T>
absl::Status ReadAhead(size_t count, const std::function<absl::StatusOr<T>(size_t)>& make,
                       const std::function<absl::Status(size_t, T&)>& consume) {
  if (count == 0) return absl::OkStatus();
  std::future<absl::StatusOr<T>> next = std::async(std::launch::async, make, size_t{0});
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<T> current = next.get();
    if (!current.ok()) return current.status();
    if (i + 1 < count) next = std::async(std::launch::async, make, i + 1);
    // On an error the future's destructor waits for the make in flight.
    if (absl::Status consumed = consume(i, *current); !consumed.ok()) return consumed;
  }
  return absl::OkStatus();
}

}  // namespace nf::checkpoint
