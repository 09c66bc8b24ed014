// Tests of parallel/topology.h (every coordinate and group of an 8-rank tp=2, pp=2, dp=2 job
// against Megatron's layout, other layouts' invariants, refusals and their advice), the model
// divisibility check, and local-rank discovery from the launchers' environment variables.
#include "parallel/topology.h"

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/process_groups.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

Topology Make(int world, int rank, ParallelSizes sizes) {
  auto t = Topology::Create(world, rank, sizes);
  NF_EXPECT_OK(t);
  return t.ok() ? *t : Topology();
}

// Megatron-LM's documented example (initialize_model_parallel): 8 GPUs, tp=2, pp=2 gives
// tensor groups [0,1] [2,3] [4,5] [6,7], pipeline groups [0,4] [1,5] [2,6] [3,7], data groups
// [0,2] [1,3] [4,6] [5,7], model groups [0,1,4,5] [2,3,6,7], embedding groups = pipeline ends.
TEST(TopologyTest, EightRanksInMegatronOrder) {
  struct Expected {
    int tp_rank, dp_rank, pp_rank;
    std::vector<int> tp, dp, pp, mp, embedding;
  };
  const std::vector<Expected> expected = {
      {0, 0, 0, {0, 1}, {0, 2}, {0, 4}, {0, 1, 4, 5}, {0, 4}},
      {1, 0, 0, {0, 1}, {1, 3}, {1, 5}, {0, 1, 4, 5}, {1, 5}},
      {0, 1, 0, {2, 3}, {0, 2}, {2, 6}, {2, 3, 6, 7}, {2, 6}},
      {1, 1, 0, {2, 3}, {1, 3}, {3, 7}, {2, 3, 6, 7}, {3, 7}},
      {0, 0, 1, {4, 5}, {4, 6}, {0, 4}, {0, 1, 4, 5}, {0, 4}},
      {1, 0, 1, {4, 5}, {5, 7}, {1, 5}, {0, 1, 4, 5}, {1, 5}},
      {0, 1, 1, {6, 7}, {4, 6}, {2, 6}, {2, 3, 6, 7}, {2, 6}},
      {1, 1, 1, {6, 7}, {5, 7}, {3, 7}, {2, 3, 6, 7}, {3, 7}},
  };
  for (int rank = 0; rank < 8; ++rank) {
    SCOPED_TRACE(rank);
    const Topology t = Make(8, rank, {.tp = 2, .pp = 2, .dp = 0});
    const Expected& e = expected[rank];
    EXPECT_EQ(t.world_size(), 8);
    EXPECT_EQ(t.world_rank(), rank);
    EXPECT_EQ(t.tp(), 2);
    EXPECT_EQ(t.dp(), 2);
    EXPECT_EQ(t.pp(), 2);
    EXPECT_EQ(t.tp_rank(), e.tp_rank);
    EXPECT_EQ(t.dp_rank(), e.dp_rank);
    EXPECT_EQ(t.pp_rank(), e.pp_rank);
    EXPECT_EQ(t.WorldRank(e.tp_rank, e.dp_rank, e.pp_rank), rank);
    EXPECT_EQ(t.is_first_stage(), e.pp_rank == 0);
    EXPECT_EQ(t.is_last_stage(), e.pp_rank == 1);
    EXPECT_THAT(t.group(GroupKind::kTensor), ElementsAreArray(e.tp));
    EXPECT_THAT(t.group(GroupKind::kData), ElementsAreArray(e.dp));
    EXPECT_THAT(t.group(GroupKind::kPipeline), ElementsAreArray(e.pp));
    EXPECT_THAT(t.group(GroupKind::kModel), ElementsAreArray(e.mp));
    EXPECT_THAT(t.group(GroupKind::kEmbedding), ElementsAreArray(e.embedding));
    EXPECT_EQ(t.rank_in_group(GroupKind::kTensor), e.tp_rank);
    EXPECT_EQ(t.rank_in_group(GroupKind::kData), e.dp_rank);
    EXPECT_EQ(t.rank_in_group(GroupKind::kPipeline), e.pp_rank);
    EXPECT_EQ(t.rank_in_group(GroupKind::kModel), e.tp_rank + 2 * e.pp_rank);
    EXPECT_EQ(t.rank_in_group(GroupKind::kEmbedding), e.pp_rank);
    EXPECT_EQ(t.group_index(GroupKind::kTensor), rank / 2);
    EXPECT_EQ(t.group_index(GroupKind::kModel), e.dp_rank);
    EXPECT_EQ(t.ToString(), "rank " + std::to_string(rank) + " (tp=" + std::to_string(e.tp_rank) +
                                ", dp=" + std::to_string(e.dp_rank) +
                                ", pp=" + std::to_string(e.pp_rank) + ")");
  }
}

