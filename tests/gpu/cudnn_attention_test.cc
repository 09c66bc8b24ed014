// cuDNN's fused attention (core/cuda/cudnn_attention.h) against the CPU and against the own
// kernel, and the dispatch between them (core/cuda/attention_dispatch.h): which calls cuDNN
// takes is checked with CudnnAttentionCalls() and, per direction, AttentionPathsTaken().
//
// Tolerances are relative to the largest magnitude of the reference, as in cuda_ops_test.cc,
// with u the unit roundoff of the 16-bit storage type (fp16 2^-11, bf16 2^-8):
// - lse (kReduction, 2e-5): an fp32 statistic of exact products of 16-bit inputs on both
//   sides, differing only in summation order and in cuDNN's exp2-based exponentials (a few
//   fp32 ulp).
// - out (4 u + kReduction): cuDNN, like every flash attention, rounds the probabilities (or
//   their unnormalised exponentials) to the storage type before P V, an error of at most
//   u * sum_j P_ij |V_j| <= u max|V| per row; with V in [-1, 1] and row 0's output equal to
//   V_0, max|V| is within a few percent of max|out|. Add 2 u for each side rounding its
//   result (the CPU's rounding is one of them) and a margin. Without the causal mask every row
//   averages all n keys and max|out| is only about 4 / sqrt(3 n) max|V| (0.35 at n = 45), but
//   the roundings are independent: their sum's standard deviation is about u / sqrt(3 n) max|V|,
//   so the largest error over a call is about u max|out|, within the same budget.
// - dq, dk, dv (8 u + kReduction): dS = P (dP - D) and P are rounded to the storage type
//   before the dS K, dS^T Q and P^T dO products, and D = rowsum(dO * out) uses each side's own
//   rounded out. The worst case is the column sums of P (up to ln(seq) ~ 5 for dV's first
//   key) times u; the rounding errors are independent, so the observed error is far below,
//   and 8 u keeps a margin over the bound's useful part without hiding a wrong mask or scale
//   (those err by O(1)).
// With attention dropout cuDNN draws its own masks, so those tests read the mask back from cuDNN
// and compare with a float64 reference that applies it, at the same tolerances (the reference
// rounds nothing, which leaves the CPU's share of the budget as margin).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/cuda/attention_dispatch.h"
#include "core/ops/op_timing.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gpu_test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using testing::ScopedAttentionPolicy;

using testing::ExpectAllClose;
using testing::kGpu;
using testing::MaxAbs;
using testing::OnGpu;
using testing::RandomTwin;
using testing::ToCpu;
using testing::ToDoubles;
using testing::Twin;
using testing::UnitRoundoff;
using testing::ZerosTwin;

using testing::kReduction;

// One attention problem [batch, heads, seq, head_dim]: inputs on both sides, outputs zeroed.
struct Problem {
  Problem(DType dtype, int64_t seq, int64_t dim, uint32_t seed)
      : shape{2, 3, seq, dim},
        q(RandomTwin(dtype, shape, seed)),
        k(RandomTwin(dtype, shape, seed + 1)),
        v(RandomTwin(dtype, shape, seed + 2)),
        dout(RandomTwin(dtype, shape, seed + 3)),
        out(ZerosTwin(dtype, shape)),
        lse(ZerosTwin(DType::kF32, {2, 3, seq})),
        dq(ZerosTwin(dtype, shape)),
        dk(ZerosTwin(dtype, shape)),
        dv(ZerosTwin(dtype, shape)),
        scale(1.0f / std::sqrt(static_cast<float>(dim))) {}

