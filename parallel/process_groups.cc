#include "parallel/process_groups.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "parallel/local_communicator.h"
#include "parallel/mpi_runtime.h"
#include "parallel/placement.h"
#include "parallel/watchdog.h"

namespace nf::parallel {

Communicator* ProcessGroups::group(GroupKind kind) const {
  switch (kind) {
    case GroupKind::kTensor:
      return tp.get();
    case GroupKind::kData:
      return dp.get();
    case GroupKind::kPipeline:
      return pp.get();
    case GroupKind::kModel:
      return mp.get();
    case GroupKind::kEmbedding:
      return embedding.get();
    case GroupKind::kCount:
      break;
  }
  return nullptr;
}

ProcessGroups SingleProcessGroups() {
  ProcessGroups groups;
  groups.hosts = {ThisHostName()};
  groups.world = std::make_unique<LocalCommunicator>("world");
  std::unique_ptr<Communicator>* slots[] = {&groups.tp, &groups.dp, &groups.pp, &groups.mp,
                                            &groups.embedding};
  for (int k = 0; k < static_cast<int>(GroupKind::kCount); ++k) {
    *slots[k] =
        std::make_unique<LocalCommunicator>(std::string(GroupKindName(static_cast<GroupKind>(k))));
  }
  return groups;
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(ParallelSizes sizes,
                                                  MpiCommunicator::Options options) {
  NF_RETURN_IF_ERROR(InitMpi());
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  ProcessGroups groups;
  NF_ASSIGN_OR_RETURN(groups.topology, Topology::Create(world_size, world_rank, sizes));
  const Topology& topology = groups.topology;
  SetRankLabel(topology.ToString());

  NF_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> world, MpiCommunicator::World(options));
  NF_ASSIGN_OR_RETURN(groups.hosts, GatherHostNames(*world));
  SetRankHosts(groups.hosts);
  std::unique_ptr<Communicator>* slots[] = {&groups.tp, &groups.dp, &groups.pp, &groups.mp,
                                            &groups.embedding};
  for (int k = 0; k < static_cast<int>(GroupKind::kCount); ++k) {
    const auto kind = static_cast<GroupKind>(k);
    const int index = topology.group_index(kind);
    NF_ASSIGN_OR_RETURN(
        std::unique_ptr<MpiCommunicator> comm,
        world->Split(index < 0 ? MpiCommunicator::kNoGroup : index, topology.rank_in_group(kind),
                     std::string(GroupKindName(kind))));
    // The arithmetic and MPI must agree on every member; anything else is a bug here.
    const std::vector<int> no_ranks;
    const std::vector<int>& got = comm ? comm->world_ranks() : no_ranks;
    if (got != topology.group(kind)) {
      return absl::InternalError(absl::StrCat(topology.ToString(), ": the ", GroupKindName(kind),
                                              " group has ranks [", absl::StrJoin(got, ", "),
                                              "] but the topology says [",
                                              absl::StrJoin(topology.group(kind), ", "), "]"));
    }
    *slots[k] = std::move(comm);
  }
  groups.world = std::move(world);
  return groups;
}

namespace {

// The ranks of the world on this rank's node, ordered by world rank (the caller frees it).
// Initialises MPI when needed; collective over the world.
absl::StatusOr<MPI_Comm> SplitByNode() {
  NF_RETURN_IF_ERROR(InitMpi());
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS) {
    return absl::InternalError("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  }
  return node;
}

}  // namespace

const char* LocalRankSource() {
  for (const char* variable : kLocalRankVariables) {
    if (std::getenv(variable) != nullptr) return variable;
  }
  return "MPI_COMM_TYPE_SHARED";
}

absl::StatusOr<int> DiscoverLocalRank() {
  for (const char* variable : kLocalRankVariables) {
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    int rank = -1;
    if (!absl::SimpleAtoi(value, &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable, "='", value, "' is not a local rank (a non-negative integer)"));
    }
    return rank;
  }
  absl::StatusOr<MPI_Comm> node = SplitByNode();
  if (!node.ok()) {
    return absl::InternalError(
        absl::StrCat("local rank: ", node.status().message(),
                     ", and none of OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, "
                     "PMI_LOCAL_RANK and SLURM_LOCALID is set"));
  }
  int local_rank = 0;
  MPI_Comm_rank(*node, &local_rank);
  MPI_Comm_free(&*node);
  return local_rank;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> CreateNodeGroup(MpiCommunicator::Options options) {
  NF_ASSIGN_OR_RETURN(MPI_Comm node, SplitByNode());
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> group =
      MpiCommunicator::Duplicate(node, "node", options);
  MPI_Comm_free(&node);
  return group;
}

}  // namespace nf::parallel
