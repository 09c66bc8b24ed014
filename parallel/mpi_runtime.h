// Process-wide MPI lifetime: one initialisation, one finalisation at exit, and the job-wide
// abort used on errors that not every rank hits.
#pragma once

#include "absl/status/status.h"

namespace nf::parallel {

// Initialises MPI on the first call, asking for MPI_THREAD_MULTIPLE and accepting
// MPI_THREAD_SERIALIZED (then the caller keeps MPI calls on one thread at a time), and
// registers MPI_Finalize to run at exit. Later calls, from any thread, return the first
// call's result. When something else initialised MPI first, it is used as is and left to that
// code to finalise. argc/argv may be null.
absl::Status InitMpi(int* argc = nullptr, char*** argv = nullptr);

// True once MPI is initialised and not yet finalised.
bool MpiActive();

// Whether MPI was initialised with MPI_THREAD_MULTIPLE (false before InitMpi).
bool MpiThreadMultiple();

// This process's rank in MPI_COMM_WORLD; -1 when MPI is not active.
int MpiWorldRank();

// This process's rank as an MPI launcher (mpirun, srun with PMI/PMIx) announces it in the
// environment before MPI starts; -1 when no launcher started it.
int LauncherRank();

// The number of processes an MPI launcher started; 0 when none did.
int LauncherSize();

// Whether this process prints the errors every rank meets alike (command line, configuration):
// rank 0 of a job, or a process no launcher started. Said once, not by every rank.
inline bool PrintsSharedErrors() { return LauncherRank() <= 0; }

// Returns run(argc, argv); an exception no status was expected for becomes one line,
// "<program>: out of memory (...)" for std::bad_alloc or "<program>: <what()>", and exit code 1
// (for the whole job under an MPI launcher, which AbortJob ends), never std::terminate's abort.
int RunCatchingExceptions(const char* program, int (*run)(int, char**), int argc, char** argv);

// Ends every process of the job with `exit_code`: MPI_Abort(MPI_COMM_WORLD) when MPI is active,
// else _Exit. An error that only some ranks hit must end the job this way: a plain exit()
// would run MPI_Finalize, which waits for the ranks still blocked on this one.
[[noreturn]] void AbortJob(int exit_code);

}  // namespace nf::parallel
