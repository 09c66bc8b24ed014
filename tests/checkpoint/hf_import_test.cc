// nf-ckpt import of a Hugging Face directory (checkpoint/hf_import.h): the checkpoint holds the
// directory's tensors bit for bit (GPT-2's Conv1D weights transposed back, its c_attn cut into q,
// k and v) on the layout asked for, from one file or shards, and a run trains on from it; and
// every hostile directory, made here, is refused in one line naming the file and the tensor or
// key, with nothing left behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/manifest_model.h"
#include "checkpoint/safetensors_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using model::ModelConfig;
using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;
using ::testing::HasSubstr;

// What the HF export writes of a NormFormer: every tensor kind there is (learned positions, an
// untied head, all four NormFormer operations).
ModelConfig NormFormerModel() {
  ModelConfig model = TinyConfig(launcher::TrainOptions::FP32).model();
  model.set_positions(ModelConfig::LEARNED);
  model.set_tie_embeddings(false);
  model.mutable_normformer()->set_scale_resids(true);
  model.mutable_normformer()->set_head_scale_placement(model::NormFormerConfig::AFTER_OUT_PROJ);
  RecordModelFieldsExplicitly(model);
  return model;
}

// What transformers' GPT2LMHeadModel computes.
ModelConfig Gpt2Model() {
  ModelConfig model = TinyConfig(launcher::TrainOptions::FP32).model();
  model.set_positions(ModelConfig::LEARNED);
  model.set_first_position(0);
  model.set_activation(ModelConfig::GELU_TANH);
  model.set_scale_embedding(false);
  model.set_attention_dropout(0.1f);
  model::NormFormerConfig& nf = *model.mutable_normformer();
  nf.set_scale_attn(false);
  nf.set_scale_heads(false);
  nf.set_scale_fc(false);
  nf.set_scale_resids(false);
  RecordModelFieldsExplicitly(model);
  return model;
}

// A directory's contents before they are written.
struct HfFiles {
  std::string config_json;
  SafetensorsMetadata metadata{{"format", "pt"}};
  std::vector<NamedTensor> tensors;  // HfTensors' order, random values
};

HfFiles MakeFiles(const ModelConfig& model, HfModelType type) {
  HfFiles files;
  files.config_json = HfConfigJson(model, type, DType::kF32, std::nullopt);
  std::mt19937 random(47);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (const HfTensor& t : HfTensors(model, type)) {
    Tensor data = *Tensor::HostEmpty(DType::kF32, {NumElements(t.shape)});
    for (int64_t i = 0; i < data.numel(); ++i) data.data<float>()[i] = normal(random);
    files.tensors.push_back({.name = t.name, .shape = t.shape, .data = data});
  }
  return files;
}

NamedTensor& Named(HfFiles& files, const std::string& name) {
  for (NamedTensor& t : files.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no " << name;
  return files.tensors.front();
}

std::string ShardName(int shard, int shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, shards);
}

void WriteText(const fs::path& file, const std::string& text) {
  fs::remove(file);
  std::ofstream(file) << text;
}

void WriteIndex(const fs::path& dir, const std::map<std::string, std::string>& weight_map,
                int64_t total_size) {
  std::vector<std::string> entries;
  for (const auto& [tensor, shard] : weight_map) {
    entries.push_back(absl::StrCat("\"", tensor, "\": \"", shard, "\""));
  }
  WriteText(dir / "model.safetensors.index.json",
            absl::StrCat("{\"metadata\": {\"total_size\": ", total_size, "}, \"weight_map\": {",
                         absl::StrJoin(entries, ", "), "}}"));
}

int64_t TotalBytes(const HfFiles& files) {
  int64_t bytes = 0;
  for (const NamedTensor& t : files.tensors) bytes += t.data.nbytes();
  return bytes;
}

