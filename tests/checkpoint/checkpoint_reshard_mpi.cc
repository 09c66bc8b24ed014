// Checkpoints across layouts, under mpirun (nf_add_checkpoint_test): the job trains the tiny
// NormFormer on the layout NF_TEST_TP x NF_TEST_PP (data parallelism the rest; NF_TEST_ZERO and
// NF_TEST_VIRTUAL pick ZeRO-1 and interleaving), saves at step 3 and then
//   - resumes on the same layout: steps 4-6 equal the uninterrupted run bit for bit (losses
//     and every byte of this rank's parameters and optimizer state);
//   - loads the checkpoint into every other valid layout of the same world, ZeRO on and off,
//     and into a single process: steps 4-6 match the uninterrupted run within 1e-5 relative,
//     the layout-equivalence tolerance (docs/parallelism.md), since a reshard moves bytes
//     exactly and only the continued training reassociates sums.
// NF_TEST_MASKED_LM=1 makes the model a masked LM, whose output bias is a vocabulary table padded
// per layout like the embedding.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "gtest/gtest.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "parallel/process_groups.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using launcher::TrainConfig;
using launcher::Trainer;
using ::nf::testing::Bytes;
using ::nf::testing::EnvInt;
using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;

constexpr int kSaveStep = 3, kSteps = 6;

TrainConfig Config(int tp, int pp, int virtual_stages, bool zero) {
  TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(4);
  m.set_d_model(32);
  m.set_num_heads(4);
  m.set_ffn_dim(64);
  m.set_vocab_size(61);
  m.set_max_seq_len(16);
  m.set_dropout(0.1f);
  m.set_attention_dropout(0.1f);
  if (EnvInt("NF_TEST_MASKED_LM", 0) != 0) m.set_objective(model::ModelConfig::MASKED_LM);
  launcher::TrainOptions& t = *config.mutable_train();
  t.set_seq_len(16);
  t.set_micro_batch_size(2);
  t.set_global_batch_size(8);
  t.set_train_iters(kSteps);
  t.mutable_lr_schedule()->set_warmup_iters(2);
  t.mutable_optimizer()->set_clip_grad(0.5f);
  launcher::ParallelConfig& p = *config.mutable_parallel();
  p.set_tensor_parallel(tp);
  p.set_pipeline_parallel(pp);
  p.set_virtual_stages(virtual_stages);
  if (virtual_stages > 1)
    p.set_pipeline_schedule(launcher::ParallelConfig::INTERLEAVED_ONE_F_ONE_B);
  p.set_distributed_optimizer(zero);
  p.set_grad_bucket_elements(5000);
  return config;
}

void Load(Trainer& trainer, const fs::path& dir) {
  auto manifest = ReadManifest(dir);
  NF_ASSERT_OK(manifest);
  auto progress = LoadCheckpoint(dir, *manifest, trainer.CheckpointState());
  NF_ASSERT_OK(progress);
  NF_ASSERT_OK(trainer.Restore(*progress));
}

// A directory all ranks share: rank 0 makes it and broadcasts its name.
fs::path SharedTempDir(parallel::Communicator& world) {
  Tensor name = *Tensor::HostZeros(DType::kU8, {256});
  if (world.rank() == 0) {
    std::string templ = (fs::temp_directory_path() / "nf_ckpt_mpi_XXXXXX").string();
    EXPECT_NE(mkdtemp(templ.data()), nullptr);
    std::memcpy(name.raw_data(), templ.data(), templ.size());
  }
  NF_EXPECT_OK(world.Broadcast(name, 0));
  return fs::path(static_cast<const char*>(name.raw_data()));
}

std::unique_ptr<Trainer> MakeValidTrainer(const TrainConfig& config,
                                          parallel::ProcessGroups* groups) {
  NF_EXPECT_OK(launcher::ValidateTrainConfig(config));
  return MakeTrainer(config, groups);
}

struct Layout {
  int tp, pp;
  bool zero;
};