  // The forward, or the backward, on the CPU (gpu = false) or on GPU 0.
  absl::Status Forward(bool gpu, const ops::DropoutSpec& dropout, bool causal) const {
    auto on = [gpu](const Twin& t) { return gpu ? t.gpu : t.cpu; };
    return ops::AttentionForward({on(q), on(k), on(v), on(out), on(lse), scale, dropout, causal});
  }
  absl::Status Backward(bool gpu, const ops::DropoutSpec& dropout, bool causal) const {
    auto on = [gpu](const Twin& t) { return gpu ? t.gpu : t.cpu; };
    return ops::AttentionBackward({on(q), on(k), on(v), on(out), on(lse), on(dout), on(dq), on(dk),
                                   on(dv), scale, dropout, causal});
  }
  // Forward then backward on the CPU (gpu = false) or on GPU 0.
  absl::Status Run(bool gpu, const ops::DropoutSpec& dropout = {}, bool causal = true) const {
    NF_RETURN_IF_ERROR(Forward(gpu, dropout, causal));
    NF_RETURN_IF_ERROR(Backward(gpu, dropout, causal));
    return gpu ? ops::Synchronize(kGpu) : absl::OkStatus();
  }

  // The GPU results, copied to the host: out, lse, dq, dk, dv.
  std::vector<std::vector<double>> GpuResults() const {
    std::vector<std::vector<double>> results;
    for (const Twin* t : {&out, &lse, &dq, &dk, &dv}) results.push_back(ToDoubles(ToCpu(t->gpu)));
    return results;
  }
  std::vector<std::vector<double>> CpuResults() const {
    std::vector<std::vector<double>> results;
    for (const Twin* t : {&out, &lse, &dq, &dk, &dv}) results.push_back(ToDoubles(t->cpu));
    return results;
  }

  Shape shape;
  Twin q, k, v, dout, out, lse, dq, dk, dv;
  float scale;
};

// Expects `actual` (out, lse, dq, dk, dv) within the header's tolerances of `expected`.
void ExpectResultsClose(const std::vector<std::vector<double>>& actual,
                        const std::vector<std::vector<double>>& expected, DType dtype,
                        const std::string& what) {
  const double u = UnitRoundoff(dtype);
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  const double tols[] = {4 * u + kReduction, kReduction, 8 * u + kReduction, 8 * u + kReduction,
                         8 * u + kReduction};
  for (size_t i = 0; i < 5; ++i) {
    ExpectAllClose(actual[i], expected[i], tols[i] * MaxAbs(expected[i]), 0.0,
                   what + " " + names[i]);
  }
}

class CudnnAttentionTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    NF_REQUIRE_GPU();
    // On a GPU machine cuDNN must be usable: a fallback here would pass while testing nothing.
    auto context = cuda::CudaContext::ForDevice(0);
    NF_ASSERT_OK(context);
    const absl::Status cudnn = cuda::CudnnAttentionStatus(**context);
    NF_ASSERT_OK(cudnn);
  }
  DType dtype() const { return GetParam(); }
};

const char* MaskName(bool causal) { return causal ? "causal" : "non-causal"; }

// Causal and bidirectional calls of the same shapes, one after the other: each builds its own
// graphs (a graph shared between them would apply the other's mask, an O(1) error).
TEST_P(CudnnAttentionTest, MatchesTheCpu) {
  ScopedAttentionPolicy policy(nullptr);
  // seq 45 ends inside cuDNN's tiles; head_dim 128 is the largest it takes.
  for (int64_t seq : {45, 128}) {
    for (int64_t dim : {64, 128}) {
      for (const bool causal : {true, false}) {
        const std::string what = std::string(MaskName(causal)) + " seq " + std::to_string(seq) +
                                 " head_dim " + std::to_string(dim);
        Problem p(dtype(), seq, dim, 40);
        NF_ASSERT_OK(p.Run(false, {}, causal));
        const int64_t calls = cuda::CudnnAttentionCalls();
        const absl::Status status = p.Run(true, {}, causal);
        NF_ASSERT_OK(status) << what;
        EXPECT_EQ(cuda::CudnnAttentionCalls(), calls + 2) << what << ": cuDNN did not run both";
        ExpectResultsClose(p.GpuResults(), p.CpuResults(), dtype(), "cuDNN vs CPU, " + what);
      }
    }
  }
}