// Writes `dir` anew: config.json and the tensors as model.safetensors, or (shards > 1) tensor i
// into shard i % shards with an index; returns the index's weight_map.
std::map<std::string, std::string> WriteDir(const fs::path& dir, const HfFiles& files,
                                            int shards = 1) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  WriteText(dir / "config.json", files.config_json);
  if (shards == 1) {
    EXPECT_TRUE(WriteSafetensors(dir / "model.safetensors", files.metadata, files.tensors).ok());
    return {};
  }
  std::vector<std::vector<NamedTensor>> parts(shards);
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < files.tensors.size(); ++i) {
    parts[i % shards].push_back(files.tensors[i]);
    weight_map[files.tensors[i].name] = ShardName(static_cast<int>(i % shards), shards);
  }
  for (int s = 0; s < shards; ++s) {
    EXPECT_TRUE(WriteSafetensors(dir / ShardName(s, shards), files.metadata, parts[s]).ok());
  }
  WriteIndex(dir, weight_map, TotalBytes(files));
  return weight_map;
}

HfImportOptions OnLayout(int tp, int pp) {
  HfImportOptions options;
  options.layout.tensor_parallel = tp;
  options.layout.pipeline_parallel = pp;
  return options;
}

// Every parameter of a checkpoint as floats, the vocabulary tables without their padding rows
// (as many as the layout's vocabulary padding adds).
std::map<std::string, std::vector<float>> Params(const fs::path& dir) {
  const Manifest manifest = *ReadManifest(dir);
  const ModelConfig& model = manifest.model();
  std::map<std::string, std::vector<float>> params;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() != TensorRecord::PARAM) continue;
    std::vector<float> values = *ToFloatVector(AssembleTensor(dir, manifest, r)->global);
    if (r.name() == "decoder.embed_tokens.weight" ||
        r.name() == "decoder.output_projection.weight") {
      values.resize(int64_t{model.vocab_size()} * model.d_model());
    }
    params[r.name()] = values;
  }
  return params;
}

std::vector<float> Floats(const NamedTensor& t) { return *ToFloatVector(t.data); }

class HfImportTest : public ::testing::Test {
 protected:
  fs::path hf() const { return dir_.path() / "hf"; }
  fs::path out() const { return dir_.path() / "imported"; }

  // Imports `dir` expecting a one-line refusal that mentions each of `mentions`, with nothing
  // left where the checkpoint would be.
  void ExpectRefused(const fs::path& dir, const std::vector<std::string>& mentions) {
    const absl::Status status = ImportHfDirectory(dir, {}, out());
    ASSERT_FALSE(status.ok());
    const std::string message(status.message());
    for (const std::string& m : mentions) EXPECT_THAT(message, HasSubstr(m));
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(out()));
    for (const auto& entry : fs::directory_iterator(out().parent_path())) {
      EXPECT_FALSE(entry.path().filename().string().starts_with(out().filename().string()))
          << entry.path() << " is left";
    }
  }

  TempDir dir_;
};

TEST_F(HfImportTest, ANormFormerDirectoryComesOutBitForBitWithItsRecordedConfigAndStep) {
  ModelConfig model = NormFormerModel();
  model.set_dropout(0.25f);
  HfFiles files = MakeFiles(model, HfModelType::kNormFormer);
  files.metadata = {{"format", "pt"},
                    {"producer", "normformer"},
                    {"step", "7"},
                    {kModelConfigMetadata, ModelConfigText(model)}};
  WriteDir(hf(), files);
  NF_ASSERT_OK(ImportHfDirectory(hf(), OnLayout(2, 2), out()));
  const Manifest manifest = *ReadManifest(out());
  EXPECT_EQ(manifest.step(), 7);
  EXPECT_EQ(manifest.optimizer_updates(), 0);
  EXPECT_EQ(manifest.files_size(), 4);
  EXPECT_TRUE(MessageDifferencer::Equals(manifest.model(), model))
      << manifest.model().DebugString();
  const auto params = Params(out());
  EXPECT_EQ(params.size(), files.tensors.size());
  for (const NamedTensor& t : files.tensors) {
    std::string name = absl::StrReplaceAll(t.name, {{"model.", "decoder."}});
    if (name == "lm_head.weight") name = "decoder.output_projection.weight";
    EXPECT_EQ(params.at(name), Floats(t)) << t.name;
  }
}

