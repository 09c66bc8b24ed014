// Tests of core/cpu/isa/isa.h: which levels run here, and NF_CPU_ISA's cap.
#include "core/cpu/isa/isa.h"

#include "gtest/gtest.h"

namespace nf::cpu {
namespace {

TEST(IsaTest, RunnableLevelsGoFromTheBaselineToTheDetectedOne) {
  const std::vector<Isa> levels = RunnableIsas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::kBaseline);
  EXPECT_EQ(levels.back(), DetectedIsa());
  EXPECT_LE(SelectedIsa(), DetectedIsa());
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The CPUID reading agrees with GCC's own test of the levels the variants are compiled for.
TEST(IsaTest, DetectionAgreesWithGccsLevelTest) {
  const Isa gcc = __builtin_cpu_supports("x86-64-v4")   ? Isa::kAvx512
                  : __builtin_cpu_supports("x86-64-v3") ? Isa::kAvx2
                                                        : Isa::kBaseline;
  EXPECT_EQ(DetectedIsa(), gcc);
}
#endif

TEST(IsaTest, TheEnvironmentCapsTheLevelAndNeverRaisesIt) {
  EXPECT_EQ(CappedIsa(nullptr, Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(CappedIsa("", Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(CappedIsa("baseline", Isa::kAvx512), Isa::kBaseline);
  EXPECT_EQ(CappedIsa("avx2", Isa::kAvx512), Isa::kAvx2);
  EXPECT_EQ(CappedIsa("avx512", Isa::kAvx2), Isa::kAvx2);  // not on a CPU without it
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(CappedIsa(IsaName(isa), Isa::kAvx512), isa);
  }
}

TEST(IsaTest, AnUnknownLevelEndsTheProcessNamingIt) {
  EXPECT_EXIT(CappedIsa("sse9", Isa::kAvx2), ::testing::ExitedWithCode(2),
              "NF_CPU_ISA=sse9: expected baseline, avx2 or avx512 \\(unset: the best this CPU "
              "runs, avx2\\)");
}

}  // namespace
}  // namespace nf::cpu