TEST_P(CudnnAttentionTest, MatchesTheOwnKernelAndRepeats) {
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(MaskName(causal));
    Problem p(dtype(), 128, 64, 50);
    {
      ScopedAttentionPolicy policy("own");
      const int64_t calls = cuda::CudnnAttentionCalls();
      NF_ASSERT_OK(p.Run(true, {}, causal));
      EXPECT_EQ(cuda::CudnnAttentionCalls(), calls) << "NF_ATTENTION=own still used cuDNN";
    }
    const auto own = p.GpuResults();
    ScopedAttentionPolicy policy(nullptr);
    NF_ASSERT_OK(p.Run(true, {}, causal));
    const auto cudnn = p.GpuResults();
    // The own kernel is within kReduction + 2 u of the CPU (cuda_ops_test.cc), so the CPU
    // tolerances hold between the two GPU paths as well.
    ExpectResultsClose(cudnn, own, dtype(), "cuDNN vs own kernel");
    // The deterministic backward: a second run is identical bit for bit.
    NF_ASSERT_OK(p.Run(true, {}, causal));
    EXPECT_EQ(p.GpuResults(), cudnn) << "cuDNN attention does not repeat exactly";
  }
}

// ---- Dropout on cuDNN ---------------------------------------------------------------------------
//
// cuDNN draws its own masks, so they are read back from cuDNN itself: with q = k = 0 every
// allowed key has probability 1 / n_i in row i (n_i = i + 1 causal, seq without the mask), and
// with v's key j the unit vector e_j (head_dim >= seq), out[b, h, i, j] = keep[b, h, i, j] /
// ((1 - p) n_i). The mask depends on the spec, the shape and the causal flag only, never on the
// values, so a call on real inputs with the same spec, shape and flag uses it too: its out, lse,
// dq, dk and dv are then checked against the float64 reference with that mask, at the
// tolerances of the header.

constexpr int64_t kDropoutSeq = 45, kDropoutDim = 64;
const ops::DropoutSpec kAttentionDropout{
    .p = 0.1f, .seed = 3, .site = 9, .first_sample = 7, .seq_len = kDropoutSeq, .head_offset = 2};

// The keys row i attends: i + 1 with the causal mask, seq without.
int64_t VisibleKeys(bool causal, int64_t i, int64_t seq) { return causal ? i + 1 : seq; }

// keep[b, h, i, j] for the keys j row i attends, row after row, as cuDNN draws it for `dropout`.
std::vector<int> CudnnMask(DType dtype, const ops::DropoutSpec& dropout, bool causal = true) {
  const Shape shape = {2, 3, kDropoutSeq, kDropoutDim};
  const int64_t rows = 2 * 3 * kDropoutSeq;
  std::vector<float> identity(rows * kDropoutDim, 0.0f);
  for (int64_t r = 0; r < rows; ++r) identity[r * kDropoutDim + r % kDropoutSeq] = 1.0f;
  const Tensor zeros = OnGpu(testing::MakeZeros(dtype, shape));
  const Tensor v = OnGpu(testing::MakeTensor(dtype, shape, identity));
  const Tensor out = OnGpu(testing::MakeZeros(dtype, shape));
  const Tensor lse = OnGpu(testing::MakeZeros(DType::kF32, {2, 3, kDropoutSeq}));
  const int64_t calls = cuda::CudnnAttentionCalls();
  NF_EXPECT_OK(ops::AttentionForward(
      {zeros, zeros, v, out, lse, 1.0f / std::sqrt(float{kDropoutDim}), dropout, causal}));
  NF_EXPECT_OK(ops::Synchronize(kGpu));
  EXPECT_EQ(cuda::CudnnAttentionCalls(), calls + 1) << "the mask was not cuDNN's";
  const std::vector<double> o = ToDoubles(ToCpu(out));
  std::vector<int> keep;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t keys = VisibleKeys(causal, r % kDropoutSeq, kDropoutSeq);
    for (int64_t j = 0; j < keys; ++j) {
      const double kept = o[r * kDropoutDim + j] * (1.0 - dropout.p) * static_cast<double>(keys);
      // A clean 0 or 1 (16-bit rounding moves it by 1% at most): anything else is no mask.
      EXPECT_TRUE(std::abs(kept) < 0.05 || std::abs(kept - 1.0) < 0.05)
          << "row " << r << " key " << j << ": " << kept;
      keep.push_back(kept > 0.5 ? 1 : 0);
    }
  }
  return keep;
}