TEST_F(HfImportTest, AGpt2DirectoryGivesTheSameParametersFromOneFileAsFromShards) {
  const ModelConfig model = Gpt2Model();
  HfFiles files = MakeFiles(model, HfModelType::kGpt2);
  WriteDir(hf(), files);
  WriteDir(dir_.path() / "sharded", files, 3);
  NF_ASSERT_OK(ImportHfDirectory(hf(), OnLayout(2, 1), out()));
  NF_ASSERT_OK(ImportHfDirectory(dir_.path() / "sharded", OnLayout(1, 2), dir_.path() / "again"));
  const Manifest manifest = *ReadManifest(out());
  EXPECT_EQ(manifest.step(), 0);
  EXPECT_TRUE(MessageDifferencer::Equals(manifest.model(), model))
      << manifest.model().DebugString();
  const auto params = Params(out());
  EXPECT_EQ(params, Params(dir_.path() / "again"));
  // GPT-2's Conv1D weights are [in, out]: c_attn [d, 3d] holds q, k and v side by side.
  const int64_t d = model.d_model(), ffn = model.ffn_dim();
  const std::vector<float> c_attn = Floats(Named(files, "transformer.h.1.attn.c_attn.weight"));
  const char* parts[] = {"q_proj", "k_proj", "v_proj"};
  for (int part = 0; part < 3; ++part) {
    const std::vector<float>& w =
        params.at(absl::StrCat("decoder.layers.1.self_attn.", parts[part], ".weight"));
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(w[r * d + c], c_attn[c * 3 * d + part * d + r]) << parts[part] << r << c;
      }
    }
  }
  const std::vector<float> c_attn_bias = Floats(Named(files, "transformer.h.1.attn.c_attn.bias"));
  EXPECT_EQ(params.at("decoder.layers.1.self_attn.v_proj.bias"),
            std::vector<float>(c_attn_bias.begin() + 2 * d, c_attn_bias.end()));
  const std::vector<float> c_fc = Floats(Named(files, "transformer.h.0.mlp.c_fc.weight"));
  const std::vector<float>& fc1 = params.at("decoder.layers.0.fc1.weight");  // [ffn, d]
  for (int64_t r = 0; r < ffn; ++r) {
    for (int64_t c = 0; c < d; ++c) ASSERT_EQ(fc1[r * d + c], c_fc[c * ffn + r]) << r << c;
  }
  EXPECT_EQ(params.at("decoder.embed_positions.weight"),
            Floats(Named(files, "transformer.wpe.weight")));
  EXPECT_EQ(params.at("decoder.embed_tokens.weight"),
            Floats(Named(files, "transformer.wte.weight")));
}

TEST_F(HfImportTest, ARunLoadsAGpt2ImportAndTrainsOn) {
  TrainConfig config = TinyConfig(launcher::TrainOptions::FP32);
  *config.mutable_model() = Gpt2Model();
  WriteDir(hf(), MakeFiles(config.model(), HfModelType::kGpt2));
  HfImportOptions options;
  options.step = 5;
  NF_ASSERT_OK(ImportHfDirectory(hf(), options, out()));
  EXPECT_EQ(ReadManifest(out())->step(), 5);
  auto trainer = MakeTrainer(config);
  NF_ASSERT_OK(Load(*trainer, out()));
  for (double loss : TrainSteps(*trainer, 2)) EXPECT_TRUE(std::isfinite(loss));
}

