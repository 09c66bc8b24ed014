// The communicators of one rank of an MPI job: the world and this rank's tp, dp, pp, mp and
// embedding groups of the topology (topology.h), and which of its node's devices the rank
// drives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/topology.h"

namespace nf::parallel {

struct ProcessGroups {
  Topology topology;
  std::vector<std::string> hosts;  // the host of every world rank (parallel/placement.h)
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp, dp, pp, mp;
  std::unique_ptr<Communicator> embedding;  // null on middle pipeline stages

  // The communicator of `kind`; null only for kEmbedding on a middle stage.
  Communicator* group(GroupKind kind) const;
};

// Initialises MPI when needed and splits MPI_COMM_WORLD into this rank's groups (one
// MPI_Comm_split per kind, color = the group's index). Collective over the world: every rank
// calls it, with the same sizes. Sizes that do not fit the world are refused on every rank
// alike, before any communication, with Topology::Create's message. Sets the watchdog's rank
// label to "rank R (tp=.., dp=.., pp=..)" and gathers every rank's host for it.
absl::StatusOr<ProcessGroups> CreateProcessGroups(ParallelSizes sizes,
                                                  MpiCommunicator::Options options = {});

// The groups of a job of one process: every group is a LocalCommunicator (no MPI needed).
ProcessGroups SingleProcessGroups();

// This process's rank among the job's processes on its node, which picks its GPU:
// OMPI_COMM_WORLD_LOCAL_RANK (set by Open MPI's mpirun), else SLURM_LOCALID (srun), else the
// rank in an MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) split of the world, which initialises
// MPI when needed and is collective over the world (under a launcher that sets neither
// variable, every rank takes that path).
absl::StatusOr<int> DiscoverLocalRank();

// The ranks on this rank's node (an MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) split of the
// world, ordered by world rank), named "node": the ranks that share its host memory.
// Initialises MPI when needed; collective over the world.
absl::StatusOr<std::unique_ptr<MpiCommunicator>> CreateNodeGroup(
    MpiCommunicator::Options options = {});

}  // namespace nf::parallel