// The float64 reference of attention, causal or not, with dropout mask `keep` (CudnnMask's
// order): forward and backward, as out, lse, dq, dk, dv.
std::vector<std::vector<double>> ReferenceWithMask(const Problem& p, const std::vector<int>& keep,
                                                   float dropout, bool causal) {
  const int64_t bh = p.shape[0] * p.shape[1], n = p.shape[2], d = p.shape[3];
  const std::vector<double> q = ToDoubles(p.q.cpu), k = ToDoubles(p.k.cpu), v = ToDoubles(p.v.cpu),
                            dout = ToDoubles(p.dout.cpu);
  std::vector<double> out(bh * n * d, 0.0), lse(bh * n), dq(bh * n * d, 0.0), dk(bh * n * d, 0.0),
      dv(bh * n * d, 0.0);
  const double kept_scale = 1.0 / (1.0 - dropout);
  size_t mask_index = 0;
  for (int64_t s = 0; s < bh; ++s) {
    const auto at = [&](const std::vector<double>& t, int64_t row, int64_t col) {
      return t[(s * n + row) * d + col];
    };
    for (int64_t i = 0; i < n; ++i) {
      const int64_t keys = VisibleKeys(causal, i, n);
      std::vector<double> prob(keys), dropped(keys);
      double max = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += at(q, i, c) * at(k, j, c);
        prob[j] = p.scale * dot;
        max = std::max(max, prob[j]);
      }
      double sum = 0.0;
      for (double& x : prob) sum += (x = std::exp(x - max));
      lse[s * n + i] = max + std::log(sum);
      for (int64_t j = 0; j < keys; ++j) {
        prob[j] /= sum;
        dropped[j] = prob[j] * keep[mask_index + j] * kept_scale;
        for (int64_t c = 0; c < d; ++c) out[(s * n + i) * d + c] += dropped[j] * at(v, j, c);
      }
      // dP_j = (dO_i . v_j) keep / (1 - p); D = sum_j P_j dP_j; dS_j = P_j (dP_j - D).
      std::vector<double> dprob(keys);
      double row_sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += at(dout, i, c) * at(v, j, c);
        dprob[j] = dot * keep[mask_index + j] * kept_scale;
        row_sum += prob[j] * dprob[j];
      }
      for (int64_t j = 0; j < keys; ++j) {
        const double ds = prob[j] * (dprob[j] - row_sum);
        for (int64_t c = 0; c < d; ++c) {
          dq[(s * n + i) * d + c] += p.scale * ds * at(k, j, c);
          dk[(s * n + j) * d + c] += p.scale * ds * at(q, i, c);
          dv[(s * n + j) * d + c] += dropped[j] * at(dout, i, c);
        }
      }
      mask_index += keys;
    }
  }
  return {out, lse, dq, dk, dv};
}

TEST_P(CudnnAttentionTest, DropoutMasksAreCudnnsRepeatAndDifferByCall) {
  ScopedAttentionPolicy policy(nullptr);
  const std::vector<int> keep = CudnnMask(dtype(), kAttentionDropout);
  // The kept fraction is 1 - p: 6210 Bernoulli draws, a standard deviation of 0.0038, and
  // 0.02 is over 5 of them.
  const double kept = static_cast<double>(std::count(keep.begin(), keep.end(), 1)) / keep.size();
  EXPECT_NEAR(kept, 1.0 - kAttentionDropout.p, 0.02);
  // Heads and samples of one call draw different masks.
  const size_t per_head = keep.size() / 6;
  for (size_t h = 1; h < 6; ++h) {
    EXPECT_FALSE(std::equal(keep.begin(), keep.begin() + per_head, keep.begin() + h * per_head))
        << "heads 0 and " << h << " of the call share a mask";
  }
  // The same spec draws the same mask (a run repeats; the backward redraws the forward's) ...
  EXPECT_EQ(CudnnMask(dtype(), kAttentionDropout), keep);
  // ... and another site, sample or shard another: two masks of p = 0.1 differ in 18% of
  // places on average; 5% is far below.
  for (auto change :
       {+[](ops::DropoutSpec& d) { d.site = 10; }, +[](ops::DropoutSpec& d) { d.first_sample = 9; },
        +[](ops::DropoutSpec& d) { d.head_offset = 5; }}) {
    ops::DropoutSpec other = kAttentionDropout;
    change(other);
    const std::vector<int> mask = CudnnMask(dtype(), other);
    size_t differ = 0;
    for (size_t i = 0; i < keep.size(); ++i) differ += mask[i] != keep[i];
    EXPECT_GT(differ, keep.size() / 20);
  }
}

