// Reading every rank's flight record (flight_dumps.h) and saying in a few lines what a hung job
// is doing: which ranks wait in which operation, which rank they wait for (one that left no
// record, one that never reached the operation, one in another operation, or one that stopped
// running while in the operation the others wait in), and the first
// operation the ranks of a group issued differently (a desynchronised schedule). What
// `nf-flight RUN` prints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "parallel/flight_recorder.h"
#include "parallel/process_stalls.h"

namespace nf::parallel {

// One rank's record as read back.
struct FlightRecord {
  int rank = -1;
  int world_size = 0;
  std::string label, host, reason;
  int64_t time_ns = 0;  // when it was written
  int64_t step = -1;
  std::vector<ProcessStall> stalls;  // when the process did not run (process_stalls.h)
  std::vector<FlightGroup> groups;
  std::vector<FlightEntry> entries;  // oldest first
};

// `text` as FlightRecord; InvalidArgument naming `where` and the line otherwise.
absl::StatusOr<FlightRecord> ParseFlightRecord(absl::string_view text, absl::string_view where);

// Every RUN/flight/rank_*.jsonl of `dir` (RUN/flight), by rank; NotFound when there is none.
absl::StatusOr<std::vector<FlightRecord>> ReadFlightRecords(const std::filesystem::path& dir);

struct FlightFindings {
  std::vector<std::string> lines;  // what nf-flight prints, the verdict last
  // The ranks the others wait for and that wait for nobody: silent (no record, or one older
  // than the rest), outside any operation, or those that issued a different collective. Of
  // ranks all in one collective, those whose process stopped running while the job hung.
  std::vector<int> culprits;
  bool desynchronised = false;  // the ranks of a group issued different collectives
};

FlightFindings AnalyzeFlight(const std::vector<FlightRecord>& records);

}  // namespace nf::parallel
