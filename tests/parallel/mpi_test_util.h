// Shared by the MPI tests: the world communicator, with a watchdog deadline short enough that
// a test that desynchronises the ranks (a failed ASSERT skipping a collective on one rank)
// aborts the job with a report instead of running into the CTest timeout.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "parallel/mpi_communicator.h"

namespace nf::testing {

inline parallel::MpiCommunicator::Options MpiTestOptions() {
  return {.watchdog = {.timeout = absl::Seconds(30)}};
}

// The process's world communicator, created on first use (collectively: every rank's first
// test must call it). Never destroyed: MPI_Finalize at exit reclaims it.
inline parallel::MpiCommunicator& World() {
  static parallel::MpiCommunicator* world = [] {
    auto w = parallel::MpiCommunicator::World(MpiTestOptions());
    if (!w.ok()) {
      ADD_FAILURE() << w.status();
      std::abort();
    }
    return w->release();
  }();
  return *world;
}

}  // namespace nf::testing
