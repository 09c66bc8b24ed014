// Tests of parallel/process_groups.h under mpirun with 8 ranks: for several layouts, every
// group's communicator has exactly the members the topology computes (checked by MPI itself:
// an all-reduce of world ranks over each group), the embedding group is absent on middle
// stages, refusals come before any communication, local-rank discovery agrees with the node
// split, and the node group and LowestRankError work across ranks.
#include <cstdlib>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mpi_test_util.h"
#include "parallel/agreement.h"
#include "parallel/process_groups.h"
#include "parallel/watchdog.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::nf::testing::TensorOf;
using ::nf::testing::Values;

int WorldSize() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

class ProcessGroupsTest : public ::testing::TestWithParam<ParallelSizes> {};

TEST_P(ProcessGroupsTest, EveryGroupHasTheTopologysMembers) {
  const ParallelSizes sizes = GetParam();
  // Every layout below fits the 8 ranks CTest starts this program with.
  ASSERT_EQ(WorldSize() % (sizes.tp * sizes.pp), 0) << "run with a multiple of 4 ranks";
  auto groups = CreateProcessGroups(sizes, testing::MpiTestOptions());
  NF_ASSERT_OK(groups);
  const Topology& t = groups->topology;
  EXPECT_EQ(RankLabel(), t.ToString());
  EXPECT_EQ(groups->world->size(), WorldSize());
  EXPECT_EQ(groups->world->name(), "world");
  for (int k = 0; k < static_cast<int>(GroupKind::kCount); ++k) {
    const auto kind = static_cast<GroupKind>(k);
    SCOPED_TRACE(GroupKindName(kind));
    Communicator* comm = groups->group(kind);
    if (t.group(kind).empty()) {
      EXPECT_EQ(comm, nullptr);
      continue;
    }
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->name(), GroupKindName(kind));
    EXPECT_EQ(comm->size(), static_cast<int>(t.group(kind).size()));
    EXPECT_EQ(comm->rank(), t.rank_in_group(kind));
    const auto& members = t.group(kind);
    const Tensor sum = TensorOf(DType::kI64, {1}, {static_cast<double>(t.world_rank())});
    const Tensor max = TensorOf(DType::kI64, {1}, {static_cast<double>(t.world_rank())});
    NF_ASSERT_OK(comm->AllReduce(sum, ReduceOp::kSum));
    NF_ASSERT_OK(comm->AllReduce(max, ReduceOp::kMax));
    EXPECT_EQ(Values(sum)[0], std::accumulate(members.begin(), members.end(), 0));
    EXPECT_EQ(Values(max)[0], members.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ProcessGroupsTest,
                         ::testing::Values(ParallelSizes{.tp = 2, .pp = 2, .dp = 0},
                                           ParallelSizes{.tp = 2, .pp = 2, .dp = 2},
                                           ParallelSizes{.tp = 1, .pp = 4, .dp = 0},
                                           ParallelSizes{.tp = 4, .pp = 1, .dp = 0},
                                           ParallelSizes{.tp = 1, .pp = 1, .dp = 0}),
                         [](const ::testing::TestParamInfo<ParallelSizes>& info) {
                           return absl::StrCat("tp", info.param.tp, "_pp", info.param.pp, "_dp",
                                               info.param.dp);
                         });

TEST(ProcessGroupsRefusalTest, EveryRankRefusesBeforeCommunicating) {
  const int world = WorldSize();
  const int tp = world + 1;  // never divides the world
  testing::ExpectInvalidArgument(
      CreateProcessGroups({.tp = tp}).status(),
      absl::StrCat("world size ", world, " is not divisible by tensor_parallel ", tp));
}

TEST(LocalRankTest, EnvironmentAndNodeSplitAgree) {
  const char* ompi = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ASSERT_NE(ompi, nullptr) << "expected to run under Open MPI's mpirun";
  auto from_env = DiscoverLocalRank();
  NF_ASSERT_OK(from_env);
  EXPECT_EQ(*from_env, std::atoi(ompi));
  // Without the launchers' variables: the MPI_COMM_TYPE_SHARED split (collective). One node,
  // so the local rank is the world rank.
  const std::string saved = ompi;
  const char* slurm = std::getenv("SLURM_LOCALID");
  const std::string saved_slurm = slurm ? slurm : "";
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  auto from_split = DiscoverLocalRank();
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", saved.c_str(), 1);
  if (slurm) setenv("SLURM_LOCALID", saved_slurm.c_str(), 1);
  NF_ASSERT_OK(from_split);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(*from_split, rank);
  EXPECT_EQ(*from_split, *from_env);
}

TEST(NodeGroupTest, HoldsEveryRankOfThisNode) {
  // One machine: the node is the world, ordered by world rank.
  auto node = CreateNodeGroup(testing::MpiTestOptions());
  NF_ASSERT_OK(node);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ((*node)->name(), "node");
  EXPECT_EQ((*node)->size(), WorldSize());
  EXPECT_EQ((*node)->rank(), rank);
}

// Every rank returns the error of the lowest rank that has one, code and message, or OK.
TEST(LowestRankErrorTest, EveryRankGetsTheLowestRanksError) {
  auto groups = CreateProcessGroups({}, testing::MpiTestOptions());
  NF_ASSERT_OK(groups);
  Communicator& world = *groups->world;
  NF_EXPECT_OK(LowestRankError(absl::OkStatus(), world));
  // Odd ranks fail, each with its own message: rank 1's wins.
  const absl::Status local =
      world.rank() % 2 == 1
          ? absl::ResourceExhaustedError(absl::StrCat("not enough memory on rank ", world.rank()))
          : absl::OkStatus();
  const absl::Status agreed = LowestRankError(local, world);
  EXPECT_EQ(agreed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(agreed.message(), "not enough memory on rank 1");
  // A message longer than the 4 KiB carried is cut, not garbled.
  const std::string long_message(10000, 'x');
  const absl::Status cut = LowestRankError(
      world.rank() == world.size() - 1 ? absl::InternalError(long_message) : absl::OkStatus(),
      world);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cut.message(), std::string(4096, 'x'));
}

}  // namespace
}  // namespace nf::parallel
