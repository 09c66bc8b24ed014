// The CPU backend promises bit-identical results for any thread count (core/thread_pool.h).
// The pool's size is fixed per process (NF_NUM_THREADS), so this test runs itself as a child
// process with 1, 2 and 3 threads; each child runs every op on shapes large enough to be split
// into several chunks, and prints a 64-bit FNV-1a digest of all outputs. The digests must agree.
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::MakeIds;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;

class Digest {
 public:
  void Add(const Tensor& t) {
    const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) hash_ = (hash_ ^ bytes[i]) * 0x100000001B3ull;
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xCBF29CE484222325ull;
};

Tensor Random(DType dtype, Shape shape, uint32_t seed) {
  return MakeTensor(dtype, shape, RandomFloats(NumElements(shape), seed));
}

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "op failed: %s\n", std::string(status.message()).c_str());
    std::exit(1);
  }
}

// Every op with reductions or parallel splits, outputs folded into one digest.
uint64_t RunAllOps() {
  Digest digest;
  const ops::DropoutSpec dropout{
      .p = 0.25f, .seed = 7, .site = 3, .first_sample = 11, .seq_len = 64};
  {  // GEMM: 3 row blocks of 256, fp16 operands into fp32 C with accumulation.
    Tensor c = Random(DType::kF32, {600, 200}, 1);
    Check(ops::Gemm({.a = Random(DType::kF16, {300, 600}, 2),
                     .b = Random(DType::kF16, {300, 200}, 3),
                     .c = c,
                     .trans_a = true,
                     .beta = 1.0f}));
    digest.Add(c);
  }
  {  // GEMM with a C too small for row blocks alone: column blocks (the tiny model's fc1,
     // [256, 512] from K = 128), then K chunks added in order (an LM head's input gradient).
    for (const auto& [m, n, k] : {std::array<int64_t, 3>{256, 512, 128}, {64, 96, 4000}}) {
      Tensor c = Random(DType::kF32, {m, n}, 17);
      Check(ops::Gemm({.a = Random(DType::kF32, {m, k}, 18),
                       .b = Random(DType::kF32, {k, n}, 19),
                       .c = c,
                       .beta = 1.0f}));
      digest.Add(c);
    }
  }
  {  // GEMM's skinny path (decoding): 3 rows against bf16 weights [700, 300], split over threads
     // by weight rows.
    Tensor c = Random(DType::kBF16, {3, 700}, 20);
    Check(ops::Gemm({.a = Random(DType::kBF16, {3, 300}, 21),
                     .b = Random(DType::kBF16, {700, 300}, 22),
                     .c = c,
                     .trans_b = true,
                     .beta = 0.5f}));
    digest.Add(c);
  }
  {  // LayerNorm forward and backward, bias gradient, activation, dropout.
    const int64_t rows = 512, cols = 256;
    ops::LayerNormArgs fwd{.x = Random(DType::kBF16, {rows, cols}, 4),
                           .weight = Random(DType::kF32, {cols}, 5),
                           .bias = Random(DType::kF32, {cols}, 6),
                           .y = MakeZeros(DType::kBF16, {rows, cols}),
                           .mean = MakeZeros(DType::kF32, {rows}),
                           .rstd = MakeZeros(DType::kF32, {rows})};
    Check(ops::LayerNormForward(fwd));
    ops::LayerNormBackwardArgs bwd{.dy = Random(DType::kBF16, {rows, cols}, 7),
                                   .x = fwd.x,
                                   .weight = fwd.weight,
                                   .mean = fwd.mean,
                                   .rstd = fwd.rstd,
                                   .dx = MakeZeros(DType::kBF16, {rows, cols}),
                                   .dweight = MakeZeros(DType::kF32, {cols}),
                                   .dbias = MakeZeros(DType::kF32, {cols})};
    Check(ops::LayerNormBackward(bwd));
    Tensor dbias = MakeZeros(DType::kF32, {cols});
    Check(ops::BiasBackward(bwd.dy, dbias));
    Check(ops::ActivationForward(ops::Activation::kGelu, fwd.y, fwd.y));
    Check(ops::Dropout(fwd.y, fwd.y, dropout));
    for (const Tensor& t : {fwd.y, fwd.mean, fwd.rstd, bwd.dx, bwd.dweight, bwd.dbias, dbias}) {
      digest.Add(t);
    }
  }
  {  // Attention forward and backward with dropout.
    const Shape shape{2, 3, 64, 16};
    ops::AttentionArgs fwd{.q = Random(DType::kF32, shape, 8),
                           .k = Random(DType::kF32, shape, 9),
                           .v = Random(DType::kF32, shape, 10),
                           .out = MakeZeros(DType::kF32, shape),
                           .lse = MakeZeros(DType::kF32, {2, 3, 64}),
                           .scale = 0.25f,
                           .dropout = dropout};
    Check(ops::AttentionForward(fwd));
    ops::AttentionBackwardArgs bwd{.q = fwd.q,
                                   .k = fwd.k,
                                   .v = fwd.v,
                                   .out = fwd.out,
                                   .lse = fwd.lse,
                                   .dout = Random(DType::kF32, shape, 11),
                                   .dq = MakeZeros(DType::kF32, shape),
                                   .dk = MakeZeros(DType::kF32, shape),
                                   .dv = MakeZeros(DType::kF32, shape),
                                   .scale = fwd.scale,
                                   .dropout = dropout};
    Check(ops::AttentionBackward(bwd));
    for (const Tensor& t : {fwd.out, fwd.lse, bwd.dq, bwd.dk, bwd.dv}) digest.Add(t);
  }
  {  // NormFormer's head scales: fused with the head merge, and on [tokens, heads, dim].
    const Shape shape{6, 4, 40, 24};  // 24 (batch, head) blocks of the fused backward
    const Tensor heads = Random(DType::kF32, shape, 30);
    const Tensor scale = Random(DType::kF32, {4}, 31);
    Tensor merged = MakeZeros(DType::kF32, {240, 96}), d_heads = MakeZeros(DType::kF32, shape);
    Tensor dscale = MakeZeros(DType::kF32, {4}), d_tokens = MakeZeros(DType::kF32, {240, 96});
    Check(ops::MergeScaledHeads(heads, scale, merged));
    Check(ops::MergeScaledHeadsBackward(Random(DType::kF32, {240, 96}, 32), heads, scale, d_heads,
                                        dscale));
    Check(ops::ScaleChannelsBackward(merged, scale, 24, Random(DType::kF32, {240, 96}, 33),
                                     d_tokens, dscale));
    for (const Tensor& t : {merged, d_heads, d_tokens, dscale}) digest.Add(t);
  }
  {  // The residual add with NormFormer's branch LayerNorm and the next LayerNorm, with dropout:
     // 5 forward chunks of 16 rows, 2 parameter-gradient blocks of 64 (one partial).
    const int64_t rows = 70, cols = 40;
    const ops::ResidualNormArgs fwd{.dropout = dropout,
                                    .x = Random(DType::kF32, {rows, cols}, 40),
                                    .branch = Random(DType::kF32, {rows, cols}, 41),
                                    .residual = MakeZeros(DType::kF32, {rows, cols}),
                                    .weight = Random(DType::kF32, {cols}, 42),
                                    .bias = Random(DType::kF32, {cols}, 43),
                                    .y = MakeZeros(DType::kF32, {rows, cols}),
                                    .mean = MakeZeros(DType::kF32, {rows}),
                                    .rstd = MakeZeros(DType::kF32, {rows}),
                                    .branch_weight = Random(DType::kF32, {cols}, 44),
                                    .branch_bias = Random(DType::kF32, {cols}, 45),
                                    .branch_mean = MakeZeros(DType::kF32, {rows}),
                                    .branch_rstd = MakeZeros(DType::kF32, {rows}),
                                    .scratch = MakeZeros(DType::kF32, {rows, cols})};
    Check(ops::ResidualNormForward(fwd));
    const ops::ResidualNormBackwardArgs bwd{.dropout = dropout,
                                            .dy = Random(DType::kF32, {rows, cols}, 46),
                                            .residual = fwd.residual,
                                            .weight = fwd.weight,
                                            .mean = fwd.mean,
                                            .rstd = fwd.rstd,
                                            .branch = fwd.branch,
                                            .d_residual = Random(DType::kF32, {rows, cols}, 47),
                                            .d_branch = MakeZeros(DType::kF32, {rows, cols}),
                                            .dweight = MakeZeros(DType::kF32, {cols}),
                                            .dbias = MakeZeros(DType::kF32, {cols}),
                                            .scratch = fwd.scratch,
                                            .branch_weight = fwd.branch_weight,
                                            .branch_mean = fwd.branch_mean,
                                            .branch_rstd = fwd.branch_rstd,
                                            .d_branch_weight = MakeZeros(DType::kF32, {cols}),
                                            .d_branch_bias = MakeZeros(DType::kF32, {cols})};
    Check(ops::ResidualNormBackward(bwd));
    for (const Tensor& t :
         {fwd.residual, fwd.y, fwd.mean, fwd.rstd, fwd.branch_mean, fwd.branch_rstd, bwd.d_residual,
          bwd.d_branch, bwd.dweight, bwd.dbias, bwd.d_branch_weight, bwd.d_branch_bias}) {
      digest.Add(t);
    }
  }
  {  // Embedding backward (repeated ids), cross-entropy forward and backward, softmax.
    const int64_t tokens = 700, vocab = 300, width = 32;
    std::vector<int32_t> ids(tokens);
    for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 37) % vocab);
    Tensor tids = MakeIds({tokens}, ids);
    Tensor dtable = MakeZeros(DType::kF32, {vocab, width});
    Check(ops::EmbeddingBackward(tids, Random(DType::kF32, {tokens, width}, 12), dtable, 0));
    ops::CrossEntropyArgs ce{.logits = Random(DType::kF16, {tokens, vocab}, 13),
                             .targets = tids,
                             .valid_vocab = vocab - 4};
    for (int32_t& id : ids) id = id % (vocab - 4);
    std::copy(ids.begin(), ids.end(), tids.data<int32_t>());
    Tensor row_max = MakeZeros(DType::kF32, {tokens}), sum_exp = MakeZeros(DType::kF32, {tokens});
    Tensor loss = MakeZeros(DType::kF32, {tokens});
    Check(ops::CrossEntropyForward(ce, row_max, sum_exp, loss));
    Tensor dlogits = MakeZeros(DType::kF16, {tokens, vocab});
    Check(ops::CrossEntropyBackward(ce, row_max, sum_exp, Random(DType::kF32, {tokens}, 14),
                                    dlogits));
    Tensor probs = MakeZeros(DType::kF16, {tokens, vocab});
    Check(ops::SoftmaxForward(ce.logits, probs));
    for (const Tensor& t : {dtable, loss, dlogits, probs}) digest.Add(t);
  }
  {  // Optimizer: AdamW, unscale, squared norm over more than one reduction block.
    const int64_t n = 100003;
    ops::AdamWArgs adam{.params = Random(DType::kF32, {n}, 15),
                        .grads = Random(DType::kF32, {n}, 16),
                        .exp_avg = MakeZeros(DType::kF32, {n}),
                        .exp_avg_sq = MakeZeros(DType::kF32, {n}),
                        .weight_decay = 0.01f};
    Check(ops::AdamWStep(adam));
    Tensor found = MakeZeros(DType::kF32, {1}), norm = MakeZeros(DType::kF32, {1});
    Check(ops::UnscaleAndCheck(adam.grads, 0.5f, found));
    Check(ops::SquaredNorm(adam.params, norm));
    for (const Tensor& t : {adam.params, adam.exp_avg, adam.exp_avg_sq, adam.grads, found, norm}) {
      digest.Add(t);
    }
  }
  return digest.value();
}

std::string ChildDigest(int threads) {
  // Resolved here: inside popen's shell, /proc/self/exe would be the shell.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command =
      "NF_NUM_THREADS=" + std::to_string(threads) + " '" + self + "' --print-digest";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::array<char, 128> buffer{};
  std::string out;
  while (fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  const int status = pclose(pipe);
  return status == 0 ? out : "child failed: " + out;
}

TEST(ThreadCountInvarianceTest, EveryOpGivesTheSameBitsForOneTwoAndThreeThreads) {
  const std::string one = ChildDigest(1);
  ASSERT_EQ(one.rfind("digest ", 0), 0u) << one;
  EXPECT_EQ(ChildDigest(2), one);
  EXPECT_EQ(ChildDigest(3), one);
}

}  // namespace
}  // namespace nf

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--print-digest") == 0) {
    std::printf("digest %016llx\n", static_cast<unsigned long long>(nf::RunAllOps()));
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
