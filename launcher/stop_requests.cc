#include "launcher/stop_requests.h"

#include <csignal>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "parallel/flight_dumps.h"

namespace nf::launcher {
namespace {

volatile std::sig_atomic_t received_signal = 0;

// SIGTERM also has the flight record written (a launcher ends the job so after a rank died,
// and a rank blocked in a collective never reaches the next stop check).
extern "C" void RecordSignal(int signal) {
  received_signal = signal;
  if (signal == SIGTERM) parallel::RequestFlightDumpFromSignal(signal);
}

// Reasons, as bits of the all-reduced word: the highest set bit names the reason reported.
enum Reason : int32_t { kNone = 0, kInterval = 1, kDuration = 2, kSigusr1 = 4, kSigterm = 8 };

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

StopRequests::StopRequests(const TrainOptions& train)
    : exit_duration_minutes_(train.exit_duration_mins()),
      exit_interval_(train.exit_interval()),
      start_(std::chrono::steady_clock::now()) {}

absl::StatusOr<std::string> StopRequests::Check(int64_t step, parallel::Communicator& world) {
  int32_t reasons = kNone;
  if (received_signal == SIGTERM) reasons |= kSigterm;
  if (received_signal == SIGUSR1) reasons |= kSigusr1;
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60.0;
  if (exit_duration_minutes_ > 0 && minutes >= exit_duration_minutes_) reasons |= kDuration;
  if (exit_interval_ > 0 && step % exit_interval_ == 0) reasons |= kInterval;
  NF_ASSIGN_OR_RETURN(const Tensor word, Tensor::HostZeros(DType::kI32, {1}));
  word.data<int32_t>()[0] = reasons;
  // Max over the ranks: nonzero when any rank has a reason, and its highest set bit is the
  // highest-priority reason any rank has (the one reported).
  NF_RETURN_IF_ERROR(world.AllReduce(word, parallel::ReduceOp::kMax));
  const int32_t agreed = word.data<int32_t>()[0];
  if (agreed & kSigterm) return std::string("received SIGTERM");
  if (agreed & kSigusr1) return std::string("received SIGUSR1");
  if (agreed & kDuration) {
    return absl::StrFormat("train.exit_duration_mins (%g) reached", exit_duration_minutes_);
  }
  if (agreed & kInterval) return absl::StrCat("train.exit_interval (", exit_interval_, ") reached");
  return std::string();
}

}  // namespace nf::launcher
