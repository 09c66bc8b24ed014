// A program that fails on purpose under mpirun, for the tests of how failures end a job
// (expect_failure.sh checks the exit status, the message and the time taken):
//
//   failure_probe_mpi topology <tp> <pp>   every rank creates its process groups with these
//                                          sizes; a refusal is printed and the rank exits 1,
//                                          as nf-launch does
//   failure_probe_mpi all_reduce <seconds> with tp = 2: both ranks all-reduce once at step 6;
//                                          at step 7 rank 1 stops participating (sleeps), so
//                                          rank 0's watchdog must report and abort the job
//   failure_probe_mpi recv <seconds>       the same, with rank 0 waiting to receive from rank 1
//   failure_probe_mpi kill <seconds>       as all_reduce, but rank 1 is killed (SIGKILL) at step
//                                          7: mpirun or rank 0's watchdog must end the job
//   failure_probe_mpi heads <heads> <tp>   every rank creates its groups with tensor_parallel
//                                          tp, then checks a model of `heads` heads (ffn 64)
//                                          against it; a refusal is printed and the rank exits 1
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "core/tensor.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"
#include "parallel/topology.h"
#include "parallel/watchdog.h"

namespace nf::parallel {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", MpiWorldRank(), std::string(status.message()).c_str());
  return 1;
}

int CreateGroups(int tp, int pp) {
  auto groups = CreateProcessGroups({.tp = tp, .pp = pp});
  if (!groups.ok()) return Fail(groups.status());
  std::printf("%s: process groups created\n", groups->topology.ToString().c_str());
  return 0;
}

int CheckHeads(int heads, int tp) {
  auto groups = CreateProcessGroups({.tp = tp});
  if (!groups.ok()) return Fail(groups.status());
  if (absl::Status s = CheckModelDivisibility(heads, 64, tp); !s.ok()) return Fail(s);
  return 0;
}

int StopParticipating(const std::string& op, double seconds) {
  MpiCommunicator::Options options = {.watchdog = {.timeout = absl::Seconds(seconds)}};
  auto groups = CreateProcessGroups({.tp = 2}, options);
  if (!groups.ok()) return Fail(groups.status());
  Communicator& tp = *groups->tp;
  auto tensor = Tensor::HostZeros(DType::kF32, {4});
  if (!tensor.ok()) return Fail(tensor.status());
  SetCurrentStep(6);
  if (absl::Status s = tp.AllReduce(*tensor, ReduceOp::kSum); !s.ok()) return Fail(s);
  SetCurrentStep(7);
  if (tp.rank() == 1 && op == "kill") std::raise(SIGKILL);  // a node lost mid-step
  if (tp.rank() == 1) {
    // Hung: never joins step 7. The watchdog's MPI_Abort on rank 0 ends this process too;
    // returning after the sleep would mean it did not.
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::fprintf(stderr, "rank 1: still alive after 60 s, the job was not aborted\n");
    return 3;
  }
  const absl::Status s = op == "recv" ? tp.Recv(*tensor, 1) : tp.AllReduce(*tensor, ReduceOp::kSum);
  std::fprintf(stderr, "rank 0: %s returned (%s) instead of aborting the job\n", op.c_str(),
               s.ToString().c_str());
  return 4;
}

int Main(int argc, char** argv) {
  if (absl::Status s = InitMpi(&argc, &argv); !s.ok()) return Fail(s);
  const std::string mode = argc > 1 ? argv[1] : "";
  int a = 0, b = 0;
  double seconds = 0;
  if (mode == "topology" && argc == 4 && absl::SimpleAtoi(argv[2], &a) &&
      absl::SimpleAtoi(argv[3], &b)) {
    return CreateGroups(a, b);
  }
  if (mode == "heads" && argc == 4 && absl::SimpleAtoi(argv[2], &a) &&
      absl::SimpleAtoi(argv[3], &b)) {
    return CheckHeads(a, b);
  }
  if ((mode == "all_reduce" || mode == "recv" || mode == "kill") && argc == 3 &&
      absl::SimpleAtod(argv[2], &seconds)) {
    return StopParticipating(mode, seconds);
  }
  std::fprintf(stderr,
               "usage: failure_probe_mpi topology <tp> <pp> | all_reduce <seconds> | "
               "recv <seconds>\n");
  return 2;
}

}  // namespace
}  // namespace nf::parallel

int main(int argc, char** argv) { return nf::parallel::Main(argc, argv); }
