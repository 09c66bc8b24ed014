// Writes valid flight dumps into the directory given, the seeds of flight_reader_fuzzer: each
// seed is the records of one run's ranks as FormatFlightRecord (the ranks' own writer) writes
// them, separated by form feeds: a killed rank (one record of two), a pipeline waiting for a
// send, a desynchronised tp x dp schedule and a rank that stopped running.
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "parallel/flight_dumps.h"
#include "parallel/flight_recorder.h"
#include "parallel/process_stalls.h"

namespace {

using nf::parallel::CommOp;
using nf::parallel::FlightRecorder;

constexpr int64_t kRunStarted = 1'760'000'000'000'000'000;

// The records of `ranks` in a world of `world`: for each rank, `act` registers its groups and
// issues its operations on the process's recorder (emptied first), then its record is written.
// Groups stay registered from one rank to the next, as a later record lists them: identical
// groups agree, and each rank's latest is its own.
std::string Run(int world, const std::vector<int>& ranks, const std::function<void(int)>& act,
                const std::vector<nf::parallel::ProcessStall>& stalls = {}) {
  std::string seed;
  for (const int rank : ranks) {
    FlightRecorder::Get().SetCapacity(0);
    FlightRecorder::Get().SetCapacity(16);
    act(rank);
    if (!seed.empty()) seed += '\f';
    seed += nf::parallel::FormatFlightRecord(
        {.dir = "unused",
         .world_rank = rank,
         .world_size = world,
         .run_started_ns = kRunStarted,
         .host = "node0"},
        rank == 0 ? "watchdog: rank 0: stuck" : "requested: x",
        rank == 1 ? stalls : std::vector<nf::parallel::ProcessStall>{});
  }
  return seed;
}

std::vector<int> Upto(int n) {
  std::vector<int> all;
  for (int i = 0; i < n; ++i) all.push_back(i);
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_flight_seeds DIR\n";
    return 2;
  }
  FlightRecorder& recorder = FlightRecorder::Get();
  const auto world_op = [&](int world, CommOp op, int64_t seq, bool completes) {
    recorder.RegisterGroup({.group = "world", .backend = "mpi", .world_ranks = Upto(world)});
    const uint64_t id = recorder.Issued("world", "mpi", seq, op, -1, 8, nf::DType::kF32);
    if (completes) {
      recorder.Completed(id);
    } else {
      recorder.Waiting(id);
    }
  };
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"killed_rank", Run(2, {0}, [&](int) { world_op(2, CommOp::kAllReduce, 5, false); })},
      {"same_collective", Run(2, {0, 1}, [&](int) { world_op(2, CommOp::kAllReduce, 5, false); })},
      {"stopped_rank", Run(2, {0, 1}, [&](int) { world_op(2, CommOp::kAllReduce, 5, false); },
                           {{.start_ns = nf::parallel::WallClockNanos() - 4'000'000'000,
                             .end_ns = nf::parallel::WallClockNanos()}})},
      {"pipeline_send",
       Run(2, {0, 1},
           [&](int rank) {
             recorder.RegisterGroup({.group = "pp", .backend = "mpi", .world_ranks = {0, 1}});
             const int peer = 1 - rank;
             const CommOp op = rank == 0 ? CommOp::kSend : CommOp::kRecv;
             recorder.Completed(recorder.Issued("pp", "mpi", 2, op, peer, 4096, nf::DType::kBF16));
             if (rank == 1) {
               recorder.Waiting(recorder.Issued("pp", "mpi", 3, op, peer, 4096, nf::DType::kBF16));
             }
           })},
      {"desynchronised",
       Run(4, Upto(4),
           [&](int rank) {
             const int tp = rank / 2 * 2;
             recorder.RegisterGroup({.group = "tp", .backend = "mpi", .world_ranks = {tp, tp + 1}});
             recorder.RegisterGroup(
                 {.group = "dp", .backend = "mpi", .world_ranks = {rank % 2, rank % 2 + 2}});
             world_op(4, CommOp::kAllReduce, 16, true);
             if (rank == 1) world_op(4, CommOp::kBarrier, 17, false);
             recorder.Waiting(recorder.Issued(rank < 2 ? "tp" : "dp", "mpi", 4, CommOp::kAllReduce,
                                              -1, 8, nf::DType::kF32));
           })},
  };
  for (const auto& [name, text] : seeds) {
    std::ofstream out(std::string(argv[1]) + "/" + name);
    out << text;
    if (!out.flush()) {
      std::cerr << "make_flight_seeds: cannot write " << argv[1] << "/" << name << "\n";
      return 1;
    }
  }
  return 0;
}
