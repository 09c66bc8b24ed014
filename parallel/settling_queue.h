// SettlingQueue: operations waited for but not yet accounted (their time added to the stats),
// in issue order, bounded. The NCCL communicator's handles push each operation's events here at
// Wait(); the stats take their time once they completed. Only stats() used to drain the queue,
// so a process that never asks for stats (nf-eval, nf-generate: a tensor-parallel generation
// waits for an all-reduce per layer and token) grew it by one entry, three CUDA events, per
// operation for the whole run. Now every Push first settles the completed entries at the front
// (the operations complete in issue order on the one communication stream, so the front is the
// oldest), and an entry still pending when the queue is at capacity is dropped unaccounted
// (counted in dropped()): its time is lost to the stats, never its completion, which the
// watchdog tracks separately. Pure host logic, templated on the entry and the settle step so
// that tests run it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

namespace nf::parallel {

template <typename T>
class SettlingQueue {
 public:
  // The most entries kept: far more than the operations one step has in flight (a bucketed
  // data-parallel backward, a pipeline's transfers), so only a queue nobody settles reaches it.
  static constexpr size_t kDefaultCapacity = 4096;

  explicit SettlingQueue(size_t capacity = kDefaultCapacity)
      : capacity_(capacity > 0 ? capacity : 1) {}

  // Settles what completed, then appends `entry`, dropping the oldest pending entry when full.
  // settle(const T&) returns true once the entry's operation completed (and accounts for it),
  // false while it still runs (or failed: the watchdog reports that).
  template <typename Settle>
  void Push(T entry, Settle&& settle) {
    SettleCompleted(settle);
    if (entries_.size() >= capacity_) {
      entries_.pop_front();
      ++dropped_;
    }
    entries_.push_back(std::move(entry));
  }

  // Pops the completed entries at the front, in order, stopping at the first still pending.
  template <typename Settle>
  void SettleCompleted(Settle&& settle) {
    while (!entries_.empty() && settle(entries_.front())) entries_.pop_front();
  }

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  bool empty() const { return entries_.empty(); }
  // Entries dropped unsettled because the queue was full.
  int64_t dropped() const { return dropped_; }
  void clear() { entries_.clear(); }

 private:
  size_t capacity_;
  std::deque<T> entries_;
  int64_t dropped_ = 0;
};

}  // namespace nf::parallel
