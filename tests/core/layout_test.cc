// ScaleChannels (NormFormer's head and residual scales) and the SplitHeads/MergeHeads layout
// permutation, against float64 references written here.
#include <vector>

#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectAllClose;
using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;
using ::nf::testing::UnitRoundoff;

struct ChannelCase {
  DType dtype;
  int64_t outer, channels, inner;
};

class ScaleChannelsTest : public ::testing::TestWithParam<ChannelCase> {};

INSTANTIATE_TEST_SUITE_P(Shapes, ScaleChannelsTest,
                         ::testing::Values(ChannelCase{DType::kF32, 3, 4, 5},  // head scale
                                           ChannelCase{DType::kF16, 7, 4, 2},
                                           ChannelCase{DType::kBF16, 2, 3, 1},  // resid scale
                                           ChannelCase{DType::kF32, 1, 1, 1},
                                           ChannelCase{DType::kF32, 300, 8, 40},
                                           // fp32 fast paths: inner = 1 over 64-column blocks
                                           // and a tail, inner in parts of 64 and a tail
                                           ChannelCase{DType::kF32, 5, 130, 1},
                                           ChannelCase{DType::kF32, 3, 2, 130},
                                           ChannelCase{DType::kF32, 4, 3, 17}));

TEST_P(ScaleChannelsTest, ForwardAndBackwardMatchFloat64) {
  const ChannelCase c = GetParam();
  const int64_t n = c.outer * c.channels * c.inner;
  const std::vector<double> x = Rounded(c.dtype, RandomFloats(n, 1));
  const std::vector<double> dy = Rounded(c.dtype, RandomFloats(n, 2));
  const std::vector<float> scale = RandomFloats(c.channels, 3, 0.5f, 1.5f);
  const std::vector<float> dscale0 = RandomFloats(c.channels, 4);
  Tensor tx = MakeTensor(c.dtype, {n}, std::vector<float>(x.begin(), x.end()));
  Tensor tdy = MakeTensor(c.dtype, {n}, std::vector<float>(dy.begin(), dy.end()));
  Tensor tscale = MakeTensor(DType::kF32, {c.channels}, scale);
  Tensor ty = MakeZeros(c.dtype, {n}), tdx = MakeZeros(c.dtype, {n});
  Tensor tdscale = MakeTensor(DType::kF32, {c.channels}, dscale0);
  NF_ASSERT_OK(ops::ScaleChannels(tx, tscale, c.inner, ty));
  NF_ASSERT_OK(ops::ScaleChannelsBackward(tx, tscale, c.inner, tdy, tdx, tdscale));

  std::vector<double> y(n), dx(n), dscale(dscale0.begin(), dscale0.end());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ch = (i / c.inner) % c.channels;
    y[i] = x[i] * scale[ch];
    dx[i] = dy[i] * scale[ch];
    dscale[ch] += dy[i] * x[i];
  }
  // One fp32 product (u32) then one rounding to the output dtype (UnitRoundoff).
  const double rtol = kU32 + UnitRoundoff(c.dtype);
  ExpectAllClose(ToDoubles(ty), y, 0.0, rtol, "y");
  ExpectAllClose(ToDoubles(tdx), dx, 0.0, rtol, "dx");
  // Exact double sum of exact products (inputs have <= 24 bits, so each product is exact in
  // double), rounded to fp32 twice (partial sum, then the accumulate): 2 u32 of the magnitude
  // |dscale0| + sum |dy x| <= 1 + outer * inner.
  ExpectAllClose(ToDoubles(tdscale), dscale, 2 * kU32 * (1.0 + c.outer * c.inner), 0.0, "dscale");
}