TEST_P(CudnnAttentionTest, DropoutForwardAndBackwardMatchTheReferenceWithCudnnsMask) {
  ScopedAttentionPolicy policy(nullptr);
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(MaskName(causal));
    const std::vector<int> keep = CudnnMask(dtype(), kAttentionDropout, causal);
    // The kept fraction is 1 - p (over 6210 draws causal, 12150 without the mask: 0.02 is over 5
    // standard deviations).
    const double kept = static_cast<double>(std::count(keep.begin(), keep.end(), 1)) / keep.size();
    EXPECT_NEAR(kept, 1.0 - kAttentionDropout.p, 0.02);
    Problem p(dtype(), kDropoutSeq, kDropoutDim, 60);
    const int64_t calls = cuda::CudnnAttentionCalls();
    NF_ASSERT_OK(p.Run(true, kAttentionDropout, causal));
    EXPECT_EQ(cuda::CudnnAttentionCalls(), calls + 2) << "attention dropout did not run on cuDNN";
    ExpectResultsClose(p.GpuResults(), ReferenceWithMask(p, keep, kAttentionDropout.p, causal),
                       dtype(), "cuDNN dropout vs the float64 reference with cuDNN's mask");
    // The deterministic backward and a mask that is a function of the spec: bit for bit again.
    const auto first = p.GpuResults();
    NF_ASSERT_OK(p.Run(true, kAttentionDropout, causal));
    EXPECT_EQ(p.GpuResults(), first);
  }
}

TEST_P(CudnnAttentionTest, DropoutUnderNfAttentionOwnDrawsTheCpusMasks) {
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(MaskName(causal));
    Problem p(dtype(), kDropoutSeq, kDropoutDim, 60);
    NF_ASSERT_OK(p.Run(false, kAttentionDropout, causal));
    ScopedAttentionPolicy policy("own");
    const int64_t calls = cuda::CudnnAttentionCalls();
    NF_ASSERT_OK(p.Run(true, kAttentionDropout, causal));
    EXPECT_EQ(cuda::CudnnAttentionCalls(), calls);
    // The own kernel draws the CPU's masks: the results agree as in cuda_ops_test.cc (a wrong
    // mask would differ by O(1)).
    ExpectResultsClose(p.GpuResults(), p.CpuResults(), dtype(), "dropout, own kernel vs CPU");
  }
}

