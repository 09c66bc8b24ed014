// Every run configuration shipped in deploy/configs loads and validates, on its own and as the
// Pre-LN baseline that deploy/configs/README.md derives from it, and the paper-size ones keep
// the settings their comments cite.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "launcher/config.h"
#include "model/aligned_layout.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

std::vector<std::string> ConfigPaths() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(NF_SOURCE_DIR) / "deploy/configs")) {
    if (entry.path().extension() == ".pbtxt") paths.push_back(entry.path().string());
  }
  return paths;
}

TrainConfig Load(const std::string& name, const std::vector<std::string>& overrides = {}) {
  const std::string path = absl::StrCat(NF_SOURCE_DIR, "/deploy/configs/", name);
  absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, overrides);
  NF_EXPECT_OK(config);
  return config.ok() ? *std::move(config) : TrainConfig();
}

TEST(DeployConfigsTest, EveryConfigLoadsValidatesAndResolves) {
  const std::vector<std::string> paths = ConfigPaths();
  EXPECT_GE(paths.size(), 5u);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    const absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, {});
    NF_ASSERT_OK(config);
    TrainConfig resolved;
    ASSERT_TRUE(
        google::protobuf::TextFormat::ParseFromString(ResolvedConfigText(*config), &resolved));
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equivalent(*config, resolved));
  }
}

TEST(DeployConfigsTest, EveryConfigHasAPreLnBaseline) {
  const std::vector<std::string> baseline = {
      "model.normformer.scale_attn=false", "model.normformer.scale_heads=false",
      "model.normformer.scale_fc=false", "model.normformer.scale_resids=false"};
  for (const std::string& path : ConfigPaths()) {
    SCOPED_TRACE(path);
    const absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, baseline);
    NF_ASSERT_OK(config);
    const nf::model::NormFormerConfig& normformer = config->model().normformer();
    EXPECT_FALSE(normformer.scale_attn() || normformer.scale_heads() || normformer.scale_fc() ||
                 normformer.scale_resids());
  }
}

TEST(DeployConfigsTest, TinyIsTheCpuDemo) {
  const TrainConfig tiny = Load("tiny.pbtxt");
  EXPECT_EQ(tiny.model().d_model(), 128);
  EXPECT_EQ(tiny.model().num_heads(), 4);
  EXPECT_EQ(tiny.model().ffn_dim(), 512);
  EXPECT_EQ(tiny.model().vocab_size(), 512);
  EXPECT_EQ(tiny.train().seq_len(), 64);
  EXPECT_EQ(tiny.train().micro_batch_size(), 4);
  EXPECT_EQ(tiny.train().global_batch_size(), 16);
  EXPECT_EQ(tiny.train().precision(), TrainOptions::FP32);
  EXPECT_FLOAT_EQ(tiny.train().optimizer().lr(), 3e-3f);
  EXPECT_EQ(tiny.train().lr_schedule().warmup_iters(), 30);
}

TEST(DeployConfigsTest, PaperSizesHaveThePapersShapesAndSettings) {
  const struct {
    const char* name;
    int layers, d_model, heads, ffn;
    float lr;
  } kSizes[] = {
      {"normformer-125m.pbtxt", 12, 768, 12, 3072, 3e-3f},
      {"normformer-355m.pbtxt", 24, 1024, 16, 4096, 1e-3f},
      {"normformer-1.3b.pbtxt", 24, 2048, 32, 8192, 6e-4f},
      {"normformer-2.7b.pbtxt", 32, 2560, 32, 10240, 6e-4f},
  };
  for (const auto& size : kSizes) {
    SCOPED_TRACE(size.name);
    const TrainConfig config = Load(size.name);
    EXPECT_EQ(config.model().num_layers(), size.layers);
    EXPECT_EQ(config.model().d_model(), size.d_model);
    EXPECT_EQ(config.model().num_heads(), size.heads);
    EXPECT_EQ(config.model().ffn_dim(), size.ffn);
    EXPECT_EQ(config.model().vocab_size(), 50257);
    EXPECT_EQ(config.train().seq_len(), 2048);
    EXPECT_EQ(config.train().precision(), TrainOptions::FP16);
    EXPECT_FLOAT_EQ(config.train().optimizer().lr(), size.lr);
    EXPECT_FLOAT_EQ(config.train().optimizer().beta1(), 0.9f);
    EXPECT_FLOAT_EQ(config.train().optimizer().beta2(), 0.98f);
    EXPECT_FLOAT_EQ(config.train().optimizer().eps(), 1e-8f);
    EXPECT_FLOAT_EQ(config.train().optimizer().weight_decay(), 0.01f);
    EXPECT_EQ(config.train().lr_schedule().decay(), LrScheduleConfig::LINEAR);
    EXPECT_EQ(config.train().lr_schedule().warmup_iters(), 750);
    // 0.5M tokens per update below 1.3B, 1M from it on (fairseq's NormFormer README).
    EXPECT_EQ(int64_t{config.train().global_batch_size()} * config.train().seq_len(),
              size.layers == 12 || size.d_model == 1024 ? 1 << 19 : 1 << 20);
    const nf::model::NormFormerConfig& normformer = config.model().normformer();
    EXPECT_TRUE(normformer.scale_attn() && normformer.scale_heads() && normformer.scale_fc());
  }
}

// Every shipped model keeps each parameter 256-byte aligned in its own layout and at every
// tensor-parallel degree its heads allow up to 8 (model/param_table.h, kParamAlignment): the
// 2.7B at tp 8 has 4 heads per rank, whose scales used to leave everything after them 8-byte
// aligned.
TEST(DeployConfigsTest, EveryParameterStartsAlignedInEveryLayout) {
  for (const std::string& path : ConfigPaths()) {
    SCOPED_TRACE(path);
    const absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, {});
    NF_ASSERT_OK(config);
    const ParallelConfig& parallel = config->parallel();
    const int v = std::max(1, parallel.virtual_stages());
    testing::ExpectAlignedLayout(
        config->model(), parallel.tensor_parallel(), parallel.pipeline_parallel(), v,
        std::max(1, parallel.data_parallel()), parallel.grad_bucket_elements());
    for (const int tp : {1, 2, 4, 8}) {
      if (config->model().num_heads() % tp != 0) continue;
      testing::ExpectAlignedLayout(config->model(), tp, 1, 1, 8, parallel.grad_bucket_elements());
    }
  }
}

}  // namespace
}  // namespace nf::launcher
