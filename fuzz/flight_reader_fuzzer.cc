// libFuzzer target for the flight-record reader (parallel/flight_records.h) and what nf-flight
// does with what it accepts (parallel/flight_analysis.h): whatever the bytes of a run's
// rank_NNNNN.jsonl files, parsing and merging either refuse them with a status or hand the
// analysis records it can index without a check of its own, and the analysis ends in a verdict
// that names only ranks of the world and prints no control character of the files. ASan and UBSan
// watch the parsing, the merging and the analysis (where the crashes of issue 45 were).
//
// An input is the records of one run directory, separated by form feeds (which a record cannot
// hold: JSON escapes them inside strings); make_flight_seeds writes valid dumps as seeds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "parallel/flight_analysis.h"
#include "parallel/flight_records.h"

namespace {

// The reader's clock: far enough ahead (2116) that the seeds' real times stay in the past.
constexpr int64_t kNow = int64_t{1} << 62;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::vector<nf::parallel::FlightRecord> records;
  int file = 0;
  for (absl::string_view text : absl::StrSplit(bytes, '\f')) {
    auto record = nf::parallel::ParseFlightRecord(text, absl::StrCat("rank_", file++), kNow);
    // The others go on to the merge (ReadFlightRecords refuses the directory instead), so that
    // one bad record among good ones still reaches the analysis.
    if (record.ok()) records.push_back(*std::move(record));
  }
  auto merged = nf::parallel::MergeFlightRecords(std::move(records));
  if (!merged.ok()) return 0;
  const int world = merged->empty() ? 0 : merged->front().world_size;
  const nf::parallel::FlightFindings findings = nf::parallel::AnalyzeFlight(*merged);
  if (findings.lines.empty() || findings.lines.back().rfind("verdict: ", 0) != 0) std::abort();
  for (const int rank : findings.culprits) {
    if (rank < 0 || rank >= world) std::abort();
  }
  for (const std::string& line : findings.lines) {
    for (const char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
    }
  }
  return 0;
}
