// nf-ckpt import's library side (checkpoint/fairseq_import.h): the checkpoint it writes holds the
// file's parameters and a fresh optimizer (master weights = parameters, zero moments, no update
// yet) on the layout asked for, and a trained model loads it; and every file it cannot take is
// refused with the tensor or field named, nothing left behind.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/fairseq_export.h"
#include "checkpoint/fairseq_import.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/safetensors_file.h"
#include "core/files/durable_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;
using ::testing::HasSubstr;

class FairseqImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TinyConfig(launcher::TrainOptions::FP32);
    auto trainer = MakeTrainer(config_);
    TrainSteps(*trainer, 3);
    NF_ASSERT_OK(Save(*trainer, dir_.path() / "checkpoints"));
    checkpoint_ = dir_.path() / "checkpoints" / "iter_0000003";
    NF_ASSERT_OK(ExportFairseqSafetensors(checkpoint_, *ReadManifest(checkpoint_), exported(),
                                          std::nullopt));
  }

  fs::path exported() const { return dir_.path() / "model.safetensors"; }
  fs::path out() const { return dir_.path() / "imported"; }

  // The exported file with `edit` applied, written as another file.
  fs::path Edited(const std::function<void(SafetensorsContents&)>& edit) {
    SafetensorsContents contents = *ReadSafetensors(exported());
    edit(contents);
    const fs::path path = dir_.path() / "edited.safetensors";
    fs::remove(path);  // the writer makes new files only
    EXPECT_TRUE(WriteSafetensors(path, contents.metadata, contents.tensors).ok());
    return path;
  }

  // Imports `file` expecting a refusal that mentions `mentions`, with nothing left on disk.
  void ExpectRefused(const fs::path& file, const std::string& mentions,
                     const ImportOptions& options = {}) {
    const absl::Status status = ImportFairseqSafetensors(file, options, out());
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr(mentions));
    EXPECT_FALSE(fs::exists(out()));
    for (const auto& entry : fs::directory_iterator(out().parent_path())) {
      EXPECT_FALSE(entry.path().filename().string().starts_with(out().filename().string()))
          << entry.path() << " is left";
    }
  }

  TrainConfig config_;
  TempDir dir_;
  fs::path checkpoint_;
};

ImportOptions OnLayout(int tp, int pp, int dp, bool zero1) {
  ImportOptions options;
  options.layout.tensor_parallel = tp;
  options.layout.pipeline_parallel = pp;
  options.layout.data_parallel = dp;
  options.layout.distributed_optimizer = zero1;
  return options;
}

ImportOptions WithModel(const model::ModelConfig& model) {
  ImportOptions options;
  options.model = model;
  return options;
}

NamedTensor& Named(SafetensorsContents& contents, const std::string& name) {
  for (NamedTensor& t : contents.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no " << name;
  return contents.tensors.front();
}

TEST_F(FairseqImportTest, WritesTheParametersAndAFreshOptimizerForTheLayout) {
  NF_ASSERT_OK(ImportFairseqSafetensors(exported(), OnLayout(2, 2, 1, false), out()));
  const Manifest manifest = *ReadManifest(out());
  EXPECT_EQ(manifest.step(), 3);  // the exported checkpoint's
  EXPECT_EQ(manifest.consumed_samples(), 0);
  EXPECT_EQ(manifest.optimizer_updates(), 0);
  EXPECT_EQ(manifest.layout().tensor_parallel(), 2);
  EXPECT_EQ(manifest.layout().pipeline_parallel(), 2);
  EXPECT_EQ(manifest.files_size(), 4);
  const SafetensorsContents file = *ReadSafetensors(exported());
  std::map<std::pair<std::string, int>, std::vector<float>> values;
  for (const TensorRecord& r : manifest.tensors()) {
    const AssembledTensor a = *AssembleTensor(out(), manifest, r);
    values[{r.name(), r.kind()}] = *ToFloatVector(a.global);
  }
  int checked = 0;
  for (const NamedTensor& t : file.tensors) {
    if (t.name == kFairseqVersionTensor) continue;
    const std::vector<float> want = *ToFloatVector(t.data);
    std::vector<float> param = values.at({t.name, TensorRecord::PARAM});
    param.resize(want.size());  // a vocabulary table's padding rows follow
    EXPECT_EQ(param, want) << t.name;
    std::vector<float> master = values.at({t.name, TensorRecord::MASTER});
    master.resize(want.size());
    EXPECT_EQ(master, want) << t.name;
    for (const auto kind : {TensorRecord::EXP_AVG, TensorRecord::EXP_AVG_SQ}) {
      const std::vector<float>& moment = values.at({t.name, kind});
      EXPECT_EQ(moment, std::vector<float>(moment.size(), 0.0f)) << t.name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, manifest.tensors_size() / 4);
}

TEST_F(FairseqImportTest, ARunLoadsTheImportAndTrainsOn) {
  NF_ASSERT_OK(ImportFairseqSafetensors(exported(), OnLayout(1, 1, 1, false), out()));
  auto trainer = MakeTrainer(config_);
  NF_ASSERT_OK(Load(*trainer, out()));
  const std::vector<double> losses = TrainSteps(*trainer, 2);
  for (double loss : losses) EXPECT_TRUE(std::isfinite(loss));
}

TEST_F(FairseqImportTest, ExportThenImportThenExportGivesTheSameBytes) {
  NF_ASSERT_OK(ImportFairseqSafetensors(exported(), OnLayout(2, 1, 2, true), out()));
  const fs::path again = dir_.path() / "again.safetensors";
  NF_ASSERT_OK(ExportFairseqSafetensors(out(), *ReadManifest(out()), again, std::nullopt));
  EXPECT_EQ(*ReadWholeFile(again), *ReadWholeFile(exported()));
}

TEST_F(FairseqImportTest, RefusesAFileWithoutDecoderVersionOrAnOldOne) {
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  std::erase_if(c.tensors, [](const NamedTensor& t) {
                    return t.name == kFairseqVersionTensor;
                  });
                }),
                "has no decoder.version: fairseq would load it as a decoder from before 2019 and "
                "drop its final LayerNorm");
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  Named(c, kFairseqVersionTensor).data.data<float>()[0] = 2.0f;
                }),
                "decoder.version is 2, not > 2");
}

