// cuDNN's fused attention (core/cuda/cudnn_attention.h) against the CPU and against the own
// kernel, and the dispatch between them (core/cuda/attention_dispatch.h): which calls cuDNN
// takes is checked with CudnnAttentionCalls().
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
//   result (the CPU's rounding is one of them) and a margin.
// - dq, dk, dv (8 u + kReduction): dS = P (dP - D) and P are rounded to the storage type
//   before the dS K, dS^T Q and P^T dO products, and D = rowsum(dO * out) uses each side's own
//   rounded out. The worst case is the column sums of P (up to ln(seq) ~ 5 for dV's first
//   key) times u; the rounding errors are independent, so the observed error is far below,
//   and 8 u keeps a margin over the bound's useful part without hiding a wrong mask or scale
//   (those err by O(1)).
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/cuda/attention_dispatch.h"
#include "core/status.h"
#include "gpu_test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using testing::ExpectAllClose;
using testing::kGpu;
using testing::MaxAbs;
using testing::RandomTwin;
using testing::ToCpu;
using testing::ToDoubles;
using testing::Twin;
using testing::UnitRoundoff;
using testing::ZerosTwin;

constexpr double kReduction = 2e-5;

// Sets NF_ATTENTION for a scope (nullptr: unset) and restores the previous value.
class ScopedAttentionPolicy {
 public:
  explicit ScopedAttentionPolicy(const char* value) {
    if (const char* old = std::getenv("NF_ATTENTION"); old != nullptr) previous_ = old;
    Set(value);
  }
  ~ScopedAttentionPolicy() { Set(previous_ ? previous_->c_str() : nullptr); }

 private:
  static void Set(const char* value) {
    if (value == nullptr) {
      unsetenv("NF_ATTENTION");
    } else {
      setenv("NF_ATTENTION", value, 1);
    }
  }
  std::optional<std::string> previous_;
};

// One causal attention problem [batch, heads, seq, head_dim]: inputs on both sides, outputs
// zeroed.
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

  // Forward then backward on the CPU (gpu = false) or on GPU 0.
  absl::Status Run(bool gpu, const ops::DropoutSpec& dropout = {}) const {
    auto on = [gpu](const Twin& t) { return gpu ? t.gpu : t.cpu; };
    NF_RETURN_IF_ERROR(
        ops::AttentionForward({on(q), on(k), on(v), on(out), on(lse), scale, dropout}));
    NF_RETURN_IF_ERROR(ops::AttentionBackward(
        {on(q), on(k), on(v), on(out), on(lse), on(dout), on(dq), on(dk), on(dv), scale, dropout}));
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

TEST_P(CudnnAttentionTest, MatchesTheCpu) {
  ScopedAttentionPolicy policy(nullptr);
  // seq 45 ends inside cuDNN's tiles; head_dim 128 is the largest it takes.
  for (int64_t seq : {45, 128}) {
    for (int64_t dim : {64, 128}) {
      const std::string what = "seq " + std::to_string(seq) + " head_dim " + std::to_string(dim);
      Problem p(dtype(), seq, dim, 40);
      NF_ASSERT_OK(p.Run(false));
      const int64_t calls = cuda::CudnnAttentionCalls();
      const absl::Status status = p.Run(true);
      NF_ASSERT_OK(status) << what;
      EXPECT_EQ(cuda::CudnnAttentionCalls(), calls + 2) << what << ": cuDNN did not run both";
      ExpectResultsClose(p.GpuResults(), p.CpuResults(), dtype(), "cuDNN vs CPU, " + what);
    }
  }
}

TEST_P(CudnnAttentionTest, MatchesTheOwnKernelAndRepeats) {
  Problem p(dtype(), 128, 64, 50);
  {
    ScopedAttentionPolicy policy("own");
    const int64_t calls = cuda::CudnnAttentionCalls();
    NF_ASSERT_OK(p.Run(true));
    EXPECT_EQ(cuda::CudnnAttentionCalls(), calls) << "NF_ATTENTION=own still used cuDNN";
  }
  const auto own = p.GpuResults();
  ScopedAttentionPolicy policy(nullptr);
  NF_ASSERT_OK(p.Run(true));
  const auto cudnn = p.GpuResults();
  // The own kernel is within kReduction + 2 u of the CPU (cuda_ops_test.cc), so the CPU
  // tolerances hold between the two GPU paths as well.
  ExpectResultsClose(cudnn, own, dtype(), "cuDNN vs own kernel");
  // The deterministic backward: a second run is identical bit for bit.
  NF_ASSERT_OK(p.Run(true));
  EXPECT_EQ(p.GpuResults(), cudnn) << "cuDNN attention does not repeat exactly";
}

TEST_P(CudnnAttentionTest, DropoutTakesTheOwnKernel) {
  ScopedAttentionPolicy policy(nullptr);
  const ops::DropoutSpec dropout{.p = 0.1f,
                                 .seed = 3,
                                 .site = 9,
                                 .first_sample = 7,
                                 .seq_len = 1,
                                 .col_offset = 0,
                                 .head_offset = 2};
  Problem p(dtype(), 45, 64, 60);
  NF_ASSERT_OK(p.Run(false, dropout));
  const int64_t calls = cuda::CudnnAttentionCalls();
  NF_ASSERT_OK(p.Run(true, dropout));
  EXPECT_EQ(cuda::CudnnAttentionCalls(), calls) << "attention dropout ran on cuDNN";
  // The own kernel draws the CPU's masks: the results agree as in cuda_ops_test.cc (a wrong
  // mask would differ by O(1)).
  ExpectResultsClose(p.GpuResults(), p.CpuResults(), dtype(), "dropout, own kernel vs CPU");
}

TEST(CudnnAttentionDispatchTest, Fp32TakesTheOwnKernel) {
  NF_REQUIRE_GPU();
  ScopedAttentionPolicy policy(nullptr);
  Problem p(DType::kF32, 45, 64, 70);
  const int64_t calls = cuda::CudnnAttentionCalls();
  NF_ASSERT_OK(p.Run(true));
  EXPECT_EQ(cuda::CudnnAttentionCalls(), calls);
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