TEST(CheckpointReshardTest, ResumesBitExactlyAndLoadsIntoEveryLayout) {
  const int tp = EnvInt("NF_TEST_TP", 1), pp = EnvInt("NF_TEST_PP", 1);
  const int virtual_stages = EnvInt("NF_TEST_VIRTUAL", 1);
  const bool zero = EnvInt("NF_TEST_ZERO", 0) != 0;
  auto groups = parallel::CreateProcessGroups({.tp = tp, .pp = pp, .dp = 0});
  NF_ASSERT_OK(groups);
  parallel::Communicator& world = *groups->world;
  const fs::path dir = SharedTempDir(world);
  const TrainConfig config = Config(tp, pp, virtual_stages, zero);

  auto whole = MakeValidTrainer(config, &*groups);
  const std::vector<double> expected = TrainSteps(*whole, kSteps);

  {
    auto first = MakeValidTrainer(config, &*groups);
    TrainSteps(*first, kSaveStep);
    NF_ASSERT_OK(SaveCheckpoint(dir, first->CheckpointState(), first->Progress(), world));
  }
  const fs::path saved = dir / IterationDirName(kSaveStep);

  // Same layout: bit for bit.
  auto resumed = MakeValidTrainer(config, &*groups);
  Load(*resumed, saved);
  const std::vector<double> continued = TrainSteps(*resumed, kSteps - kSaveStep);
  for (int i = 0; i < kSteps - kSaveStep; ++i) {
    EXPECT_EQ(continued[i], expected[kSaveStep + i]) << "step " << kSaveStep + i + 1;
  }
  for (size_t c = 0; c < whole->chunks().size(); ++c) {
    EXPECT_EQ(Bytes(whole->chunks()[c]->params().params()),
              Bytes(resumed->chunks()[c]->params().params()));
    optim::MixedPrecisionAdamW& a = whole->optimizer(static_cast<int>(c)).adamw();
    optim::MixedPrecisionAdamW& b = resumed->optimizer(static_cast<int>(c)).adamw();
    EXPECT_EQ(Bytes(a.master()), Bytes(b.master()));
    EXPECT_EQ(Bytes(a.exp_avg()), Bytes(b.exp_avg()));
    EXPECT_EQ(Bytes(a.exp_avg_sq()), Bytes(b.exp_avg_sq()));
  }

  // Every other layout of this world, and one process.
  const int world_size = world.size();
  std::vector<Layout> targets;
  for (int t : {1, 2, 4}) {
    for (int p : {1, 2}) {
      if (world_size % (t * p) != 0) continue;
      const int dp = world_size / (t * p);
      if (8 % (dp * 2) != 0) continue;  // the global batch of 8 in micro-batches of 2
      targets.push_back({t, p, false});
      if (dp > 1) targets.push_back({t, p, true});
    }
  }
  for (const Layout& target : targets) {
    SCOPED_TRACE(
        absl::StrCat("into tp ", target.tp, " pp ", target.pp, target.zero ? " ZeRO-1" : ""));
    auto target_groups = parallel::CreateProcessGroups({.tp = target.tp, .pp = target.pp, .dp = 0});
    NF_ASSERT_OK(target_groups);
    auto trainer = MakeValidTrainer(Config(target.tp, target.pp, 1, target.zero), &*target_groups);
    Load(*trainer, saved);
    const std::vector<double> losses = TrainSteps(*trainer, kSteps - kSaveStep);
    for (int i = 0; i < kSteps - kSaveStep; ++i) {
      EXPECT_NEAR(losses[i], expected[kSaveStep + i], 1e-5 * expected[kSaveStep + i])
          << "step " << kSaveStep + i + 1;
    }
  }
  {
    SCOPED_TRACE("into one process");
    auto single = MakeValidTrainer(Config(1, 1, 1, false), nullptr);
    Load(*single, saved);
    const std::vector<double> losses = TrainSteps(*single, kSteps - kSaveStep);
    for (int i = 0; i < kSteps - kSaveStep; ++i) {
      EXPECT_NEAR(losses[i], expected[kSaveStep + i], 1e-5 * expected[kSaveStep + i])
          << "step " << kSaveStep + i + 1;
    }
  }
  NF_ASSERT_OK(world.Barrier());
  if (world.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace nf::checkpoint
