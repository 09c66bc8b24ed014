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

// This process's rank among the job's processes on its node, which picks its GPU: the MPI
// launcher's own variable first, OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun),
// MPI_LOCALRANKID (MPICH's and Intel MPI's Hydra mpirun) or PMI_LOCAL_RANK (Cray PMI and other
// PMI launchers), then SLURM_LOCALID (srun), else the rank in an
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) split of the world, which initialises MPI when
// needed and is collective over the world (under a launcher that sets none of the variables,
// every rank takes that path). The launcher's variable wins over SLURM_LOCALID because an
// mpirun inside sbatch starts its ranks through one Slurm task per node: every rank of a node
// inherits SLURM_LOCALID=0. launcher::CheckOneRankPerGpu refuses a job whose ranks on one
// node still share a local rank, naming the variable it came from (LocalRankSource).
absl::StatusOr<int> DiscoverLocalRank();

// The variables DiscoverLocalRank reads, in the order it prefers them.
inline constexpr const char* kLocalRankVariables[] = {
    "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"};

// Where DiscoverLocalRank takes the local rank from: the first of kLocalRankVariables that is
// set, else "MPI_COMM_TYPE_SHARED" (the split of the world by node).
const char* LocalRankSource();

// The ranks on this rank's node (an MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) split of the
// world, ordered by world rank), named "node": the ranks that share its host memory.
// Initialises MPI when needed; collective over the world.
absl::StatusOr<std::unique_ptr<MpiCommunicator>> CreateNodeGroup(
    MpiCommunicator::Options options = {});

}  // namespace nf::parallel