TEST_F(HfImportTest, TheRecordedModelConfigMustAgreeWithConfigJson) {
  ModelConfig recorded = Gpt2Model();
  recorded.set_dropout(0.3f);
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  files.metadata = {{kModelConfigMetadata, ModelConfigText(recorded)}};
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "config.json").string(), "normformer.model_config metadata",
                       "disagree: model.dropout is 0.1 by config.json, 0.3 by the metadata"});
  // A model numbered from position 2 (fairseq's) is exported as GPT-2 without the table's two
  // unused rows: it comes back numbered from 0, with the rest as recorded.
  recorded.set_dropout(0.1f);
  recorded.set_first_position(2);
  files.metadata = {{kModelConfigMetadata, ModelConfigText(recorded)}};
  WriteDir(hf(), files);
  NF_ASSERT_OK(ImportHfDirectory(hf(), {}, out()));
  EXPECT_TRUE(MessageDifferencer::Equals(ReadManifest(out())->model(), Gpt2Model()));
}

TEST_F(HfImportTest, RefusesAConfigThatDisagreesWithTheTensors) {
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  ModelConfig wider = Gpt2Model();
  wider.set_vocab_size(50);
  files.config_json = HfConfigJson(wider, HfModelType::kGpt2, DType::kF32, std::nullopt);
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "model.safetensors").string(), "transformer.wte.weight",
                       "as [40, 16], not [50, 16] (config.json's vocab_size 50)"});
  ModelConfig deeper = Gpt2Model();
  deeper.set_num_layers(3);
  files.config_json = HfConfigJson(deeper, HfModelType::kGpt2, DType::kF32, std::nullopt);
  WriteDir(hf(), files);
  ExpectRefused(hf(), {"has no transformer.h.2.ln_1.weight (config.json's n_layer 3)"});
  files.config_json =
      absl::StrReplaceAll(HfConfigJson(Gpt2Model(), HfModelType::kGpt2, DType::kF32, std::nullopt),
                          {{"\"float32\"", "\"bfloat16\""}});
  WriteDir(hf(), files);
  ExpectRefused(hf(), {"holds transformer.wte.weight as f32, not bf16 (config.json's dtype)"});
}

TEST_F(HfImportTest, RefusesUnknownModelTypesAndGpt2WithRemoteCode) {
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  const std::string config = files.config_json;
  files.config_json = absl::StrReplaceAll(config, {{"\"gpt2\"", "\"llama\""}});
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "config.json").string(), "model_type", "llama"});
  files.config_json = absl::StrReplaceAll(
      config, {{"{\n", "{\n  \"auto_map\": {\"AutoModelForCausalLM\": \"modeling_x.X\"},\n"}});
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "config.json").string(), "\"auto_map\" names code"});
}

TEST_F(HfImportTest, RefusesExtraTensorsAndAnUntiedCopyOfTheEmbedding) {
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  NamedTensor extra = Named(files, "transformer.h.1.ln_1.weight");
  extra.name = "transformer.h.2.ln_1.weight";
  files.tensors.push_back(extra);
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "model.safetensors").string(),
                       "holds transformer.h.2.ln_1.weight, which the model has not "
                       "(config.json's n_layer 2)"});
  // transformers may write a tied head: the embedding's bytes under lm_head.weight.
  files.tensors.pop_back();
  NamedTensor head = Named(files, "transformer.wte.weight");
  head.name = "lm_head.weight";
  head.data = *Tensor::HostEmpty(DType::kF32, {head.data.numel()});
  std::memcpy(head.data.raw_data(), Named(files, "transformer.wte.weight").data.raw_data(),
              head.data.nbytes());
  files.tensors.push_back(head);
  WriteDir(hf(), files);
  NF_EXPECT_OK(ImportHfDirectory(hf(), {}, out()));
  fs::remove_all(out());
  files.tensors.back().data.data<float>()[5] += 1.0f;
  WriteDir(hf(), files);
  ExpectRefused(hf(), {"holds lm_head.weight, which differs from transformer.wte.weight"});
}

TEST_F(HfImportTest, RefusesANonFiniteValueNamingTheTensor) {
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  Named(files, "transformer.h.1.mlp.c_fc.weight").data.data<float>()[7] =
      std::numeric_limits<float>::infinity();
  WriteDir(hf(), files);
  ExpectRefused(hf(), {(hf() / "model.safetensors").string(),
                       "transformer.h.1.mlp.c_fc.weight (as decoder.layers.1.fc1.weight) holds 1 "
                       "non-finite values"});
}

