// The flight recorder: every rank keeps its last N communication operations (PyTorch's NCCL
// flight recorder, for every communicator of normformer), so that a hung job can say which
// operation each rank is stuck in. Each operation is recorded when it is issued, with its
// number on its communicator (`seq`: the n-th operation this rank issued there), the group,
// the backend, the operation, its peer, bytes, dtype and step, then marked waiting (the host
// waits for it: MPI) and completed, each with the wall-clock time, so records of different
// ranks line up.
//
// The record is written to RUN/flight/rank_NNNNN.jsonl (FlightDumps, flight_dumps.h) when the
// watchdog gives up, on a fatal signal, on SIGTERM and on request (SIGUSR2, or RUN/flight/
// REQUEST written by any rank or by `nf-flight --request`); `nf-flight RUN` reads every rank's
// and says what happened (flight_analysis.h).
//
// Cost: a mutex and a few stores per operation (bench/flight_recorder_bench.cc measures it);
// capacity 0 turns recording off.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "parallel/communicator.h"

namespace nf::parallel {

enum class FlightState : uint8_t { kIssued, kWaiting, kCompleted };
absl::string_view FlightStateName(FlightState state);  // "issued", "waiting", "completed"

struct FlightEntry {
  uint64_t id = 0;      // 1, 2, ... in issue order over the process
  char group[16] = {};  // the communicator's name ("tp", "dp", "world", ...)
  char backend[8] = {};
  int64_t seq = 0;  // the operation's number on its communicator, from 1
  CommOp op = CommOp::kAllReduce;
  int peer = -1;  // world rank of a send's or receive's peer, or of a broadcast's root; else -1
  int64_t bytes = 0;
  DType dtype = DType::kF32;
  int64_t step = -1;  // the training step (watchdog.h's CurrentStep)
  FlightState state = FlightState::kIssued;
  int64_t issued_ns = 0, waiting_ns = 0, completed_ns = 0;  // wall clock; 0 until reached
};

// A communicator's members, for the analysis (which ranks should have arrived).
struct FlightGroup {
  std::string group, backend;
  std::vector<int> world_ranks;  // in group-rank order
};

class FlightRecorder {
 public:
  // Keeps the last kDefaultCapacity operations until SetCapacity says otherwise.
  static constexpr int64_t kDefaultCapacity = 4096;

  // The process's recorder.
  static FlightRecorder& Get();

  // Keeps the last `entries` operations from now on (0: records nothing); forgets the rest.
  void SetCapacity(int64_t entries);
  int64_t capacity() const;

  void RegisterGroup(FlightGroup group);

  // Records an operation just issued; returns its id for Waiting and Completed (0 when
  // recording is off). Names longer than the entry's fields are cut.
  uint64_t Issued(absl::string_view group, absl::string_view backend, int64_t seq, CommOp op,
                  int peer, int64_t bytes, DType dtype);
  // Marks an operation; an id that left the ring (or 0) is ignored.
  void Waiting(uint64_t id);
  void Completed(uint64_t id);

  // The operations kept, oldest first, and those that left the ring so far.
  std::vector<FlightEntry> Entries() const;
  int64_t dropped() const;
  std::vector<FlightGroup> Groups() const;

 private:
  FlightRecorder();
  FlightEntry* Find(uint64_t id);  // under mutex_

  mutable std::mutex mutex_;
  std::vector<FlightEntry> ring_;
  uint64_t next_id_ = 1;
  std::vector<FlightGroup> groups_;
};

// Nanoseconds since the Unix epoch (CLOCK_REALTIME): comparable across nodes with synchronised
// clocks, which is what the records of different ranks are merged on.
int64_t WallClockNanos();

}  // namespace nf::parallel
