// Reading the flight records the ranks of a run wrote (flight_dumps.h: RUN/flight/
// rank_NNNNN.jsonl) back for nf-flight. A record is a file a user hands in, so it is read as
// hostile: its size is bounded before it is read, every count before anything is allocated for
// it, and every value is range-checked before the analysis uses it (as an index, in a
// subtraction, in a message). A set of records must be of one run: one launch, one world, one
// record per rank, groups whose members agree; records of another run in the same directory
// (an earlier launch of the run directory) are refused rather than merged into phantom ranks.
// Each refusal is one line naming the file, the field and what to do.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "parallel/flight_recorder.h"
#include "parallel/process_stalls.h"

namespace nf::parallel {

// One rank's record as read back.
struct FlightRecord {
  std::string file;  // where it was read from, for messages
  int rank = -1;
  int world_size = 0;
  // The launch it is of (FlightDumpConfig::run_started_ns); 0 in records written before the
  // records named their launch.
  int64_t run_started_ns = 0;
  std::string label, host, reason;
  int64_t time_ns = 0;  // when it was written
  int64_t step = -1;
  std::vector<ProcessStall> stalls;  // when the process did not run (process_stalls.h)
  std::vector<FlightGroup> groups;
  std::vector<FlightEntry> entries;  // oldest first
};

// The groups `record` lists by "group/backend", each its latest registration: a process that
// trained twice lists the communicators of both trainings, and the later ones are its own now.
std::map<std::string, const FlightGroup*> CurrentGroups(const FlightRecord& record);

// More ranks than any job has had (the largest reported ones: about 100k GPUs); a record's
// world group lists every rank, which this keeps within kMaxFlightHeaderBytes.
inline constexpr int kMaxFlightWorldSize = 1 << 18;
// A record of a million operations (FlightRecorder's capacity is 4096 by default) is ~250 MB.
inline constexpr int64_t kMaxFlightRecordBytes = int64_t{256} << 20;
// The header line (its world group is the longest part: 7 bytes a rank at kMaxFlightWorldSize).
inline constexpr int64_t kMaxFlightHeaderBytes = int64_t{4} << 20;
// One operation's line is about 250 bytes.
inline constexpr int64_t kMaxFlightEntryBytes = 4096;
// A record may be this far ahead of the reader's clock (nodes' clocks differ a little); a time
// further ahead is refused: it is forged, or its node's clock is wrong, and either way it would
// make every other record look stale.
inline constexpr absl::Duration kFlightClockSkew = absl::Minutes(1);

// `text` (the record of `where`, a file name for messages) as FlightRecord, every value checked;
// InvalidArgument "where:line: what" otherwise. Times after now_ns + kFlightClockSkew are
// refused.
absl::StatusOr<FlightRecord> ParseFlightRecord(absl::string_view text, absl::string_view where,
                                               int64_t now_ns);

// `records` by rank, once they are shown to be of one run: one world_size and launch, one record
// per rank, and each group (name and backend) the same members in every record that lists it
// for a rank (CurrentGroups). FailedPrecondition naming the two files and what differs otherwise.
absl::StatusOr<std::vector<FlightRecord>> MergeFlightRecords(std::vector<FlightRecord> records);

// Every rank_NNNNN.jsonl in `dir` (RUN/flight; other names are not records and are passed over),
// read, parsed and merged as above; a record whose 'rank' is not its file's is refused. NotFound
// when the directory cannot be read or holds no record.
//
// A restarted run (a requeued job) leaves the records of its earlier launches where a rank of
// the new one wrote nothing (a rank on a lost node): those of the same world_size but an earlier
// run_started_ns are set aside, their files listed in `earlier` when given, and the newest
// launch's records are merged, so that such a rank reads as "no record". Records of another
// world_size are of another run and refused.
absl::StatusOr<std::vector<FlightRecord>> ReadFlightRecords(
    const std::filesystem::path& dir, std::vector<std::string>* earlier = nullptr);

}  // namespace nf::parallel