TEST_F(HfImportTest, RefusesAMissingTruncatedOrMisindexedShard) {
  const HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  const fs::path second = hf() / ShardName(1, 2);
  std::map<std::string, std::string> weight_map = WriteDir(hf(), files, 2);
  fs::remove(second);
  ExpectRefused(hf(), {second.string(), "is missing", "model.safetensors.index.json maps"});
  WriteDir(hf(), files, 2);
  fs::resize_file(second, fs::file_size(second) - 12);
  ExpectRefused(hf(), {second.string()});
  WriteDir(hf(), files, 2);
  weight_map["transformer.wte.weight"] = ShardName(1, 2);  // it is in the first
  WriteIndex(hf(), weight_map, TotalBytes(files));
  ExpectRefused(hf(), {(hf() / ShardName(0, 2)).string(), "holds transformer.wte.weight",
                       "maps to model-00002-of-00002.safetensors"});
  weight_map = WriteDir(hf(), files, 2);
  weight_map.erase("transformer.ln_f.bias");
  WriteIndex(hf(), weight_map, TotalBytes(files));
  ExpectRefused(hf(), {"holds transformer.ln_f.bias, which", "does not list"});
  weight_map = WriteDir(hf(), files, 2);
  WriteIndex(hf(), weight_map, TotalBytes(files) + 4);
  ExpectRefused(hf(), {"model.safetensors.index.json: metadata.total_size is"});
  EXPECT_TRUE(WriteSafetensors(hf() / "model.safetensors", files.metadata, files.tensors).ok());
  ExpectRefused(hf(), {"holds both model.safetensors and model.safetensors.index.json"});
}

TEST_F(HfImportTest, RefusesShardsOfDifferentExports) {
  HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  files.metadata = {{"step", "3"}};
  WriteDir(hf(), files, 2);
  SafetensorsContents second = *ReadSafetensors(hf() / ShardName(1, 2));
  fs::remove(hf() / ShardName(1, 2));
  EXPECT_TRUE(WriteSafetensors(hf() / ShardName(1, 2), {{"step", "4"}}, second.tensors).ok());
  ExpectRefused(hf(), {"records \"4\" as step metadata", "the shards come from different exports"});
}

TEST_F(HfImportTest, RefusesAnIndexNamingAFileOutsideTheDirectory) {
  const HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  std::map<std::string, std::string> weight_map = WriteDir(hf(), files, 2);
  // The file outside is a good shard: only the name stops it.
  const fs::path outside = dir_.path() / "outside.safetensors";
  fs::copy_file(hf() / ShardName(1, 2), outside);
  for (auto& [tensor, shard] : weight_map) {
    if (shard == ShardName(1, 2)) shard = "../outside.safetensors";
  }
  WriteIndex(hf(), weight_map, TotalBytes(files));
  ExpectRefused(hf(), {"\"../outside.safetensors\", a path leading out"});
  for (auto& [tensor, shard] : weight_map) {
    if (shard == "../outside.safetensors") shard = outside.string();
  }
  WriteIndex(hf(), weight_map, TotalBytes(files));
  ExpectRefused(hf(), {outside.string(), "an absolute path"});
  // A link with a plain name that leads out.
  weight_map = WriteDir(hf(), files, 2);
  fs::remove(hf() / ShardName(1, 2));
  fs::create_symlink(outside, hf() / ShardName(1, 2));
  ExpectRefused(hf(), {(hf() / ShardName(1, 2)).string(), "is a symbolic link to",
                       "outside " + hf().string()});
}