// For every layout of 12 ranks: each kind's groups partition the ranks (embedding: the pipeline
// ends), members agree on the group, its index and their positions, and group(kind)[rank in
// group] is the rank itself.
TEST(TopologyTest, GroupsAreConsistentForEveryLayoutOfTwelveRanks) {
  constexpr int kWorld = 12;
  for (int tp = 1; tp <= kWorld; ++tp) {
    for (int pp = 1; tp * pp <= kWorld; ++pp) {
      if (kWorld % (tp * pp) != 0) continue;
      SCOPED_TRACE(::testing::Message() << "tp=" << tp << " pp=" << pp);
      std::vector<Topology> all;
      for (int r = 0; r < kWorld; ++r) all.push_back(Make(kWorld, r, {.tp = tp, .pp = pp}));
      const int dp = kWorld / (tp * pp);
      const int counts[] = {tp, dp, pp, tp * pp, pp == 1 ? 1 : 2};
      for (int k = 0; k < static_cast<int>(GroupKind::kCount); ++k) {
        const auto kind = static_cast<GroupKind>(k);
        std::set<int> seen;
        for (const Topology& t : all) {
          const std::vector<int>& members = t.group(kind);
          if (kind == GroupKind::kEmbedding && !t.is_first_stage() && !t.is_last_stage()) {
            EXPECT_THAT(members, IsEmpty());
            EXPECT_EQ(t.group_index(kind), -1);
            EXPECT_EQ(t.rank_in_group(kind), -1);
            continue;
          }
          ASSERT_EQ(static_cast<int>(members.size()), counts[k]) << GroupKindName(kind);
          EXPECT_EQ(members[t.rank_in_group(kind)], t.world_rank());
          for (int m : members) {
            EXPECT_EQ(all[m].group(kind), members);
            EXPECT_EQ(all[m].group_index(kind), t.group_index(kind));
          }
          seen.insert(t.world_rank());
        }
        if (kind != GroupKind::kEmbedding) {
          EXPECT_EQ(static_cast<int>(seen.size()), kWorld);
        }
      }
    }
  }
}

TEST(TopologyTest, DerivesOrChecksDataParallel) {
  EXPECT_EQ(Make(16, 5, {.tp = 2, .pp = 2, .dp = 0}).dp(), 4);
  EXPECT_EQ(Make(16, 5, {.tp = 2, .pp = 2, .dp = 4}).dp(), 4);
  const Topology single;
  EXPECT_EQ(single.world_size(), 1);
  EXPECT_THAT(single.group(GroupKind::kEmbedding), ElementsAre(0));
  const Topology one = Make(1, 0, {});
  EXPECT_THAT(one.group(GroupKind::kModel), ElementsAre(0));
  EXPECT_THAT(one.group(GroupKind::kEmbedding), ElementsAre(0));
  EXPECT_EQ(one.ToString(), "rank 0 (tp=0, dp=0, pp=0)");
}

