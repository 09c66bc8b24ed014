// Saying in a few lines, from every rank's flight record (flight_records.h reads them), what a
// hung job is doing: which ranks wait in which operation, which rank they wait for (one that
// left no record, one that never reached the operation, one in another operation, or one that
// stopped running while in the operation the others wait in), and the first operation the
// ranks of a group issued differently (a desynchronised schedule). What `nf-flight RUN` prints.
#pragma once

#include <string>
#include <vector>

#include "parallel/flight_records.h"

namespace nf::parallel {

struct FlightFindings {
  std::vector<std::string> lines;  // what nf-flight prints, the verdict last
  // The ranks the others wait for and that wait for nobody: silent (no record, or one older
  // than the rest), outside any operation, or those that issued a different collective. Of
  // ranks all in one collective, those whose process stopped running while the job hung.
  std::vector<int> culprits;
  bool desynchronised = false;  // the ranks of a group issued different collectives
};

// `records`: one run's, as MergeFlightRecords (or ReadFlightRecords) returns them. The work and
// the lines are bounded by what the records hold, whatever their world_size says (ranks
// without a record are named in ranges).
FlightFindings AnalyzeFlight(const std::vector<FlightRecord>& records);

}  // namespace nf::parallel