// A causal and a bidirectional call of one shape, scale and dropout have different keys, so each
// backward follows its own forward's path. Here the bidirectional forward runs the own kernel
// (NF_ATTENTION=own) and the causal one cuDNN after it; with one key for both, the
// bidirectional backward would follow the causal forward onto cuDNN and compute the gradients
// of cuDNN's mask instead of the own kernel's (the CPU's).
TEST_P(CudnnAttentionTest, CausalAndNonCausalCallsOfOneShapeKeepTheirOwnPaths) {
  ScopedAttentionPolicy policy(nullptr);
  Problem bidirectional(dtype(), kDropoutSeq, kDropoutDim, 100);
  Problem causal(dtype(), kDropoutSeq, kDropoutDim, 100);
  NF_ASSERT_OK(bidirectional.Run(false, kAttentionDropout, /*causal=*/false));
  const cuda::AttentionPathCounts before = cuda::AttentionPathsTaken();
  {
    ScopedAttentionPolicy own("own");
    NF_ASSERT_OK(bidirectional.Forward(true, kAttentionDropout, /*causal=*/false));
  }
  NF_ASSERT_OK(causal.Forward(true, kAttentionDropout, /*causal=*/true));
  NF_ASSERT_OK(bidirectional.Backward(true, kAttentionDropout, /*causal=*/false));
  NF_ASSERT_OK(causal.Backward(true, kAttentionDropout, /*causal=*/true));
  NF_ASSERT_OK(ops::Synchronize(kGpu));
  const cuda::AttentionPathCounts after = cuda::AttentionPathsTaken();
  EXPECT_EQ(after.forward_own - before.forward_own, 1);
  EXPECT_EQ(after.forward_cudnn - before.forward_cudnn, 1);
  EXPECT_EQ(after.backward_own - before.backward_own, 1) << "the bidirectional backward left "
                                                            "its forward's own kernel";
  EXPECT_EQ(after.backward_cudnn - before.backward_cudnn, 1);
  ExpectResultsClose(bidirectional.GpuResults(), bidirectional.CpuResults(), dtype(),
                     "bidirectional with dropout, own kernel vs CPU");
}

// The path each call took, and why, in the per-op timing.
TEST_P(CudnnAttentionTest, PerOpTimingNamesThePathAndItsReason) {
  ScopedAttentionPolicy policy(nullptr);
  Problem p(dtype(), kDropoutSeq, kDropoutDim, 70);
  ops::SetOpTimingEnabled(true);
  ops::TakeOpTimes();
  NF_ASSERT_OK(p.Run(true, kAttentionDropout));
  {
    ScopedAttentionPolicy own("own");
    NF_ASSERT_OK(p.Run(true));
  }
  const std::string table = ops::FormatOpTimes(ops::TakeOpTimes());
  ops::SetOpTimingEnabled(false);
  EXPECT_THAT(table, ::testing::HasSubstr("AttentionForward (cudnn): fp16/bf16"));
  EXPECT_THAT(table, ::testing::HasSubstr("AttentionBackward (cudnn): fp16/bf16"));
  EXPECT_THAT(table, ::testing::HasSubstr("dropout masks drawn by cuDNN"));
  EXPECT_THAT(table, ::testing::HasSubstr("AttentionForward (own): NF_ATTENTION=own"));
}

// ---- The training shape --------------------------------------------------------------------
//
// The 125M config's attention as it trains: micro-batch 16, 12 heads of 64, 2048 tokens, dropout
// 0.1, forward and backward, so that the deterministic backward runs with its full b h s^2
// workspace (1.5 GiB on Hopper). Each direction must take the path the check expects
// (ExpectedAttentionPath: cuDNN on the lent GPU), and the backward must use its forward's mask.
// That needs no copy of the mask: for a fixed mask, out is linear in v, so
// <dv, v> = <dout, out> in every (sample, head) slice; a backward drawing another mask of the
// same p misses that by about 45% of the slice's typical value (the masks differ in 2 p (1 - p)
// of the places), the 16-bit roundings by about 1%.

// sum over each [seq, dim] slice of a * b, in float64.
std::vector<double> SliceDots(const std::vector<double>& a, const std::vector<double>& b,
                              int64_t slices) {
  std::vector<double> dots(slices, 0.0);
  const size_t per = a.size() / slices;
  for (int64_t s = 0; s < slices; ++s) {
    for (size_t i = s * per; i < (s + 1) * per; ++i) dots[s] += a[i] * b[i];
  }
  return dots;
}

