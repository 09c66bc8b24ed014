// When and where a rank writes its flight record (flight_recorder.h): RUN/flight/
// rank_NNNNN.jsonl, replaced whole (written aside, then renamed) at each dump.
//
//   - the watchdog gives up on an operation: the rank dumps, then asks every other rank to dump
//     too (it writes RUN/flight/REQUEST) and waits up to kPeerDumpGrace for their records
//     before the job ends: the ranks stuck with it are alive and answer; a dead or stopped one
//     leaves no record, which is itself the finding;
//   - SIGUSR2, or a new RUN/flight/REQUEST (from another rank or `nf-flight --request RUN`): a
//     dump, and the run goes on;
//   - SIGTERM (a launcher ending the job after another rank died): a dump, then the stop the
//     signal asks for (launcher/stop_requests.h);
//   - a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT): a dump (waited for up to 2 s),
//     then the signal's previous handling.
// A thread of its own writes every dump, so a rank blocked in a collective still answers.
//
// The file: a header line {"rank", "world_size", "run_started_ns" (the launch: run_start.h),
// "label", "host", "reason", "time_ns", "step", "capacity", "dropped", "stalls": [{"start_ns",
// "end_ns"}] (the spans in which the process did not run: process_stalls.h), "groups":
// [{"group", "backend", "ranks"}]}, then one line per operation, oldest first: {"id", "group",
// "backend", "seq", "op", "peer", "bytes", "dtype", "step", "state", "issued_ns", "waiting_ns",
// "completed_ns"}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "parallel/process_stalls.h"

namespace nf::parallel {

inline constexpr absl::Duration kPeerDumpGrace = absl::Seconds(5);

struct FlightDumpConfig {
  std::filesystem::path dir;  // RUN/flight, shared by every rank
  int world_rank = 0;
  int world_size = 1;
  // Which launch this is (run_start.h): the same on every rank, so that records of two launches
  // in one directory are told apart.
  int64_t run_started_ns = 0;
  std::string host;
};

// Creates `config.dir`, starts the dumping thread and installs the handlers of SIGUSR2 and the
// fatal signals and the watchdog's expiry hook; a later call (a process that trains twice)
// only replaces the configuration.
absl::Status StartFlightDumps(const FlightDumpConfig& config);

// Writes this rank's record now (after StartFlightDumps; FailedPrecondition before).
absl::Status DumpFlightRecord(absl::string_view reason);

// The records this process has written so far (a metric: normformer_flight_records_total).
int64_t FlightRecordsWritten();

// Async-signal-safe: has the dumping thread write the record for `signal` (SIGTERM's handler
// calls it). Does nothing before StartFlightDumps.
void RequestFlightDumpFromSignal(int signal);

// Asks every rank of the run in `dir` (RUN/flight) to dump: writes dir/REQUEST.
absl::Status RequestFlightDumps(const std::filesystem::path& dir, absl::string_view reason);

// The path of a rank's record in `dir`.
std::filesystem::path FlightRecordPath(const std::filesystem::path& dir, int world_rank);

// The record as written (header and entries), for tests and the benchmark.
std::string FormatFlightRecord(const FlightDumpConfig& config, absl::string_view reason,
                               absl::Span<const ProcessStall> stalls = {});

}  // namespace nf::parallel