TEST(ScaleChannelsTest, InPlaceAndRejectsBadGroups) {
  Tensor x = MakeTensor(DType::kF32, {2, 6}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor scale = MakeTensor(DType::kF32, {3}, {1, 10, 100});
  NF_ASSERT_OK(ops::ScaleChannels(x, scale, 2, x));
  EXPECT_EQ(ToDoubles(x), (std::vector<double>{1, 2, 30, 40, 500, 600, 7, 8, 90, 100, 1100, 1200}));
  ExpectInvalidArgument(ops::ScaleChannels(x, scale, 5, x), "ScaleChannels", "inner");
  ExpectInvalidArgument(ops::ScaleChannels(x, scale, 0, x), "ScaleChannels", "inner");
  ExpectInvalidArgument(ops::ScaleChannelsBackward(x, scale, 2, x, x, MakeZeros(DType::kF16, {3})),
                        "ScaleChannelsBackward", "dscale");
}

TEST(HeadLayoutTest, SplitPlacesEveryElementAndMergeInvertsIt) {
  const int64_t batch = 2, heads = 3, seq = 5, dim = 4;
  const int64_t n = batch * heads * seq * dim;
  std::vector<float> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<float>(i);
  Tensor t = MakeTensor(DType::kBF16, {batch * seq, heads * dim}, tokens);
  Tensor h = MakeZeros(DType::kBF16, {batch, heads, seq, dim});
  NF_ASSERT_OK(ops::SplitHeads(t, h));
  const std::vector<double> split = ToDoubles(h);
  const std::vector<double> rounded = Rounded(DType::kBF16, tokens);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t hh = 0; hh < heads; ++hh) {
      for (int64_t s = 0; s < seq; ++s) {
        for (int64_t d = 0; d < dim; ++d) {
          // Token (b, s), feature hh * dim + d.
          ASSERT_EQ(split[((b * heads + hh) * seq + s) * dim + d],
                    rounded[(b * seq + s) * heads * dim + hh * dim + d]);
        }
      }
    }
  }
  Tensor back = MakeZeros(DType::kBF16, {batch * seq, heads * dim});
  NF_ASSERT_OK(ops::MergeHeads(h, back));
  EXPECT_EQ(ToDoubles(back), rounded);
  ExpectInvalidArgument(ops::SplitHeads(MakeZeros(DType::kBF16, {batch * seq, heads * dim + 1}), h),
                        "SplitHeads", "tokens");
  ExpectInvalidArgument(ops::MergeHeads(MakeZeros(DType::kBF16, {batch, heads, seq}), back),
                        "MergeHeads", "heads");
}

// The grouped layout of the fused q, k, v projection: tokens [B * S, G * H * Dh] to [G, B, H, S,
// Dh], every element where the per-group SplitHeads of that group's columns puts it.
TEST(HeadLayoutTest, GroupedSplitIsEachGroupsSplitAndMergeInvertsIt) {
  const int64_t groups = 3, batch = 2, heads = 2, seq = 5, dim = 3;
  const int64_t width = heads * dim, n = groups * batch * heads * seq * dim;
  std::vector<float> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<float>(i);
  const Tensor t = MakeTensor(DType::kF32, {batch * seq, groups * width}, tokens);
  Tensor grouped = MakeZeros(DType::kF32, {groups, batch, heads, seq, dim});
  NF_ASSERT_OK(ops::SplitHeads(t, grouped));
  const std::vector<double> split = ToDoubles(grouped);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<float> columns;  // group g's [B * S, H * Dh] columns of the tokens
    for (int64_t token = 0; token < batch * seq; ++token) {
      for (int64_t c = 0; c < width; ++c)
        columns.push_back(tokens[token * groups * width + g * width + c]);
    }
    Tensor one = MakeZeros(DType::kF32, {batch, heads, seq, dim});
    NF_ASSERT_OK(ops::SplitHeads(MakeTensor(DType::kF32, {batch * seq, width}, columns), one));
    const std::vector<double> expected = ToDoubles(one);
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(split[g * expected.size() + i], expected[i]) << "group " << g << " [" << i << "]";
    }
  }
  Tensor back = MakeZeros(DType::kF32, {batch * seq, groups * width});
  NF_ASSERT_OK(ops::MergeHeads(grouped, back));
  EXPECT_EQ(ToDoubles(back), ToDoubles(t));
  ExpectInvalidArgument(ops::SplitHeads(MakeZeros(DType::kF32, {batch * seq, 2 * width}), grouped),
                        "SplitHeads", "tokens");
  ExpectInvalidArgument(ops::MergeScaledHeads(grouped, MakeZeros(DType::kF32, {heads}), back),
                        "MergeScaledHeads", "[batch, heads, seq, head_dim]");
}

struct ScaledHeadsCase {
  DType dtype;
  int64_t batch, heads, seq, dim;
};

class MergeScaledHeadsTest : public ::testing::TestWithParam<ScaledHeadsCase> {};

INSTANTIATE_TEST_SUITE_P(Shapes, MergeScaledHeadsTest,
                         ::testing::Values(ScaledHeadsCase{DType::kF32, 2, 3, 5, 4},
                                           // head_dim off the kernels' 16 / 32 lanes
                                           ScaledHeadsCase{DType::kF32, 3, 4, 17, 19},
                                           ScaledHeadsCase{DType::kF32, 4, 4, 64, 32},  // tiny
                                           ScaledHeadsCase{DType::kF32, 1, 1, 1, 1},
                                           ScaledHeadsCase{DType::kBF16, 2, 3, 7, 8},
                                           ScaledHeadsCase{DType::kF16, 2, 2, 3, 5}));