TEST_P(CudnnAttentionTest, TrainingShapeBackwardWithDropoutTakesTheExpectedPathAndItsForwardsMask) {
  const absl::StatusOr<cuda::AttentionPath> expected = testing::ExpectedAttentionPath(
      std::getenv("NF_EXPECT_ATTENTION"), std::getenv("NF_ATTENTION"));
  NF_ASSERT_OK(expected);
  const Shape shape = {16, 12, 2048, 64};
  const int64_t n = NumElements(shape), slices = 16 * 12;
  auto random = [&](uint32_t seed) {
    return OnGpu(testing::MakeTensor(dtype(), shape, testing::RandomFloats(n, seed)));
  };
  auto zeros = [&](Shape s, DType dt) { return OnGpu(testing::MakeZeros(dt, std::move(s))); };
  const Tensor q = random(11), k = random(12), v = random(13), dout = random(14);
  const Tensor out = zeros(shape, dtype()), lse = zeros({16, 12, 2048}, DType::kF32);
  const Tensor dq = zeros(shape, dtype()), dk = zeros(shape, dtype()), dv = zeros(shape, dtype());
  const ops::DropoutSpec dropout{.p = 0.1f, .seed = 1, .site = 4, .seq_len = 2048};
  const float scale = 1.0f / 8.0f;
  const cuda::AttentionPathCounts before = cuda::AttentionPathsTaken();
  NF_ASSERT_OK(ops::AttentionForward({q, k, v, out, lse, scale, dropout}));
  NF_ASSERT_OK(ops::AttentionBackward({q, k, v, out, lse, dout, dq, dk, dv, scale, dropout}));
  NF_ASSERT_OK(ops::Synchronize(kGpu));
  const cuda::AttentionPathCounts after = cuda::AttentionPathsTaken();
  const bool want_cudnn = *expected == cuda::AttentionPath::kCudnn;
  EXPECT_EQ(after.forward_cudnn - before.forward_cudnn, want_cudnn ? 1 : 0)
      << "the forward did not take the expected " << testing::AttentionPathName(*expected);
  EXPECT_EQ(after.backward_cudnn - before.backward_cudnn, want_cudnn ? 1 : 0)
      << "the backward did not take the expected " << testing::AttentionPathName(*expected);
  EXPECT_EQ(after.forward_own - before.forward_own, want_cudnn ? 0 : 1);
  EXPECT_EQ(after.backward_own - before.backward_own, want_cudnn ? 0 : 1);

  const std::vector<double> forward =
      SliceDots(ToDoubles(ToCpu(dout)), ToDoubles(ToCpu(out)), slices);
  const std::vector<double> backward = SliceDots(ToDoubles(ToCpu(dv)), ToDoubles(ToCpu(v)), slices);
  double mean_square = 0.0;
  for (double x : forward) mean_square += x * x / slices;
  const double typical = std::sqrt(mean_square);
  ASSERT_GT(typical, 0.0);
  int misses = 0;
  for (int64_t s = 0; s < slices; ++s) {
    if (std::abs(forward[s] - backward[s]) > 0.05 * typical) {
      if (++misses <= 5) {
        ADD_FAILURE() << "slice " << s << ": <dout, out> " << forward[s] << " but <dv, v> "
                      << backward[s] << " (typical " << typical
                      << "): the backward did not use its forward's dropout mask";
      }
    }
  }
  EXPECT_EQ(misses, 0);
  for (const Tensor* t : {&dq, &dk, &dv}) {
    const std::vector<double> values = ToDoubles(ToCpu(*t));
    EXPECT_TRUE(
        std::all_of(values.begin(), values.end(), [](double x) { return std::isfinite(x); }));
  }
}