TEST_F(FairseqImportTest, RefusesMissingExtraMisshapenAndNonFiniteTensors) {
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  std::erase_if(c.tensors, [](const NamedTensor& t) {
                    return t.name == "decoder.layers.1.fc2.bias";
                  });
                }),
                "has no decoder.layers.1.fc2.bias, which the model has");
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  NamedTensor extra = Named(c, "decoder.layers.1.fc2.bias");
                  extra.name = "decoder.layers.2.fc2.bias";
                  c.tensors.push_back(extra);
                }),
                "holds decoder.layers.2.fc2.bias, which the model has not");
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  NamedTensor& bias = Named(c, "decoder.layers.0.fc1.bias");
                  bias.shape = {4, 8};
                }),
                "decoder.layers.0.fc1.bias is [4, 8], the model's is [32]");
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  Named(c, "decoder.layer_norm.bias").data.data<float>()[3] =
                      std::numeric_limits<float>::quiet_NaN();
                }),
                "decoder.layer_norm.bias holds 1 non-finite values (the first at element 3)");
}

TEST_F(FairseqImportTest, RefusesHeadScalesThatFairseqWouldApplyAfterOutProj) {
  ExpectRefused(Edited([](SafetensorsContents& c) {
                  Named(c, "decoder.layers.1.c_attn").data.data<float>()[1] = 0.5f;
                }),
                "decoder.layers.1.c_attn holds 0.5, not 1: fairseq applies c_attn after out_proj, "
                "so this file is a model with model.normformer.head_scale_placement "
                "AFTER_OUT_PROJ");
}

TEST_F(FairseqImportTest, ATiedModelTakesFairseqsSecondNameForTheEmbeddingOnlyWhenEqual) {
  const auto with_head = [](float delta) {
    return [delta](SafetensorsContents& c) {
      NamedTensor head = Named(c, "decoder.embed_tokens.weight");
      head.name = "decoder.output_projection.weight";
      Tensor copy = *Tensor::HostEmpty(head.data.dtype(), head.data.shape());
      std::memcpy(copy.raw_data(), head.data.raw_data(), head.data.nbytes());
      copy.data<float>()[0] += delta;
      head.data = copy;
      c.tensors.push_back(head);
    };
  };
  NF_EXPECT_OK(ImportFairseqSafetensors(Edited(with_head(0.0f)), {}, out()));
  fs::remove_all(out());
  ExpectRefused(Edited(with_head(1.0f)),
                "decoder.output_projection.weight differs from decoder.embed_tokens.weight, but "
                "the model ties them (model.tie_embeddings)");
}

TEST_F(FairseqImportTest, TheModelConfigComesFromTheMetadataOrIsGivenNeverBoth) {
  ExpectRefused(exported(),
                "records its model config (normformer.model_config); a config is for "
                "files without one",
                WithModel(config_.model()));
  const fs::path bare = Edited([](SafetensorsContents& c) { c.metadata.clear(); });
  ExpectRefused(bare,
                "records no model config (normformer.model_config metadata): give the "
                "model with --config");
  model::ModelConfig wider = config_.model();
  wider.set_ffn_dim(64);
  ExpectRefused(bare, "decoder.layers.0.fc1.weight is [32, 16], the model's is [64, 16]",
                WithModel(wider));
  model::ModelConfig relu_squared = config_.model();
  relu_squared.set_activation(model::ModelConfig::RELU_SQUARED);
  ExpectRefused(bare,
                "is a fairseq transformer_lm, and fairseq's transformer_lm cannot "
                "represent this model: model.activation is RELU_SQUARED",
                WithModel(relu_squared));
  NF_EXPECT_OK(ImportFairseqSafetensors(bare, WithModel(config_.model()), out()));
  EXPECT_EQ(ReadManifest(out())->step(), 0);  // no step recorded either
}

TEST_F(FairseqImportTest, RefusesAnExistingDirectory) {
  fs::create_directories(out());
  const absl::Status status = ImportFairseqSafetensors(exported(), {}, out());
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("exists: import writes a new directory"));
}

}  // namespace
}  // namespace nf::checkpoint