// The fused op against the composition it replaces (ScaleChannels on the head layout, then
// MergeHeads; SplitHeads then ScaleChannelsBackward) and against float64.
TEST_P(MergeScaledHeadsTest, MatchesScaleThenMergeAndFloat64) {
  const ScaledHeadsCase c = GetParam();
  const Shape head_shape{c.batch, c.heads, c.seq, c.dim};
  const Shape token_shape{c.batch * c.seq, c.heads * c.dim};
  const int64_t n = NumElements(head_shape), per_head = c.seq * c.dim;
  const std::vector<float> x = RandomFloats(n, 5), dy = RandomFloats(n, 6);
  const std::vector<float> scale = RandomFloats(c.heads, 7, 0.5f, 1.5f);
  const std::vector<float> dscale0 = RandomFloats(c.heads, 8);
  const Tensor heads = MakeTensor(c.dtype, head_shape, x);
  const Tensor d_tokens = MakeTensor(c.dtype, token_shape, dy);
  const Tensor tscale = MakeTensor(DType::kF32, {c.heads}, scale);

  Tensor merged = MakeZeros(c.dtype, token_shape), d_heads = MakeZeros(c.dtype, head_shape);
  Tensor dscale = MakeTensor(DType::kF32, {c.heads}, dscale0);
  NF_ASSERT_OK(ops::MergeScaledHeads(heads, tscale, merged));
  NF_ASSERT_OK(ops::MergeScaledHeadsBackward(d_tokens, heads, tscale, d_heads, dscale));

  Tensor scaled = MakeZeros(c.dtype, head_shape), merged_ref = MakeZeros(c.dtype, token_shape);
  Tensor d_heads_ref = MakeZeros(c.dtype, head_shape);
  Tensor dscale_ref = MakeTensor(DType::kF32, {c.heads}, dscale0);
  NF_ASSERT_OK(ops::ScaleChannels(heads, tscale, per_head, scaled));
  NF_ASSERT_OK(ops::MergeHeads(scaled, merged_ref));
  NF_ASSERT_OK(ops::SplitHeads(d_tokens, d_heads_ref));
  NF_ASSERT_OK(
      ops::ScaleChannelsBackward(heads, tscale, per_head, d_heads_ref, d_heads_ref, dscale_ref));
  // The activations are the same single products, only moved: the same bits.
  EXPECT_EQ(ToDoubles(merged), ToDoubles(merged_ref));
  EXPECT_EQ(ToDoubles(d_heads), ToDoubles(d_heads_ref));

  // The scale gradient sums the same exact products (inputs of <= 24 bits) in double in another
  // order, then rounds to fp32 twice (the sum, then the accumulate): 2 u32 of its magnitude
  // |dscale0| + sum |dy x| <= 1 + batch * seq * dim, against float64 and the composition alike.
  const std::vector<double> hx = ToDoubles(heads), tdy = ToDoubles(d_tokens);
  std::vector<double> expected(dscale0.begin(), dscale0.end());
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t s = 0; s < c.seq; ++s) {
        for (int64_t d = 0; d < c.dim; ++d) {
          expected[h] += hx[((b * c.heads + h) * c.seq + s) * c.dim + d] *
                         tdy[((b * c.seq + s) * c.heads + h) * c.dim + d];
        }
      }
    }
  }
  const double atol = 2 * kU32 * (1.0 + static_cast<double>(c.batch * per_head));
  ExpectAllClose(ToDoubles(dscale), expected, atol, 0.0, "dscale vs float64");
  ExpectAllClose(ToDoubles(dscale), ToDoubles(dscale_ref), 2 * atol, 0.0, "dscale vs composed");
}

TEST(MergeScaledHeadsTest, RejectsABadScaleAndAliasedGradients) {
  const Tensor heads = MakeZeros(DType::kF32, {2, 3, 4, 5});
  const Tensor tokens = MakeZeros(DType::kF32, {8, 15});
  const Tensor scale = MakeZeros(DType::kF32, {3});
  ExpectInvalidArgument(ops::MergeScaledHeads(heads, MakeZeros(DType::kF32, {4}), tokens),
                        "MergeScaledHeads", "scale");
  ExpectInvalidArgument(ops::MergeScaledHeads(heads, scale, MakeZeros(DType::kF32, {8, 16})),
                        "MergeScaledHeads", "tokens");
  ExpectInvalidArgument(
      ops::MergeScaledHeadsBackward(tokens, heads, scale, heads, MakeZeros(DType::kF32, {3})),
      "MergeScaledHeadsBackward", "d_heads");
  ExpectInvalidArgument(
      ops::MergeScaledHeadsBackward(tokens, heads, scale, MakeZeros(DType::kF32, {2, 3, 4, 5}),
                                    MakeZeros(DType::kF16, {3})),
      "MergeScaledHeadsBackward", "dscale");
}

}  // namespace
}  // namespace nf