// A backward that cannot follow a cuDNN forward with dropout (here NF_ATTENTION=own set between
// the two) is an error: the own kernel would compute the gradients of another mask. Without
// dropout the own kernel may take over (the same gradients).
TEST(CudnnAttentionDispatchTest, ABackwardThatCannotFollowACudnnForwardWithDropoutIsAnError) {
  NF_REQUIRE_GPU();
  Problem p(DType::kF16, kDropoutSeq, kDropoutDim, 90);
  auto forward = [&](const ops::DropoutSpec& d) {
    return ops::AttentionForward({p.q.gpu, p.k.gpu, p.v.gpu, p.out.gpu, p.lse.gpu, p.scale, d});
  };
  auto backward = [&](const ops::DropoutSpec& d) {
    return ops::AttentionBackward({p.q.gpu, p.k.gpu, p.v.gpu, p.out.gpu, p.lse.gpu, p.dout.gpu,
                                   p.dq.gpu, p.dk.gpu, p.dv.gpu, p.scale, d});
  };
  {
    ScopedAttentionPolicy policy(nullptr);
    const cuda::AttentionPathCounts before = cuda::AttentionPathsTaken();
    NF_ASSERT_OK(forward(kAttentionDropout));
    ASSERT_EQ(cuda::AttentionPathsTaken().forward_cudnn, before.forward_cudnn + 1);
  }
  {
    ScopedAttentionPolicy policy("own");
    const absl::Status status = backward(kAttentionDropout);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("its forward ran on cuDNN"));
  }
  {
    ScopedAttentionPolicy policy(nullptr);
    NF_ASSERT_OK(forward({}));
  }
  ScopedAttentionPolicy policy("own");
  const cuda::AttentionPathCounts before = cuda::AttentionPathsTaken();
  NF_ASSERT_OK(backward({}));
  NF_ASSERT_OK(ops::Synchronize(kGpu));
  EXPECT_EQ(cuda::AttentionPathsTaken().backward_own, before.backward_own + 1);
}

// The call key (which path a call takes, which cuDNN graph it runs) tells a causal call from a
// bidirectional one of the same shape, scale and dropout. Pure host logic: no GPU needed.
TEST(CudnnAttentionDispatchTest, TheCallKeyTellsCausalFromNonCausal) {
  const Tensor q = *Tensor::HostZeros(DType::kF16, {4, 16, 2048, 80});
  const ops::DropoutSpec dropout{.p = 0.1f, .seed = 7};
  const cuda::AttentionCallKey causal = cuda::AttentionKeyOf(0, q, 0.125f, dropout, true);
  const cuda::AttentionCallKey bidirectional = cuda::AttentionKeyOf(0, q, 0.125f, dropout, false);
  EXPECT_TRUE(causal.causal);
  EXPECT_FALSE(bidirectional.causal);
  EXPECT_NE(causal, bidirectional);
  EXPECT_EQ(cuda::AttentionKeyOf(0, q, 0.125f, dropout), causal);  // causal by default
  EXPECT_EQ(causal.ToString(), "[4, 16, 2048, 80] f16, dropout 0.1 on cuda:0");
  EXPECT_EQ(bidirectional.ToString(), "[4, 16, 2048, 80] f16, non-causal, dropout 0.1 on cuda:0");
  // A forward noted for one is no forward of the other.
  cuda::AttentionPathTable table;
  table.NoteForward(causal, cuda::AttentionPath::kCudnn);
  EXPECT_EQ(table.ForwardPath(bidirectional), std::nullopt);
  table.NoteForward(bidirectional, cuda::AttentionPath::kOwn);
  EXPECT_EQ(table.ForwardPath(causal), cuda::AttentionPath::kCudnn);
  EXPECT_EQ(table.ForwardPath(bidirectional), cuda::AttentionPath::kOwn);
}

TEST(CudnnAttentionDispatchTest, Fp32TakesTheOwnKernel) {
  NF_REQUIRE_GPU();
  ScopedAttentionPolicy policy(nullptr);
  Problem p(DType::kF32, 45, 64, 70);
  const int64_t calls = cuda::CudnnAttentionCalls();
  NF_ASSERT_OK(p.Run(true));
  EXPECT_EQ(cuda::CudnnAttentionCalls(), calls);
  ops::SetOpTimingEnabled(true);
  ops::TakeOpTimes();
  NF_ASSERT_OK(p.Run(true));
  const std::string table = ops::FormatOpTimes(ops::TakeOpTimes());
  ops::SetOpTimingEnabled(false);
  EXPECT_THAT(table, ::testing::HasSubstr("AttentionForward (own): fp32 storage"));
}

TEST(CudnnAttentionDispatchTest, UnknownPolicyIsAnError) {
  NF_REQUIRE_GPU();
  ScopedAttentionPolicy policy("cudnn-please");
  Problem p(DType::kF16, 45, 64, 80);
  const absl::Status status = p.Run(true);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudnnAttentionTest, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace nf
