// The 3-D layout of the job: world = tensor-parallel x data-parallel x pipeline-parallel, with
// the tensor-parallel rank varying fastest (neighbouring ranks, hence one node, share a layer's
// all-reduces), then data-parallel, then pipeline (Megatron's order):
//
//   world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//
// Each rank belongs to one group of each kind:
//   tp         the tp ranks of its (dp, pp) cell: a layer's shards
//   dp         the dp ranks of its (tp, pp) cell: replicas that all-reduce gradients
//   pp         the pp ranks of its (tp, dp) column: the stages of one pipeline
//   mp         model-parallel, tp x pp ranks of its dp index: one full copy of the model
//   embedding  the first and last stage of its (tp, dp) column (one rank when pp = 1), which
//              both hold the tied embedding and sum its gradients; middle stages are in none
// Groups list world ranks in group-rank order. Pure arithmetic, no MPI: a single process can
// compute the view of any rank.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::parallel {

struct ParallelSizes {
  int tp = 1;  // tensor_parallel
  int pp = 1;  // pipeline_parallel
  int dp = 0;  // data_parallel; 0: world size / (tp * pp)
};

enum class GroupKind : int { kTensor = 0, kData, kPipeline, kModel, kEmbedding, kCount };
// "tp", "dp", "pp", "mp", "embedding": the communicator's name.
absl::string_view GroupKindName(GroupKind kind);

class Topology {
 public:
  // The view of `world_rank` in a world of `world_size` ranks. Refuses sizes that do not
  // multiply to the world size, saying which number fails and what would work.
  static absl::StatusOr<Topology> Create(int world_size, int world_rank, ParallelSizes sizes);

  Topology() = default;  // a world of one

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int tp() const { return sizes_.tp; }
  int dp() const { return sizes_.dp; }  // resolved, never 0
  int pp() const { return sizes_.pp; }
  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return dp_rank_; }
  int pp_rank() const { return pp_rank_; }
  bool is_first_stage() const { return pp_rank_ == 0; }
  bool is_last_stage() const { return pp_rank_ == sizes_.pp - 1; }

  // The world rank at the given coordinates.
  int WorldRank(int tp_rank, int dp_rank, int pp_rank) const {
    return tp_rank + sizes_.tp * (dp_rank + sizes_.dp * pp_rank);
  }

  // This rank's group of `kind`: world ranks in group-rank order; empty for kEmbedding on a
  // middle stage.
  const std::vector<int>& group(GroupKind kind) const { return groups_[Index(kind)].ranks; }
  // Which group of its kind this is (0 .. number of such groups - 1; the MPI_Comm_split
  // color), or -1 when this rank is in none (kEmbedding on a middle stage).
  int group_index(GroupKind kind) const { return groups_[Index(kind)].index; }
  // This rank's position in group(kind), or -1 when it is in none.
  int rank_in_group(GroupKind kind) const { return groups_[Index(kind)].rank; }

  // "rank 5 (tp=1, dp=0, pp=1)".
  std::string ToString() const;

 private:
  struct Group {
    std::vector<int> ranks = {0};
    int index = 0;
    int rank = 0;
  };
  static int Index(GroupKind kind) { return static_cast<int>(kind); }

  int world_size_ = 1;
  int world_rank_ = 0;
  ParallelSizes sizes_ = {.tp = 1, .pp = 1, .dp = 1};
  int tp_rank_ = 0;
  int dp_rank_ = 0;
  int pp_rank_ = 0;
  std::array<Group, static_cast<int>(GroupKind::kCount)> groups_;
};

// Tensor parallelism splits attention heads and the FFN's inner dimension across the tp ranks,
// so both must divide by tp; the error lists the tp values that divide both. (The vocabulary
// needs no check: it is padded to a multiple of 128 x tp, model/vocab.h.)
absl::Status CheckModelDivisibility(int64_t num_heads, int64_t ffn_dim, int tensor_parallel);

}  // namespace nf::parallel
