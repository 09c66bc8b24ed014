// Why a run stops before train_iters, agreed by every rank at a step boundary:
//   SIGTERM / SIGUSR1   a scheduler's warning (Slurm's --signal, a preemption, kill)
//   exit_duration_mins  the wall-clock budget of this job is spent
//   exit_interval       the step is a multiple of it
// The run then saves a checkpoint and exits with kExitResume, which tells a wrapper (Slurm
// requeue, a retry loop) to start the same command again: it resumes from `latest`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/train_config.pb.h"
#include "parallel/communicator.h"

namespace nf::launcher {

// nf-launch's exit code after a requested stop with a checkpoint saved: "resume me".
inline constexpr int kExitResume = 3;

// Installs the SIGTERM and SIGUSR1 handlers (once per process; they only record the signal).
void InstallStopSignalHandlers();

class StopRequests {
 public:
  explicit StopRequests(const TrainOptions& train);

  // Collective over `world` (one 4-byte all-reduce), after every step: the reason to stop after
  // `step`, the same on every rank, or "" to go on. A signal seen by any rank stops all.
  absl::StatusOr<std::string> Check(int64_t step, parallel::Communicator& world);

 private:
  double exit_duration_minutes_;
  int64_t exit_interval_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace nf::launcher
