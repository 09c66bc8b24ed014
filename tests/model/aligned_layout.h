// Checks that a model's flat parameter layout keeps every tensor aligned (model/param_table.h,
// kParamAlignment) for one parallel layout: every parameter of every pipeline stage of every
// tensor-parallel rank starts 256-byte aligned in 2-byte parameters (and so in fp32 gradients,
// master weights and moments), except those laid out to continue the previous one (k and v
// after q, whose fused view starts aligned); the buffer length is a multiple of
// kParamAlignment x dp; and each data-parallel rank's bucket slices, hence its ZeRO-1 shard,
// start aligned. Computed from the specs alone (LayOutFlat), so a 2.7B model costs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/normformer_params.h"
#include "model/param_table.h"
#include "model/vocab.h"
#include "parallel/data_parallel_optimizer.h"
#include "parallel/pipeline_schedule.h"

namespace nf::testing {

inline void ExpectAlignedLayout(const model::ModelConfig& config, int tp, int pp, int v, int dp,
                                int64_t bucket_elements) {
  const std::string layout = absl::StrCat("heads ", config.num_heads(), " tp ", tp, " pp ", pp,
                                          " v ", v, " dp ", dp, " bucket ", bucket_elements);
  constexpr int64_t kMinBytes = 2, kAlignBytes = 256;  // fp16/bf16 parameters
  const int64_t padded_vocab = model::PaddedVocabSize(config.vocab_size(), tp);
  const std::vector<std::pair<int, int>> stages = parallel::StageLayers(config.num_layers(), pp, v);
  for (int stage = 0; stage < pp * v; ++stage) {
    const std::vector<model::ParamSpec> specs =
        model::NormFormerParamSpecs(config, padded_vocab,
                                    {.stage = stage,
                                     .num_stages = pp * v,
                                     .layer_begin = stages[stage].first,
                                     .layer_end = stages[stage].second});
    std::vector<int64_t> numels;
    for (const model::ParamSpec& spec : specs) {
      int64_t n = NumElements(spec.global_shape);
      if (spec.sharding != model::Sharding::kReplicated) n /= tp;
      numels.push_back(n);
    }
    const model::FlatLayout flat = model::LayOutFlat(specs, numels, dp);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].follows_previous) {
        EXPECT_EQ(flat.offsets[i], flat.offsets[i - 1] + numels[i - 1]) << layout;
        continue;
      }
      EXPECT_EQ(flat.offsets[i] * kMinBytes % kAlignBytes, 0)
          << layout << " stage " << stage << ": " << specs[i].name << " at element "
          << flat.offsets[i];
    }
    EXPECT_EQ(flat.padded_elements % (model::kParamAlignment * dp), 0) << layout;
    for (int rank = 0; rank < dp; ++rank) {
      auto buckets = parallel::MakeGradBuckets(
          flat.padded_elements, model::AlignedBucketElements(bucket_elements, dp), dp, rank);
      ASSERT_TRUE(buckets.ok()) << layout << ": " << buckets.status();
      for (const parallel::GradBucket& b : *buckets) {
        EXPECT_EQ(b.slice_offset * kMinBytes % kAlignBytes, 0) << layout << " dp rank " << rank;
        EXPECT_EQ(b.shard_offset * kMinBytes % kAlignBytes, 0) << layout << " dp rank " << rank;
      }
    }
  }
}

}  // namespace nf::testing
