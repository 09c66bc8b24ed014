// parallel/placement.h's pure parts: which groups of a layout span nodes, and the launcher's
// placement line, for hosts laid out as mpirun's --map-by slot and --map-by node would.
#include "parallel/placement.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::parallel {
namespace {

Topology Layout(int world, ParallelSizes sizes) {
  absl::StatusOr<Topology> topology = Topology::Create(world, 0, sizes);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return *topology;
}

// Ranks 0-1 on n0, 2-3 on n1 (--map-by slot, Slurm's block distribution).
const std::vector<std::string> kBlocks = {"n0", "n0", "n1", "n1"};
// Ranks 0, 2 on n0, 1, 3 on n1 (--map-by node, cyclic).
const std::vector<std::string> kCyclic = {"n0", "n1", "n0", "n1"};

TEST(PlacementTest, TensorGroupsOfConsecutiveRanksStayOnTheirNode) {
  const Topology tp2_pp2 = Layout(4, {.tp = 2, .pp = 2, .dp = 1});
  EXPECT_FALSE(GroupsSpanNodes(tp2_pp2, GroupKind::kTensor, kBlocks));
  EXPECT_TRUE(GroupsSpanNodes(tp2_pp2, GroupKind::kPipeline, kBlocks));
  EXPECT_TRUE(GroupsSpanNodes(tp2_pp2, GroupKind::kTensor, kCyclic));
  EXPECT_FALSE(GroupsSpanNodes(tp2_pp2, GroupKind::kPipeline, kCyclic));
  EXPECT_EQ(DescribePlacement(tp2_pp2, kBlocks),
            "placement: 4 ranks on 2 nodes (n0: ranks 0-1; n1: ranks 2-3); within a node: tp; "
            "across nodes: pp");
  EXPECT_EQ(DescribePlacement(tp2_pp2, kCyclic),
            "placement: 4 ranks on 2 nodes (n0: ranks 0, 2; n1: ranks 1, 3); within a node: pp; "
            "across nodes: tp");
}

TEST(PlacementTest, GroupsOfOneAreLeftOutAndOneNodeSaysSo) {
  const Topology tp2_dp2 = Layout(4, {.tp = 2, .pp = 1, .dp = 2});
  EXPECT_EQ(DescribePlacement(tp2_dp2, kBlocks),
            "placement: 4 ranks on 2 nodes (n0: ranks 0-1; n1: ranks 2-3); within a node: tp; "
            "across nodes: dp");
  EXPECT_EQ(DescribePlacement(tp2_dp2, {"a", "a", "a", "a"}),
            "placement: 4 ranks on 1 node (a: ranks 0-3)");
}

TEST(PlacementTest, NodesAreListedByTheirLowestRankWithRunsOfRanks) {
  const Topology dp6 = Layout(6, {.tp = 1, .pp = 1, .dp = 6});
  EXPECT_EQ(DescribePlacement(dp6, {"b", "b", "a", "b", "b", "a"}),
            "placement: 6 ranks on 2 nodes (b: ranks 0-1, 3-4; a: ranks 2, 5); across nodes: dp");
}

TEST(PlacementTest, ThisHostHasAName) { EXPECT_FALSE(ThisHostName().empty()); }

}  // namespace
}  // namespace nf::parallel
