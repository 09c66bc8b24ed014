#include "parallel/mpi_runtime.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"

namespace nf::parallel {
namespace {

struct Runtime {
  std::once_flag once;
  absl::Status status;
  bool thread_multiple = false;
};

Runtime& GetRuntime() {
  static Runtime* runtime = new Runtime();  // never destroyed: used from atexit handlers
  return *runtime;
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

absl::string_view ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

absl::Status Initialize(int* argc, char*** argv, bool* thread_multiple) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return absl::FailedPreconditionError("MPI was already finalised");
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      return absl::InternalError("MPI_Init_thread failed");
    }
    std::atexit(FinalizeAtExit);
  }
  *thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  if (provided < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(
        absl::StrCat("MPI provides ", ThreadLevelName(provided),
                     "; normformer needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE "
                     "(communication may come from a thread other than the one that "
                     "initialised MPI)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InitMpi(int* argc, char*** argv) {
  Runtime& runtime = GetRuntime();
  std::call_once(runtime.once,
                 [&] { runtime.status = Initialize(argc, argv, &runtime.thread_multiple); });
  return runtime.status;
}

bool MpiActive() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

bool MpiThreadMultiple() { return GetRuntime().thread_multiple; }

int MpiWorldRank() {
  if (!MpiActive()) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void AbortJob(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (MpiActive()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this covers a job without MPI
}

int LauncherRank() {
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(variable)) return std::atoi(value);
  }
  return -1;
}

int LauncherSize() {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(variable)) return std::atoi(value);
  }
  return 0;
}

int RunCatchingExceptions(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc& e) {
    std::cerr << program << ": out of memory (" << e.what() << ")\n";
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
  }
  if (LauncherRank() >= 0) AbortJob(1);
  return 1;
}

}  // namespace nf::parallel