TEST_F(HfImportTest, FollowsASymbolicLinkThatStaysInside) {
  const HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  WriteDir(hf(), files);
  // As the Hugging Face hub's cache does, with its blobs inside the directory here.
  fs::create_directories(hf() / "blobs");
  fs::rename(hf() / "model.safetensors", hf() / "blobs" / "0123abcd");
  fs::create_symlink("blobs/0123abcd", hf() / "model.safetensors");
  NF_EXPECT_OK(ImportHfDirectory(hf(), {}, out()));
}

// The hub's cache: REPO/snapshots/REV/NAME links to REPO/blobs/HASH, outside the revision's
// directory; that layout is followed, and only that one (a sibling of blobs is not).
TEST_F(HfImportTest, ReadsARevisionOfTheHubCache) {
  const HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  const fs::path repo = dir_.path() / "models--someone--gpt2";
  const fs::path revision = repo / "snapshots" / "0a1b2c";
  WriteDir(revision, files);
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "refs");
  for (const char* name : {"model.safetensors", "config.json"}) {
    const std::string blob = std::string("blob-") + name;
    fs::rename(revision / name, repo / "blobs" / blob);
    fs::create_symlink(fs::path("../../blobs") / blob, revision / name);
  }
  NF_EXPECT_OK(ImportHfDirectory(revision, {}, out()));
  fs::remove_all(out());
  fs::rename(repo / "blobs" / "blob-model.safetensors", repo / "refs" / "weights");
  fs::remove(revision / "model.safetensors");
  fs::create_symlink("../../refs/weights", revision / "model.safetensors");
  ExpectRefused(revision, {"is a symbolic link to", "outside " + revision.string()});
}

// Imports `dir` with each of `fifos` made a FIFO there. An import that opened one to read would
// block in open() until a writer came, so while the import runs the test looks for a reader: a
// non-blocking open for writing succeeds exactly when a reader has the FIFO open (else ENXIO).
// Finding one fails the test and lets the import go on; the import's end ends the watch.
absl::Status ImportWithFifos(const fs::path& dir, const std::vector<std::string>& fifos,
                             const fs::path& out) {
  for (const std::string& name : fifos) EXPECT_EQ(mkfifo((dir / name).c_str(), 0600), 0) << name;
  auto imported = std::async(std::launch::async, [&] { return ImportHfDirectory(dir, {}, out); });
  while (imported.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    for (const std::string& name : fifos) {
      const int writer = open((dir / name).c_str(), O_WRONLY | O_NONBLOCK);
      if (writer < 0) continue;
      ADD_FAILURE() << "import opened " << name;
      close(writer);  // the reader sees end of file and goes on
    }
  }
  return imported.get();
}

TEST_F(HfImportTest, NeverOpensAPickle) {
  const HfFiles files = MakeFiles(Gpt2Model(), HfModelType::kGpt2);
  fs::create_directories(hf());
  WriteText(hf() / "config.json", files.config_json);
  EXPECT_THAT(std::string(ImportWithFifos(hf(), {"pytorch_model.bin"}, out()).message()),
              HasSubstr("holds pytorch_model.bin, a pickle, and no "
                        "model.safetensors: pickles are never loaded"));
  ExpectRefused(hf(), {"pytorch_model.bin"});
}

TEST_F(HfImportTest, NeverOpensTheModelsPythonFilesOrAPickleBesideTheSafetensors) {
  WriteDir(hf(), MakeFiles(NormFormerModel(), HfModelType::kNormFormer));
  NF_EXPECT_OK(ImportWithFifos(
      hf(), {"modeling_normformer.py", "configuration_normformer.py", "training_args.bin"}, out()));
}

TEST_F(HfImportTest, RefusesAnOutputThatExistsOrLiesInTheDirectory) {
  WriteDir(hf(), MakeFiles(Gpt2Model(), HfModelType::kGpt2));
  EXPECT_THAT(std::string(ImportHfDirectory(hf(), {}, hf() / "ckpt").message()),
              HasSubstr("is inside HF_DIR"));
  fs::create_directories(out());
  EXPECT_EQ(ImportHfDirectory(hf(), {}, out()).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace nf::checkpoint
