// Tests of parallel/data_parallel_optimizer.h on 2 and 4 ranks (nf_add_mpi_test). Every rank
// contributes different gradients; the reference is one AdamW on each rank over the summed
// gradients, computed locally from everyone's contributions. The contributions are multiples
// of 1/4 below 4 in magnitude, so their sums are exact in any order, and AdamW is elementwise:
// the replicated and the ZeRO-1 sharded optimizer must give bit-identical parameters to the
// reference (clipping off; the norm is checked separately with a tolerance). The check for an
// update that would overflow the model dtype, maxed over the ranks, is the reference's.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "mpi_test_util.h"
#include "parallel/data_parallel_optimizer.h"
#include "test_util.h"

namespace nf::parallel {
namespace {

using ::nf::testing::World;

constexpr int64_t kNumel = 72;  // divides by 2, 3 and 4
// What AdamW updates; the elements in between are padding it never touches.
const std::vector<optim::ParamRange> kRanges = {
    {.offset = 0, .length = 20, .weight_decay = true},
    {.offset = 20, .length = 5, .weight_decay = false},
    {.offset = 30, .length = 33, .weight_decay = true},
    {.offset = 63, .length = 6, .weight_decay = false},
};
constexpr optim::AdamWConfig kAdamW = {
    .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f, .weight_decay = 0.1f, .clip_grad = 0.0f};

float Grad(int rank, int step, int64_t i) {
  return static_cast<float>((rank * 5 + step * 3 + i * 7) % 31 - 15) / 4.0f;
}

std::vector<float> InitialParams() {
  std::vector<float> p(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) p[i] = static_cast<float>(i % 9 - 4) / 8.0f;
  return p;
}

// Fills `grads` with rank `rank`'s contribution (rank -1: the sum over all ranks).
void FillGrads(const Tensor& grads, int rank, int step, int ranks) {
  std::vector<float> g(kNumel, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    if (rank >= 0 && r != rank) continue;
    for (int64_t i = 0; i < kNumel; ++i) g[i] += Grad(r, step, i);
  }
  NF_ASSERT_OK(CopyFromFloats(grads, g));
}

struct Case {
  DType dtype;
  bool sharded;
  int64_t bucket_elements;
};

class DataParallelOptimizerTest : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(Cases, DataParallelOptimizerTest,
                         ::testing::Values(Case{DType::kF32, false, 16},
                                           Case{DType::kF32, true, 16},
                                           Case{DType::kF32, true, 1000},
                                           Case{DType::kF16, true, 10},
                                           Case{DType::kBF16, false, 24}));

TEST_P(DataParallelOptimizerTest, MatchesOneAdamWOverTheSummedGradients) {
  const Case c = GetParam();
  MpiCommunicator& dp = World();
  Tensor params = *TensorFromFloats(c.dtype, {kNumel}, InitialParams());
  Tensor grads = *Tensor::HostZeros(DType::kF32, {kNumel});
  auto opt = DataParallelOptimizer::Create(
      params, grads, kRanges, kAdamW, dp,
      {.bucket_elements = c.bucket_elements, .shard_optimizer = c.sharded, .hold_below = 8});
  NF_ASSERT_OK(opt);
  NF_ASSERT_OK((*opt)->InitializeMasterFromModel());
  // Sharding divides the optimizer state by dp.
  const int64_t state = c.sharded ? kNumel / dp.size() : kNumel;
  EXPECT_EQ((*opt)->adamw().exp_avg().numel(), state);
  EXPECT_EQ((*opt)->adamw().master().numel(), state);

  Tensor ref_params = *TensorFromFloats(c.dtype, {kNumel}, InitialParams());
  Tensor ref_grads = *Tensor::HostZeros(DType::kF32, {kNumel});
  auto ref = optim::MixedPrecisionAdamW::Create(ref_params, ref_grads, kRanges, kAdamW);
  NF_ASSERT_OK(ref);
  NF_ASSERT_OK(ref->InitializeMasterFromModel());

  for (int step = 0; step < 3; ++step) {
    FillGrads(grads, dp.rank(), step, dp.size());
    dp.ResetStats();
    // A backward finishing gradients from the top down, in uneven steps.
    for (int64_t offset : {60, 41, 40, 7, 0}) NF_ASSERT_OK((*opt)->GradsDoneFrom(offset));
    NF_ASSERT_OK((*opt)->FinishGradReduction());
    const CommStats& stats = dp.stats();
    const int reduce = static_cast<int>(c.sharded ? CommOp::kReduceScatter : CommOp::kAllReduce);
    EXPECT_EQ(stats.bytes[reduce], kNumel * 4);  // every gradient once, fp32
    EXPECT_EQ(stats.calls[reduce], static_cast<int64_t>((*opt)->buckets().size()));
    auto found = (*opt)->UnscaleAndCheck(2.0f);
    NF_ASSERT_OK(found);
    ASSERT_FALSE(*found);
    NF_ASSERT_OK((*opt)->Update(1e-2f, 0.0));
    if (c.sharded) {  // the parameters are gathered back, in the model dtype
      EXPECT_EQ(stats.bytes[static_cast<int>(CommOp::kAllGather)],
                kNumel * static_cast<int64_t>(SizeOf(c.dtype)));
    }

    FillGrads(ref_grads, -1, step, dp.size());
    auto ref_found = ref->UnscaleAndCheck(2.0f);
    NF_ASSERT_OK(ref_found);
    ASSERT_FALSE(*ref_found);
    NF_ASSERT_OK(ref->Update(1e-2f, 0.0));
    EXPECT_EQ(*ToFloatVector(params), *ToFloatVector(ref_params)) << "step " << step;
  }
}

// The squared norm of the counted ranges: each rank's share (all of it replicated, its shard
// sharded) summed as the trainer does gives the reference norm of the summed gradients.
TEST_P(DataParallelOptimizerTest, SquaredNormSharesAddUpToTheWholeNorm) {
  const Case c = GetParam();
  MpiCommunicator& dp = World();
  Tensor params = *TensorFromFloats(c.dtype, {kNumel}, InitialParams());
  Tensor grads = *Tensor::HostZeros(DType::kF32, {kNumel});
  auto opt = DataParallelOptimizer::Create(
      params, grads, kRanges, kAdamW, dp,
      {.bucket_elements = c.bucket_elements, .shard_optimizer = c.sharded});
  NF_ASSERT_OK(opt);
  FillGrads(grads, dp.rank(), 1, dp.size());
  NF_ASSERT_OK((*opt)->FinishGradReduction());
  const std::vector<optim::FlatRange> counted = {{.offset = 3, .length = 30},
                                                 {.offset = 50, .length = 19}};
  auto share = (*opt)->SquaredGradNorm(counted);
  NF_ASSERT_OK(share);
  Tensor total = *Tensor::HostZeros(DType::kF64, {1});
  total.data<double>()[0] = *share;
  if (c.sharded) {
    NF_ASSERT_OK(dp.AllReduce(total, ReduceOp::kSum));
  }

  Tensor summed = *Tensor::HostZeros(DType::kF32, {kNumel});
  FillGrads(summed, -1, 1, dp.size());
  const std::vector<float> g = *ToFloatVector(summed);
  double expected = 0.0;
  for (const optim::FlatRange& r : counted) {
    for (int64_t i = r.offset; i < r.offset + r.length; ++i) expected += double{g[i]} * g[i];
  }
  // Squares of multiples of 1/4 below 4 * ranks in magnitude, summed in fp32 (partial sums
  // below 2^16, in steps of 2^-4: exact while below 2^20), so the shares are exact.
  EXPECT_EQ(total.data<double>()[0], expected);
}

// One no-decay element (65) sits near the model dtype's largest finite value, pointed so that
// AdamW pushes it outwards: at the large lr its update overflows, nobody else's does. Each rank
// checks what it updates (everything replicated, its shard sharded: then only the element's
// owner sees it), and the max over dp, as the trainer takes it over the world, is the answer of
// one AdamW over the summed gradients on every rank. The checks write nothing.
TEST_P(DataParallelOptimizerTest, OverflowCheckMaxedOverRanksMatchesOneAdamW) {
  const Case c = GetParam();
  MpiCommunicator& dp = World();
  constexpr int64_t kHot = 65;
  Tensor summed = *Tensor::HostZeros(DType::kF32, {kNumel});
  FillGrads(summed, -1, 0, dp.size());
  const float g_hot = summed.data<float>()[kHot];
  ASSERT_NE(g_hot, 0.0f);
  // |hot| representable in the dtype, and an lr that carries it past the largest finite value
  // (fp16 65504; bf16 and f32 ~3.39e38 and ~3.40e38) while every other weight stays far below.
  const float hot =
      c.dtype == DType::kF16 ? 64992.0f : (c.dtype == DType::kBF16 ? 0x1.FCp127f : 3.4e38f);
  // bf16: lands near 3.401e38, finite in fp32 but past bf16's rounding limit 3.3962e38.
  const float lr_over =
      c.dtype == DType::kF16 ? 1000.0f : (c.dtype == DType::kBF16 ? 2.5e36f : 1e37f);
  std::vector<float> init = InitialParams();
  init[kHot] = g_hot > 0 ? -hot : hot;  // AdamW's first step moves it by ~lr against g
  Tensor params = *TensorFromFloats(c.dtype, {kNumel}, init);
  Tensor grads = *Tensor::HostZeros(DType::kF32, {kNumel});
  auto opt = DataParallelOptimizer::Create(
      params, grads, kRanges, kAdamW, dp,
      {.bucket_elements = c.bucket_elements, .shard_optimizer = c.sharded});
  NF_ASSERT_OK(opt);
  NF_ASSERT_OK((*opt)->InitializeMasterFromModel());
  Tensor ref_params = *TensorFromFloats(c.dtype, {kNumel}, init);
  auto ref = optim::MixedPrecisionAdamW::Create(ref_params, summed, kRanges, kAdamW);
  NF_ASSERT_OK(ref);
  NF_ASSERT_OK(ref->InitializeMasterFromModel());

  FillGrads(grads, dp.rank(), 0, dp.size());
  NF_ASSERT_OK((*opt)->FinishGradReduction());
  auto found = (*opt)->UnscaleAndCheck(1.0f);
  NF_ASSERT_OK(found);
  ASSERT_FALSE(*found);
  const std::vector<float> params0 = *ToFloatVector(params), grads0 = *ToFloatVector(grads);
  const std::vector<float> master0 = *ToFloatVector((*opt)->adamw().master());
  for (const float lr : {1e-2f, lr_over}) {
    SCOPED_TRACE(lr);
    auto local = (*opt)->UpdateWouldOverflow(lr, 0.0);
    NF_ASSERT_OK(local);
    Tensor flag = *Tensor::HostZeros(DType::kF32, {1});
    flag.data<float>()[0] = *local ? 1.0f : 0.0f;
    Tensor ranks_seeing = *Tensor::HostZeros(DType::kF32, {1});
    ranks_seeing.data<float>()[0] = flag.data<float>()[0];
    NF_ASSERT_OK(dp.AllReduce(flag, ReduceOp::kMax));
    NF_ASSERT_OK(dp.AllReduce(ranks_seeing, ReduceOp::kSum));
    auto expected = ref->UpdateWouldOverflow(lr, 0.0);
    NF_ASSERT_OK(expected);
    EXPECT_EQ(*expected, lr == lr_over);
    EXPECT_EQ(flag.data<float>()[0] != 0.0f, *expected);
    if (*expected) {
      EXPECT_EQ(ranks_seeing.data<float>()[0], c.sharded ? 1.0f : static_cast<float>(dp.size()));
    }
    EXPECT_EQ(*ToFloatVector(params), params0);
    EXPECT_EQ(*ToFloatVector(grads), grads0);
    EXPECT_EQ(*ToFloatVector((*opt)->adamw().master()), master0);
    EXPECT_EQ((*opt)->adamw().updates(), 0);
  }
}

TEST(GradBucketsTest, CarvesFromTheTopInMultiplesOfTheDataParallelSize) {
  auto buckets = MakeGradBuckets(22, 5, 2, 1);
  NF_ASSERT_OK(buckets);
  // Buckets of 6 (5 rounded up to a multiple of 2) from the top; the lowest holds the rest.
  ASSERT_EQ(buckets->size(), 4u);
  const int64_t begins[] = {0, 4, 10, 16}, ends[] = {4, 10, 16, 22};
  int64_t shard = 0;
  for (size_t i = 0; i < 4; ++i) {
    const GradBucket& b = (*buckets)[i];
    EXPECT_EQ(b.begin, begins[i]);
    EXPECT_EQ(b.end, ends[i]);
    EXPECT_EQ(b.slice_length, (b.end - b.begin) / 2);
    EXPECT_EQ(b.slice_offset, b.begin + b.slice_length);  // rank 1: the upper half
    EXPECT_EQ(b.shard_offset, shard);
    shard += b.slice_length;
  }
  EXPECT_EQ(shard, 11);
  auto odd = MakeGradBuckets(21, 5, 2, 0);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(),
            "gradient buffer of 21 elements does not divide by data_parallel 2: pad it to a "
            "multiple");
}

}  // namespace
}  // namespace nf::parallel
