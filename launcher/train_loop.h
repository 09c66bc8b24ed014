// The training loop of nf-launch: prepares the run directory, trains for train.train_iters
// steps, appends one JSON record per step to RUN/log.jsonl and prints a progress line every
// train.log_interval steps.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/run_dir_lock.h"
#include "launcher/train_config.pb.h"
#include "parallel/process_groups.h"

namespace nf::launcher {

enum class RunEnd {
  kFinished,         // train_iters reached
  kStoppedToResume,  // a signal, exit_duration_mins or exit_interval: checkpoint saved
};

// RUN/finished.json: {"step":N,"train_iters":N}, written (atomically) when a run reaches
// train_iters, after its last checkpoint, and removed when a run starts. Exit code 0 alone does
// not prove that training ran: a job launcher may report 0 for tasks it never started (srun's
// "task 0 launch failed"), so deploy/slurm/run-requeued.sh takes 0 as done only beside it.
inline constexpr char kFinishedFile[] = "finished.json";

// Creates `run_dir` if needed and writes RUN/config.pbtxt (the resolved configuration); the
// log is appended to; RUN/finished.json (kFinishedFile) marks a run that reached train_iters.
// Progress lines go to `console`. With `groups` (an MPI job; null: one process) every rank trains
// and world rank 0 alone writes the files and the console. Continues from RUN/checkpoints/latest
// when there is one (checkpoint.resume), saves as checkpoint.* says, and stops early, with a
// checkpoint, when StopRequests says so. Install the signal handlers (InstallStopSignalHandlers)
// for signals to stop it.
//
// `after_validation`, when given, runs on every rank after each validation (train.samples:
// generate/training_samples.h, which nf-launch links; the loop does not know generation).
//
// Nothing in `run_dir` changes before the resume has loaded (it can refuse the run): then world
// rank 0 takes `lock` (RunDirLock::Check'ed by nf-launch; null in tests, which lock nothing), the
// directory is prepared.
class Trainer;
using AfterValidation = std::function<absl::Status(int64_t step, Trainer& trainer)>;
absl::StatusOr<RunEnd> RunTraining(const TrainConfig& config, const std::string& run_dir,
                                   std::ostream& console, parallel::ProcessGroups* groups = nullptr,
                                   AfterValidation after_validation = nullptr,
                                   RunDirLock* lock = nullptr);

}  // namespace nf::launcher
