// nf-flight: what a hung or failed job's ranks were doing, from their flight records
// (parallel/flight_dumps.h, RUN/flight/rank_*.jsonl).
//
//   nf-flight RUN                 merges every rank's record and says which ranks wait in which
//                                 operation, for whom, and where the ranks diverged
//   nf-flight --request RUN       asks every rank of the running job to write its record now
//                                 (the run goes on); run `nf-flight RUN` a moment later
//
// Exit codes: 0 done, 1 no record to read (or records refused: one line naming the file, the
// field and what to do), 2 bad usage.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "checkpoint/output_path.h"
#include "parallel/flight_analysis.h"
#include "parallel/flight_dumps.h"

namespace {

constexpr char kUsage[] =
    "usage: nf-flight RUN_DIR            what the ranks of a run were doing (RUN_DIR/flight)\n"
    "       nf-flight --request RUN_DIR  asks every rank of a running job to write its record\n";

int Run(int argc, char** argv) {
  const std::string first = argc > 1 ? argv[1] : "";
  if (argc == 3 && first == "--request") {
    const std::filesystem::path dir = std::filesystem::path(argv[2]) / "flight";
    // The error_code form: a name too long or a loop of links is an answer, not an exception.
    std::error_code error;
    if (!std::filesystem::is_directory(dir, error)) {
      std::fprintf(stderr,
                   "nf-flight: %s is not a directory%s: is %s the run directory of a "
                   "running job?\n",
                   dir.c_str(), error ? (" (" + error.message() + ")").c_str() : "", argv[2]);
      return 1;
    }
    // The request file goes into RUN/flight: never into a checkpoint (checkpoint/output_path.h).
    absl::Status requested = nf::checkpoint::CheckOutsideCheckpoints(dir / "REQUEST", "--request");
    if (requested.ok()) requested = nf::parallel::RequestFlightDumps(dir, "nf-flight --request");
    if (!requested.ok()) {
      std::fprintf(stderr, "nf-flight: %s\n", std::string(requested.message()).c_str());
      return 1;
    }
    std::printf("asked every rank to write %s/rank_*.jsonl (they look every 100 ms)\n",
                dir.c_str());
    return 0;
  }
  if (argc != 2 || first.empty() || first[0] == '-') {
    std::fputs(kUsage, first == "--help" || first == "-h" ? stdout : stderr);
    return first == "--help" || first == "-h" ? 0 : 2;
  }
  std::vector<std::string> earlier;
  const auto records =
      nf::parallel::ReadFlightRecords(std::filesystem::path(first) / "flight", &earlier);
  if (!records.ok()) {
    std::fprintf(stderr, "nf-flight: %s\n", std::string(records.status().message()).c_str());
    return 1;
  }
  if (!earlier.empty()) {
    std::sort(earlier.begin(), earlier.end());
    std::printf(
        "set aside %zu record(s) of an earlier launch of this run (%s): their ranks wrote none in "
        "the latest\n",
        earlier.size(), absl::StrJoin(earlier, ", ").c_str());
  }
  for (const std::string& line : nf::parallel::AnalyzeFlight(*records).lines) {
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
