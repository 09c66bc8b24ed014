#include "parallel/topology.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nf::parallel {
namespace {

// "1", "1 or 3", "1, 2, 3 or 6".
std::string JoinOr(const std::vector<int64_t>& values) {
  if (values.size() <= 1) return absl::StrJoin(values, "");
  return absl::StrCat(absl::StrJoin(values.begin(), values.end() - 1, ", "), " or ", values.back());
}

// The values v in [1, limit] with `ok(v)`.
template <typename Ok>
std::vector<int64_t> Candidates(int64_t limit, Ok ok) {
  std::vector<int64_t> values;
  for (int64_t v = 1; v <= limit; ++v) {
    if (ok(v)) values.push_back(v);
  }
  return values;
}

absl::Status CheckSizes(int world_size, int world_rank, const ParallelSizes& sizes) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be at least 1, got ", world_size));
  }
  if (world_rank < 0 || world_rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world rank ", world_rank,
                                                   " is out of range for a world of ", world_size,
                                                   world_size == 1 ? " rank" : " ranks"));
  }
  if (sizes.tp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel must be at least 1, got ", sizes.tp));
  }
  if (sizes.pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_parallel must be at least 1, got ", sizes.pp));
  }
  if (sizes.dp < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_parallel must be at least 1 (or 0 to derive it from the world size), got ",
        sizes.dp));
  }
  const int64_t world = world_size, tp = sizes.tp, pp = sizes.pp, dp = sizes.dp;
  if (world % (tp * pp) != 0) {
    std::vector<int64_t> ranks;
    if (dp > 0) {
      ranks.push_back(tp * pp * dp);
    } else {
      if (world > tp * pp) ranks.push_back(world / (tp * pp) * tp * pp);
      ranks.push_back((world / (tp * pp) + 1) * tp * pp);
    }
    std::string message =
        absl::StrCat("world size ", world, " is not divisible by tensor_parallel ", tp,
                     " x pipeline_parallel ", pp, "; use ", JoinOr(ranks), " ranks");
    const auto tps = Candidates(world, [&](int64_t t) { return world % (t * pp) == 0; });
    const auto pps = Candidates(world, [&](int64_t p) { return world % (tp * p) == 0; });
    if (!tps.empty()) absl::StrAppend(&message, ", or tensor_parallel ", JoinOr(tps));
    if (!pps.empty()) absl::StrAppend(&message, ", or pipeline_parallel ", JoinOr(pps));
    if (dp > 0) absl::StrAppend(&message, " (with data_parallel 0 to derive it)");
    return absl::InvalidArgumentError(message);
  }
  if (dp > 0 && tp * pp * dp != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", world, " does not equal tensor_parallel ", tp, " x pipeline_parallel ", pp,
        " x data_parallel ", dp, " = ", tp * pp * dp, "; use ", tp * pp * dp,
        " ranks, or data_parallel ", world / (tp * pp), " (or 0 to derive it)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTensor:
      return "tp";
    case GroupKind::kData:
      return "dp";
    case GroupKind::kPipeline:
      return "pp";
    case GroupKind::kModel:
      return "mp";
    case GroupKind::kEmbedding:
      return "embedding";
    case GroupKind::kCount:
      break;
  }
  return "unknown";
}

absl::StatusOr<Topology> Topology::Create(int world_size, int world_rank, ParallelSizes sizes) {
  if (absl::Status s = CheckSizes(world_size, world_rank, sizes); !s.ok()) return s;
  Topology t;
  t.world_size_ = world_size;
  t.world_rank_ = world_rank;
  t.sizes_ = sizes;
  t.sizes_.dp = world_size / (sizes.tp * sizes.pp);
  const int tp = t.sizes_.tp, dp = t.sizes_.dp, pp = t.sizes_.pp;
  t.tp_rank_ = world_rank % tp;
  t.dp_rank_ = world_rank / tp % dp;
  t.pp_rank_ = world_rank / (tp * dp);

  Group& tensor = t.groups_[Index(GroupKind::kTensor)];
  tensor.ranks.clear();
  for (int r = 0; r < tp; ++r) tensor.ranks.push_back(t.WorldRank(r, t.dp_rank_, t.pp_rank_));
  tensor.index = t.dp_rank_ + dp * t.pp_rank_;
  tensor.rank = t.tp_rank_;

  Group& data = t.groups_[Index(GroupKind::kData)];
  data.ranks.clear();
  for (int r = 0; r < dp; ++r) data.ranks.push_back(t.WorldRank(t.tp_rank_, r, t.pp_rank_));
  data.index = t.tp_rank_ + tp * t.pp_rank_;
  data.rank = t.dp_rank_;

  Group& pipeline = t.groups_[Index(GroupKind::kPipeline)];
  pipeline.ranks.clear();
  for (int r = 0; r < pp; ++r) pipeline.ranks.push_back(t.WorldRank(t.tp_rank_, t.dp_rank_, r));
  pipeline.index = t.tp_rank_ + tp * t.dp_rank_;
  pipeline.rank = t.pp_rank_;

  // Ordered by world rank, which puts tp fastest: rank in group = tp_rank + tp * pp_rank.
  Group& model = t.groups_[Index(GroupKind::kModel)];
  model.ranks.clear();
  for (int p = 0; p < pp; ++p) {
    for (int r = 0; r < tp; ++r) model.ranks.push_back(t.WorldRank(r, t.dp_rank_, p));
  }
  model.index = t.dp_rank_;
  model.rank = t.tp_rank_ + tp * t.pp_rank_;

  Group& embedding = t.groups_[Index(GroupKind::kEmbedding)];
  embedding.ranks.clear();
  if (t.is_first_stage() || t.is_last_stage()) {
    embedding.ranks.push_back(pipeline.ranks.front());
    if (pp > 1) embedding.ranks.push_back(pipeline.ranks.back());
    embedding.index = pipeline.index;
    embedding.rank = t.is_first_stage() ? 0 : 1;
  } else {
    embedding.index = -1;
    embedding.rank = -1;
  }
  return t;
}

std::string Topology::ToString() const {
  return absl::StrCat("rank ", world_rank_, " (tp=", tp_rank_, ", dp=", dp_rank_, ", pp=", pp_rank_,
                      ")");
}

absl::Status CheckModelDivisibility(int64_t num_heads, int64_t ffn_dim, int tensor_parallel) {
  if (tensor_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel must be at least 1, got ", tensor_parallel));
  }
  const std::pair<absl::string_view, int64_t> dims[] = {{"model.num_heads", num_heads},
                                                        {"model.ffn_dim", ffn_dim}};
  for (const auto& [name, value] : dims) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1, got ", value));
    }
  }
  const int64_t common = std::gcd(num_heads, ffn_dim);
  for (const auto& [name, value] : dims) {
    if (value % tensor_parallel == 0) continue;
    const auto working = Candidates(common, [&](int64_t t) { return common % t == 0; });
    return absl::InvalidArgumentError(
        absl::StrCat(name, " (", value, ") is not divisible by tensor_parallel (", tensor_parallel,
                     "); tensor_parallel ", JoinOr(working), " would work"));
  }
  return absl::OkStatus();
}

}  // namespace nf::parallel