TEST(TopologyTest, RefusalsSayWhatFailsAndWhatWouldWork) {
  using testing::ExpectInvalidArgument;
  ExpectInvalidArgument(Topology::Create(3, 0, {.tp = 2, .pp = 1}).status(),
                        "world size 3 is not divisible by tensor_parallel 2 x pipeline_parallel "
                        "1; use 2 or 4 ranks, or tensor_parallel 1 or 3");
  ExpectInvalidArgument(Topology::Create(6, 0, {.tp = 2, .pp = 2}).status(),
                        "world size 6 is not divisible by tensor_parallel 2 x pipeline_parallel "
                        "2; use 4 or 8 ranks, or tensor_parallel 1 or 3, or pipeline_parallel 1 "
                        "or 3");
  ExpectInvalidArgument(Topology::Create(2, 0, {.tp = 4, .pp = 1}).status(),
                        "world size 2 is not divisible by tensor_parallel 4 x pipeline_parallel "
                        "1; use 4 ranks, or tensor_parallel 1 or 2");
  ExpectInvalidArgument(Topology::Create(5, 0, {.tp = 2, .pp = 1, .dp = 2}).status(),
                        "world size 5 is not divisible by tensor_parallel 2 x pipeline_parallel "
                        "1; use 4 ranks, or tensor_parallel 1 or 5 (with data_parallel 0 to "
                        "derive it)");
  ExpectInvalidArgument(Topology::Create(8, 0, {.tp = 2, .pp = 2, .dp = 4}).status(),
                        "world size 8 does not equal tensor_parallel 2 x pipeline_parallel 2 x "
                        "data_parallel 4 = 16; use 16 ranks, or data_parallel 2 (or 0 to derive "
                        "it)");
  ExpectInvalidArgument(Topology::Create(4, 0, {.tp = 0}).status(),
                        "tensor_parallel must be at least 1, got 0");
  ExpectInvalidArgument(Topology::Create(4, 0, {.pp = -1}).status(),
                        "pipeline_parallel must be at least 1, got -1");
  ExpectInvalidArgument(Topology::Create(4, 0, {.dp = -2}).status(),
                        "data_parallel must be at least 1 (or 0 to derive it from the world "
                        "size), got -2");
  ExpectInvalidArgument(Topology::Create(4, 4, {}).status(),
                        "world rank 4 is out of range for a world of 4 ranks");
  ExpectInvalidArgument(Topology::Create(0, 0, {}).status(), "world size must be at least 1");
}

TEST(ModelDivisibilityTest, HeadsAndFfnMustDivideByTensorParallel) {
  using testing::ExpectInvalidArgument;
  NF_EXPECT_OK(CheckModelDivisibility(12, 3072, 4));
  NF_EXPECT_OK(CheckModelDivisibility(6, 96, 1));
  ExpectInvalidArgument(CheckModelDivisibility(6, 3072, 4),
                        "model.num_heads (6) is not divisible by tensor_parallel (4); "
                        "tensor_parallel 1, 2, 3 or 6 would work");
  ExpectInvalidArgument(CheckModelDivisibility(8, 100, 8),
                        "model.ffn_dim (100) is not divisible by tensor_parallel (8); "
                        "tensor_parallel 1, 2 or 4 would work");
  ExpectInvalidArgument(CheckModelDivisibility(8, 64, 0), "tensor_parallel must be at least 1");
  ExpectInvalidArgument(CheckModelDivisibility(0, 64, 1), "model.num_heads must be at least 1");
}

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(LocalRankTest, ReadsOpenMpiThenSlurm) {
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", "3");
    ScopedEnv slurm("SLURM_LOCALID", "5");
    auto rank = DiscoverLocalRank();
    NF_ASSERT_OK(rank);
    EXPECT_EQ(*rank, 3);
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", "5");
    auto rank = DiscoverLocalRank();
    NF_ASSERT_OK(rank);
    EXPECT_EQ(*rank, 5);
  }
  {
    // MPICH's and Intel MPI's mpirun inside sbatch: every rank inherits SLURM_LOCALID=0 from
    // the one Slurm task per node, and Hydra's MPI_LOCALRANKID is the rank's real place.
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv hydra("MPI_LOCALRANKID", "6");
    ScopedEnv pmi("PMI_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", "0");
    auto rank = DiscoverLocalRank();
    NF_ASSERT_OK(rank);
    EXPECT_EQ(*rank, 6);
    EXPECT_STREQ(LocalRankSource(), "MPI_LOCALRANKID");
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv hydra("MPI_LOCALRANKID", nullptr);
    ScopedEnv pmi("PMI_LOCAL_RANK", "2");
    ScopedEnv slurm("SLURM_LOCALID", "0");
    auto rank = DiscoverLocalRank();
    NF_ASSERT_OK(rank);
    EXPECT_EQ(*rank, 2);
    EXPECT_STREQ(LocalRankSource(), "PMI_LOCAL_RANK");
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv hydra("MPI_LOCALRANKID", nullptr);
    ScopedEnv pmi("PMI_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", "5");
    EXPECT_STREQ(LocalRankSource(), "SLURM_LOCALID");
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", "two");
    testing::ExpectInvalidArgument(DiscoverLocalRank().status(),
                                   "OMPI_COMM_WORLD_LOCAL_RANK='two' is not a local rank");
  }
}

}  // namespace
}  // namespace nf::parallel
