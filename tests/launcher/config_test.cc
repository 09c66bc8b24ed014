// Tests of launcher/config.h: loading with file:line:col parse errors, --set overrides of every
// scalar kind (and their one-line errors), each validation rule, the fully resolved text, and
// the padded vocabulary of model/vocab.h.
#include "launcher/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/wrappers.pb.h"
#include "launcher/trainer.h"
#include "model/vocab.h"
#include "monitoring/metrics_server.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::nf::testing::ExpectInvalidArgument;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A file under the test temp directory, removed when the test ends.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& contents)
      : path_(absl::StrCat(::testing::TempDir(), "nf_config_test_", getpid(), "_", name)) {
    std::ofstream(path_) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A free TCP port on this machine (bound, read back, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

void ExpectOneLine(const absl::Status& status) {
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos) << status;
}

// Valid, and a base on which each validation case changes one thing.
TrainConfig ValidConfig() {
  TrainConfig config;
  config.mutable_train()->set_train_iters(1000);
  return config;
}

// ---- Loading --------------------------------------------------------------------------------

TEST(LoadTrainConfigTest, ReadsFieldsAndKeepsDefaultsForTheRest) {
  const TempFile file("basic.pbtxt", R"pb(
    # comments are fine
    model {
      num_layers: 2
      normformer { scale_fc: false }
    }
    train {
      train_iters: 1000
      precision: BF16
      optimizer { lr: 6e-4 }
    }
  )pb");
  const absl::StatusOr<TrainConfig> config = LoadTrainConfig(file.path(), {});
  NF_ASSERT_OK(config);
  EXPECT_EQ(config->model().num_layers(), 2);
  EXPECT_EQ(config->model().d_model(), 128);
  EXPECT_FALSE(config->model().normformer().scale_fc());
  EXPECT_TRUE(config->model().normformer().scale_attn());
  EXPECT_EQ(config->train().precision(), TrainOptions::BF16);
  EXPECT_FLOAT_EQ(config->train().optimizer().lr(), 6e-4f);
  EXPECT_EQ(config->train().lr_schedule().warmup_iters(), 750);
}

TEST(LoadTrainConfigTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = absl::StrCat(::testing::TempDir(), "nf_config_test_no_such.pbtxt");
  const absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, {});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  ExpectOneLine(config.status());
}

TEST(LoadTrainConfigTest, DirectoryIsAnErrorNamingThePath) {
  const std::string path = ::testing::TempDir();
  const absl::StatusOr<TrainConfig> config = LoadTrainConfig(path, {});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST(LoadTrainConfigTest, UnknownFieldNamesFileLineColumnAndField) {
  const TempFile file("unknown.pbtxt", "model {\n  num_layers: 2\n  d_modle: 256\n}\n");
  const absl::StatusOr<TrainConfig> config = LoadTrainConfig(file.path(), {});
  ExpectInvalidArgument(config.status(), "d_modle");
  // Protobuf's tokenizer has moved past the name when it looks the field up: the column is
  // that of the ':' after it.
  EXPECT_THAT(std::string(config.status().message()), StartsWith(file.path() + ":3:10: "));
  ExpectOneLine(config.status());
}

TEST(LoadTrainConfigTest, SyntaxAndValueErrorsNameTheirPosition) {
  const TempFile syntax("syntax.pbtxt", "train {\n  seq_len: 64\n");
  ExpectInvalidArgument(LoadTrainConfig(syntax.path(), {}).status(), syntax.path() + ":3:");

  const TempFile bad_enum("enum.pbtxt", "train { precision: FP8 }\n");
  const absl::Status status = LoadTrainConfig(bad_enum.path(), {}).status();
  ExpectInvalidArgument(status, bad_enum.path() + ":1:");
  ExpectInvalidArgument(status, "FP8");

  const TempFile bad_int("int.pbtxt", "\nmodel { d_model: 1.5 }\n");
  ExpectInvalidArgument(LoadTrainConfig(bad_int.path(), {}).status(), bad_int.path() + ":2:");
}

TEST(LoadTrainConfigTest, AppliesOverridesInOrderThenValidates) {
  const TempFile file("overrides.pbtxt", "train { train_iters: 1000 seq_len: 64 }\n");
  const absl::StatusOr<TrainConfig> config =
      LoadTrainConfig(file.path(), {"train.seq_len=32", "model.d_model=256", "train.seq_len=16"});
  NF_ASSERT_OK(config);
  EXPECT_EQ(config->train().seq_len(), 16);
  EXPECT_EQ(config->model().d_model(), 256);

  ExpectInvalidArgument(LoadTrainConfig(file.path(), {"train.seq_lne=32"}).status(),
                        "--set train.seq_lne=32: no field 'seq_lne'");
  ExpectInvalidArgument(LoadTrainConfig(file.path(), {"train.seq_len=4096"}).status(),
                        "train.seq_len (4096) exceeds model.max_seq_len (128)");
}

TEST(LoadTrainConfigTest, TheSchemaDefaultsAloneDoNotValidate) {
  // The defaults pair the paper's 750 warmup updates with a 200-update demo run, so a config
  // file must set one of the two; the error says so.
  const TempFile file("empty.pbtxt", "");
  const absl::Status status = LoadTrainConfig(file.path(), {}).status();
  ExpectInvalidArgument(status, "train.lr_schedule.warmup_iters (750) exceeds train.train_iters");
  NF_EXPECT_OK(LoadTrainConfig(file.path(), {"train.train_iters=750"}));
}

// ---- Overrides ------------------------------------------------------------------------------

TEST(ApplyOverrideTest, SetsEveryScalarKindOfTheSchema) {
  TrainConfig config;
  for (const char* override_text :
       {"model.d_model=256", "train.train_iters=123456789012", "train.seed=4000000000",
        "train.optimizer.lr=6e-4", "train.optimizer.beta2=+0.95",
        "model.normformer.scale_attn=false", "model.normformer.scale_fc=0",
        "model.tie_embeddings=1", "train.precision=BF16", "model.activation=RELU_SQUARED",
        "train.lr_schedule.decay=COSINE", "model.normformer.head_scale_placement=AFTER_OUT_PROJ",
        "train.log_interval=-3"}) {
    NF_ASSERT_OK(ApplyOverride(override_text, &config)) << override_text;
  }
  EXPECT_EQ(config.model().d_model(), 256);
  EXPECT_EQ(config.train().train_iters(), 123456789012);
  EXPECT_EQ(config.train().seed(), 4000000000u);
  EXPECT_EQ(config.train().optimizer().lr(), 6e-4f);
  EXPECT_EQ(config.train().optimizer().beta2(), 0.95f);
  EXPECT_FALSE(config.model().normformer().scale_attn());
  EXPECT_FALSE(config.model().normformer().scale_fc());
  EXPECT_TRUE(config.model().tie_embeddings());
  EXPECT_EQ(config.train().precision(), TrainOptions::BF16);
  EXPECT_EQ(config.model().activation(), nf::model::ModelConfig::RELU_SQUARED);
  EXPECT_EQ(config.train().lr_schedule().decay(), LrScheduleConfig::COSINE);
  EXPECT_EQ(config.model().normformer().head_scale_placement(),
            nf::model::NormFormerConfig::AFTER_OUT_PROJ);
  EXPECT_EQ(config.train().log_interval(), -3);  // parsed; rejected later by validation
}

TEST(ApplyOverrideTest, SetsStringDoubleAndUint64Fields) {
  // The config schemas have none of these types yet; protobuf's own messages do.
  google::protobuf::FileDescriptorProto file;
  NF_ASSERT_OK(ApplyOverride("options.java_package=org.example=1", &file));
  EXPECT_EQ(file.options().java_package(), "org.example=1");  // only the first '=' splits
  NF_ASSERT_OK(ApplyOverride("name=", &file));
  EXPECT_TRUE(file.has_name());

  google::protobuf::Value value;
  NF_ASSERT_OK(ApplyOverride("number_value=-2.5e-300", &value));
  EXPECT_EQ(value.number_value(), -2.5e-300);
  // A proto3 oneof member set to its zero value must still be set.
  NF_ASSERT_OK(ApplyOverride("bool_value=false", &value));
  EXPECT_EQ(value.kind_case(), google::protobuf::Value::kBoolValue);

  google::protobuf::UInt64Value big;
  NF_ASSERT_OK(ApplyOverride("value=18446744073709551615", &big));
  EXPECT_EQ(big.value(), 18446744073709551615u);
  ExpectInvalidArgument(ApplyOverride("value=18446744073709551616", &big),
                        "is out of range for uint64");
  ExpectInvalidArgument(ApplyOverride("value=1e400", &value),
                        "no field 'value' in google.protobuf.Value");
  google::protobuf::DoubleValue real;
  ExpectInvalidArgument(ApplyOverride("value=1e400", &real), "'1e400' is out of range for double");
  ExpectInvalidArgument(ApplyOverride("value=1e-400", &real),
                        "'1e-400' is out of range for double");
  NF_ASSERT_OK(ApplyOverride("value=4.9e-324", &real));  // the smallest subnormal
  EXPECT_EQ(real.value(), 4.9e-324);
}

TEST(ApplyOverrideTest, UnknownNamesListWhatExistsThere) {
  TrainConfig config;
  const absl::Status status = ApplyOverride("model.d_modle=256", &config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "--set model.d_modle=256: no field 'd_modle' in nf.model.ModelConfig (fields: "
            "num_layers, d_model, num_heads, ffn_dim, vocab_size, max_seq_len, positions, "
            "first_position, activation, dropout, attention_dropout, activation_dropout, "
            "scale_embedding, tie_embeddings, layer_norm_eps, normformer, objective, "
            "mask_token)");
  ExpectInvalidArgument(ApplyOverride("modle.d_model=256", &config),
                        "--set modle.d_model=256: no field 'modle' in nf.launcher.TrainConfig "
                        "(fields: model, train, data, parallel, checkpoint, monitoring)");
  EXPECT_EQ(ApplyOverride("train.precision=FP8", &config).message(),
            "--set train.precision=FP8: 'FP8' is not a value of "
            "nf.launcher.TrainOptions.Precision (values: FP32, FP16, BF16)");
  ExpectInvalidArgument(ApplyOverride("model..d_model=1", &config),
                        "empty field name in nf.model.ModelConfig");
  ExpectInvalidArgument(ApplyOverride("=1", &config),
                        "empty field name in nf.launcher.TrainConfig");
}

TEST(ApplyOverrideTest, BadOverridesSayWhatWouldWork) {
  const struct {
    const char* override_text;
    const char* mentions;
  } kCases[] = {
      {"model.d_model", "--set model.d_model: expected field.path=value"},
      {"model.d_model=abc", "'abc' is not a decimal int32 (nf.model.ModelConfig.d_model)"},
      {"model.d_model=12.5", "'12.5' is not a decimal int32"},
      {"model.d_model=", "'' is not a decimal int32"},
      {"model.d_model= 12", "' 12' is not a decimal int32"},
      {"model.d_model=0x10", "'0x10' is not a decimal int32"},
      {"model.d_model=3000000000",
       "'3000000000' is out of range for int32 [-2147483648, 2147483647]"},
      {"train.train_iters=9223372036854775808", "is out of range for int64"},
      {"train.seed=-1", "'-1' is not a decimal uint32"},
      {"train.seed=4294967296", "'4294967296' is out of range for uint32 [0, 4294967295]"},
      {"train.optimizer.lr=fast", "'fast' is not a finite float (nf.launcher.OptimizerConfig.lr)"},
      {"train.optimizer.lr=nan", "'nan' is not a finite float"},
      {"train.optimizer.lr=inf", "'inf' is not a finite float"},
      {"train.optimizer.lr=1e-3x", "'1e-3x' is not a finite float"},
      {"train.optimizer.lr=1e39", "'1e39' is out of range for float"},
      {"train.optimizer.lr=1e-50", "'1e-50' is out of range for float"},
      {"train.optimizer.lr=1e39x", "'1e39x' is not a finite float"},
      {"model.normformer.scale_attn=yes", "'yes' is not a bool (true, false, 1 or 0)"},
      {"model.normformer.scale_attn=False", "'False' is not a bool"},
      {"train.precision=FP8",
       "'FP8' is not a value of nf.launcher.TrainOptions.Precision (values: FP32, FP16, BF16)"},
      {"train.precision=1", "'1' is not a value of nf.launcher.TrainOptions.Precision"},
      {"model.activation=gelu", "(values: GELU, GELU_TANH, RELU_SQUARED)"},
      {"model.normformer=false",
       "--set model.normformer=false: 'normformer' is a message (nf.model.NormFormerConfig); set "
       "one of its fields instead (fields: scale_attn, scale_heads, head_scale_placement, "
       "scale_fc, scale_resids)"},
      {"train=1", "'train' is a message (nf.launcher.TrainOptions)"},
      {"model.d_model.x=1",
       "'d_model' in nf.model.ModelConfig has type int32, not a message with fields"},
      {"train.precision.x=1",
       "'precision' in nf.launcher.TrainOptions has type nf.launcher.TrainOptions.Precision"},
  };
  for (const auto& c : kCases) {
    TrainConfig config;
    const absl::Status status = ApplyOverride(c.override_text, &config);
    ExpectInvalidArgument(status, c.mentions);
    EXPECT_THAT(std::string(status.message()), StartsWith(absl::StrCat("--set ", c.override_text)));
    ExpectOneLine(status);
  }
}

TEST(ApplyOverrideTest, RejectsRepeatedFields) {
  google::protobuf::FileDescriptorProto file;
  ExpectInvalidArgument(ApplyOverride("dependency=a.proto", &file),
                        "'dependency' in google.protobuf.FileDescriptorProto is a repeated field");
  ExpectInvalidArgument(ApplyOverride("message_type.name=M", &file), "is a repeated field");
}

TEST(ApplyOverrideTest, FailedOverrideLeavesTheMessageUntouched) {
  TrainConfig config;
  EXPECT_FALSE(ApplyOverride("model.normformer.scale_attn=maybe", &config).ok());
  EXPECT_FALSE(ApplyOverride("train.optimizer.bogus=1", &config).ok());
  EXPECT_FALSE(config.has_model());
  EXPECT_FALSE(config.has_train());
}

// ---- Validation -----------------------------------------------------------------------------

struct ValidationCase {
  std::vector<std::string> overrides;  // applied to ValidConfig()
  std::string mentions;
};

class ValidationTest : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(ValidationTest, NamesTheFieldAndWhatWouldWork) {
  TrainConfig config = ValidConfig();
  for (const std::string& override_text : GetParam().overrides) {
    NF_ASSERT_OK(ApplyOverride(override_text, &config)) << override_text;
  }
  const absl::Status status = ValidateTrainConfig(config);
  ExpectInvalidArgument(status, GetParam().mentions);
  ExpectOneLine(status);
}

INSTANTIATE_TEST_SUITE_P(
    EveryRule, ValidationTest,
    ::testing::Values(
        ValidationCase{.overrides = {"model.num_layers=0"},
                       .mentions = "model.num_layers must be positive (got 0)"},
        ValidationCase{.overrides = {"model.d_model=-128"},
                       .mentions = "model.d_model must be positive (got -128)"},
        ValidationCase{.overrides = {"model.num_heads=0"},
                       .mentions = "model.num_heads must be positive"},
        ValidationCase{.overrides = {"model.ffn_dim=0"},
                       .mentions = "model.ffn_dim must be positive"},
        ValidationCase{.overrides = {"model.vocab_size=0"},
                       .mentions = "model.vocab_size must be positive"},
        ValidationCase{.overrides = {"model.max_seq_len=0"},
                       .mentions = "model.max_seq_len must be positive"},
        ValidationCase{.overrides = {"model.d_model=100", "model.num_heads=3"},
                       .mentions = "model.d_model (100) must be a multiple of model.num_heads (3): "
                                   "e.g. model.d_model=102"},
        ValidationCase{.overrides = {"model.dropout=1"},
                       .mentions = "model.dropout must be in [0, 1) (got 1)"},
        ValidationCase{.overrides = {"model.attention_dropout=-0.1"},
                       .mentions = "model.attention_dropout must be in [0, 1)"},
        ValidationCase{.overrides = {"model.activation_dropout=1.5"},
                       .mentions = "model.activation_dropout must be in [0, 1)"},
        ValidationCase{.overrides = {"model.layer_norm_eps=0"},
                       .mentions = "model.layer_norm_eps must be positive and finite"},
        ValidationCase{.overrides = {"train.seq_len=0"},
                       .mentions = "train.seq_len must be positive"},
        ValidationCase{.overrides = {"train.seq_len=256"},
                       .mentions = "train.seq_len (256) exceeds model.max_seq_len (128): lower "
                                   "train.seq_len or set model.max_seq_len >= 256"},
        ValidationCase{.overrides = {"train.micro_batch_size=0"},
                       .mentions = "train.micro_batch_size must be positive"},
        ValidationCase{.overrides = {"train.global_batch_size=30"},
                       .mentions = "train.global_batch_size (30) must be a positive multiple of "
                                   "train.micro_batch_size (4): e.g. 28 or 32"},
        ValidationCase{.overrides = {"train.global_batch_size=2"},
                       .mentions = "multiple of train.micro_batch_size (4): e.g. 4"},
        ValidationCase{.overrides = {"train.global_batch_size=0"},
                       .mentions = "train.global_batch_size (0) must be a positive multiple"},
        ValidationCase{.overrides = {"train.train_iters=0"},
                       .mentions = "train.train_iters must be positive"},
        ValidationCase{.overrides = {"train.log_interval=0"},
                       .mentions = "train.log_interval must be positive"},
        ValidationCase{.overrides = {"train.optimizer.lr=0"},
                       .mentions = "train.optimizer.lr must be positive and finite (got 0)"},
        ValidationCase{.overrides = {"train.optimizer.beta1=1"},
                       .mentions = "train.optimizer.beta1 must be in [0, 1)"},
        ValidationCase{.overrides = {"train.optimizer.beta2=-0.5"},
                       .mentions = "train.optimizer.beta2 must be in [0, 1)"},
        ValidationCase{.overrides = {"train.optimizer.eps=0"},
                       .mentions = "train.optimizer.eps must be positive"},
        ValidationCase{.overrides = {"train.optimizer.weight_decay=-0.01"},
                       .mentions = "train.optimizer.weight_decay must be >= 0"},
        ValidationCase{.overrides = {"train.optimizer.clip_grad=-1"},
                       .mentions = "train.optimizer.clip_grad must be >= 0"},
        ValidationCase{.overrides = {"train.lr_schedule.warmup_iters=-1"},
                       .mentions = "train.lr_schedule.warmup_iters must be >= 0"},
        ValidationCase{.overrides = {"train.lr_schedule.decay_iters=-1"},
                       .mentions = "train.lr_schedule.decay_iters must be >= 0"},
        ValidationCase{.overrides = {"train.lr_schedule.min_lr=-1e-5"},
                       .mentions = "train.lr_schedule.min_lr must be >= 0"},
        ValidationCase{.overrides = {"train.lr_schedule.min_lr=0.01"},
                       .mentions = "train.lr_schedule.min_lr (0.01) exceeds the peak "
                                   "train.optimizer.lr (0.003): set min_lr <= lr"},
        ValidationCase{.overrides = {"train.lr_schedule.warmup_iters=2000"},
                       .mentions = "train.lr_schedule.warmup_iters (2000) exceeds "
                                   "train.train_iters (1000)"},
        ValidationCase{.overrides = {"train.lr_schedule.decay_iters=500"},
                       .mentions = "train.lr_schedule.warmup_iters (750) exceeds "
                                   "train.lr_schedule.decay_iters (500)"},
        ValidationCase{.overrides = {"train.lr_schedule.decay=CONSTANT",
                                     "train.lr_schedule.warmup_iters=1001"},
                       .mentions = "warmup_iters (1001) exceeds train.train_iters (1000)"},
        ValidationCase{.overrides = {"train.loss_scale.initial_scale=0"},
                       .mentions = "train.loss_scale.initial_scale must be positive"},
        ValidationCase{.overrides = {"train.loss_scale.min_scale=0"},
                       .mentions = "train.loss_scale.min_scale must be positive"},
        ValidationCase{.overrides = {"train.loss_scale.min_scale=131072"},
                       .mentions = "train.loss_scale.min_scale (131072) exceeds "
                                   "train.loss_scale.initial_scale (65536)"},
        ValidationCase{.overrides = {"train.loss_scale.growth_factor=1"},
                       .mentions = "train.loss_scale.growth_factor must be finite and > 1"},
        ValidationCase{.overrides = {"train.loss_scale.backoff_factor=1"},
                       .mentions = "train.loss_scale.backoff_factor must be in (0, 1)"},
        ValidationCase{.overrides = {"train.loss_scale.backoff_factor=0"},
                       .mentions = "train.loss_scale.backoff_factor must be in (0, 1)"},
        ValidationCase{.overrides = {"train.loss_scale.growth_interval=0"},
                       .mentions = "train.loss_scale.growth_interval must be positive"},
        ValidationCase{.overrides = {"train.loss_scale.hysteresis=0"},
                       .mentions = "train.loss_scale.hysteresis must be positive"},
        ValidationCase{.overrides = {"data.synthetic.branching=0"},
                       .mentions = "data.synthetic.branching (0) must be in [1, model.vocab_size)"},
        ValidationCase{.overrides = {"model.vocab_size=16", "data.synthetic.branching=16"},
                       .mentions = "data.synthetic.branching (16) must be in [1, "
                                   "model.vocab_size) = [1, 16)"},
        ValidationCase{.overrides = {"parallel.tensor_parallel=0"},
                       .mentions = "parallel.tensor_parallel must be positive (got 0)"},
        ValidationCase{.overrides = {"parallel.tensor_parallel=3"},
                       .mentions = "model.num_heads (4) is not divisible by tensor_parallel (3)"},
        ValidationCase{.overrides = {"parallel.pipeline_parallel=3"},
                       .mentions = "model.num_layers (4) does not split into pipeline_parallel 3 "
                                   "x virtual_stages 1 = 3 equal stages; use 2 or 4 stages"},
        ValidationCase{.overrides = {"parallel.virtual_stages=2"},
                       .mentions = "parallel.virtual_stages (2) needs "
                                   "parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B"},
        ValidationCase{.overrides = {"parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B"},
                       .mentions = "needs pipeline_parallel >= 2 and virtual_stages >= 2 (got 1 "
                                   "and 1); use ONE_F_ONE_B otherwise"},
        ValidationCase{
            .overrides = {"parallel.tensor_parallel=2", "parallel.sequence_parallel=true",
                          "train.micro_batch_size=1", "train.seq_len=7"},
            .mentions = "parallel.sequence_parallel splits each micro-batch's tokens "
                        "over the tensor-parallel ranks: train.micro_batch_size x "
                        "train.seq_len (1 x 7 = 7) must be a multiple of "
                        "parallel.tensor_parallel (2)"},
        ValidationCase{
            .overrides = {"train.activation_recompute=true", "train.recompute=SELECTIVE"},
            .mentions = "train.activation_recompute: true (the older spelling of "
                        "train.recompute: FULL) contradicts train.recompute: "
                        "SELECTIVE; keep only train.recompute"},
        ValidationCase{.overrides = {"parallel.grad_bucket_elements=0"},
                       .mentions = "parallel.grad_bucket_elements must be positive"},
        ValidationCase{.overrides = {"data.split=abc"},
                       .mentions = "data.split: data: split \"abc\": part 1 (\"abc\") is not a "
                                   "number"},
        ValidationCase{.overrides = {"checkpoint.save_interval=-5"},
                       .mentions = "checkpoint.save_interval must be >= 0 (got -5)"},
        ValidationCase{.overrides = {"checkpoint.keep_last=-1"},
                       .mentions = "checkpoint.keep_last must be positive (got -1)"},
        ValidationCase{.overrides = {"checkpoint.keep_every=-2"},
                       .mentions = "checkpoint.keep_every must be >= 0 (got -2)"},
        ValidationCase{.overrides = {"train.max_consecutive_skipped=-3"},
                       .mentions = "train.max_consecutive_skipped must be positive (got -3)"},
        ValidationCase{.overrides = {"monitoring.port_base=70000"},
                       .mentions = "monitoring.port_base (70000) must be a TCP port in [1, 65535]"},
        ValidationCase{.overrides = {"monitoring.bind_address=not-an-ip"},
                       .mentions = "monitoring.bind_address 'not-an-ip' is not an IPv4 or IPv6 "
                                   "address"},
        // Issue 45: each was accepted and failed later, after the run directory was written:
        // bad_alloc (2^31 - 1 recorder entries; 2^31 - 1 micro-batches in the schedule the memory
        // estimate builds), or the watchdog's abort at the first collective, requeued forever.
        ValidationCase{.overrides = {"parallel.flight_recorder_entries=2147483647"},
                       .mentions = "parallel.flight_recorder_entries must be at most 1048576 "
                                   "(got 2147483647"},
        ValidationCase{.overrides = {"parallel.collective_timeout_seconds=1e-30"},
                       .mentions = "parallel.collective_timeout_seconds must be in [1, 604800] "
                                   "(got 1e-30)"},
        ValidationCase{
            .overrides = {"train.micro_batch_size=1", "train.global_batch_size=2147483647"},
            .mentions = "train.global_batch_size (2147483647) / "
                        "train.micro_batch_size (1) is 2147483647 micro-batches a "
                        "step, more than 1048576"}));

TEST(ValidateTrainConfigTest, AcceptsBoundaryValues) {
  TrainConfig config = ValidConfig();
  for (const char* override_text :
       {"model.dropout=0", "model.d_model=96", "model.num_heads=96", "train.seq_len=128",
        "train.global_batch_size=4", "train.lr_schedule.warmup_iters=1000",
        "train.lr_schedule.min_lr=3e-3", "train.loss_scale.min_scale=65536", "model.vocab_size=2",
        "data.synthetic.branching=1", "train.optimizer.clip_grad=0"}) {
    NF_ASSERT_OK(ApplyOverride(override_text, &config)) << override_text;
  }
  NF_EXPECT_OK(ValidateTrainConfig(config));

  // A constant schedule ignores decay_iters, so it cannot cut the warmup short.
  TrainConfig constant = ValidConfig();
  constant.mutable_train()->mutable_lr_schedule()->set_decay(LrScheduleConfig::CONSTANT);
  constant.mutable_train()->mutable_lr_schedule()->set_decay_iters(10);
  NF_EXPECT_OK(ValidateTrainConfig(constant));
}

TEST(ValidateTrainConfigTest, RejectsNonFiniteValuesFromFiles) {
  // Text format accepts nan and inf, which --set does not.
  TrainConfig config = ValidConfig();
  config.mutable_model()->set_dropout(NAN);
  ExpectInvalidArgument(ValidateTrainConfig(config), "model.dropout must be in [0, 1) (got nan)");
  config = ValidConfig();
  config.mutable_train()->mutable_optimizer()->set_lr(INFINITY);
  ExpectInvalidArgument(ValidateTrainConfig(config), "train.optimizer.lr must be positive");
  config = ValidConfig();
  config.mutable_train()->mutable_loss_scale()->set_growth_factor(INFINITY);
  ExpectInvalidArgument(ValidateTrainConfig(config), "train.loss_scale.growth_factor");
}

// monitoring.bind_address is checked before anything is written, so an address it accepts must
// be one the metrics server can listen on, and one it refuses one the server refuses too.
TEST(ValidateTrainConfigTest, BindAddressesAcceptedAreTheOnesTheMetricsServerTakes) {
  for (const char* address : {"0.0.0.0", "127.0.0.1", "::", "::1", "::ffff:127.0.0.1"}) {
    TrainConfig config = ValidConfig();
    config.mutable_monitoring()->set_bind_address(address);
    NF_EXPECT_OK(ValidateTrainConfig(config)) << address;
    const absl::StatusOr<std::unique_ptr<monitoring::MetricsServer>> server =
        monitoring::MetricsServer::Start(address, FreePort(), [] { return std::string(); });
    EXPECT_TRUE(server.ok()) << address << ": " << server.status();
  }
  for (const char* address : {"not-an-ip", "localhost", "[::1]", "127.0.0.1:9600", ""}) {
    TrainConfig config = ValidConfig();
    config.mutable_monitoring()->set_bind_address(address);
    EXPECT_FALSE(ValidateTrainConfig(config).ok()) << address;
    EXPECT_EQ(monitoring::MetricsServer::Start(address, FreePort(), [] { return std::string(); })
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
}

// ---- Resolved text --------------------------------------------------------------------------

// Every singular field of `message` and of its sub-messages, recursively, is present.
void ExpectEveryFieldSet(const google::protobuf::Message& message, const std::string& prefix) {
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const google::protobuf::Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string name = prefix + field->name();
    if (field->is_repeated()) continue;  // lists have no defaults to write out
    EXPECT_TRUE(reflection->HasField(message, field)) << name;
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      ExpectEveryFieldSet(reflection->GetMessage(message, field), name + ".");
    }
  }
}

TrainConfig Parse(const std::string& text) {
  TrainConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

TEST(ResolvedConfigTextTest, WritesEveryFieldIncludingDefaults) {
  const std::string text = ResolvedConfigText(TrainConfig());
  for (const char* expected :
       {"num_layers: 4", "vocab_size: 8192", "positions: SINUSOIDAL", "activation: GELU",
        "layer_norm_eps: 1e-05", "scale_attn: true", "scale_resids: false",
        "head_scale_placement: BEFORE_OUT_PROJ", "precision: FP32", "activation_recompute: false",
        "lr: 0.003", "eps: 1e-08", "decay: LINEAR", "warmup_iters: 750", "initial_scale: 65536",
        "hysteresis: 2", "branching: 2", "seed: 1234"}) {
    EXPECT_THAT(text, HasSubstr(expected));
  }
  ExpectEveryFieldSet(Parse(text), "");
}

// train.activation_recompute: true is written as what it means, so the resolved text validates.
TEST(ResolvedConfigTextTest, WritesTheOlderRecomputeSpellingAsRecomputeFull) {
  TrainConfig config = ValidConfig();
  config.mutable_train()->set_activation_recompute(true);
  NF_ASSERT_OK(ValidateTrainConfig(config));
  const TrainConfig resolved = Parse(ResolvedConfigText(config));
  EXPECT_FALSE(resolved.train().activation_recompute());
  EXPECT_EQ(resolved.train().recompute(), TrainOptions::FULL);
  NF_EXPECT_OK(ValidateTrainConfig(resolved));
  EXPECT_EQ(RecomputeOf(config.train()), model::Recompute::kFull);
  EXPECT_EQ(RecomputeOf(resolved.train()), model::Recompute::kFull);
}

TEST(ResolvedConfigTextTest, RoundTripsThroughTheParser) {
  TrainConfig config = ValidConfig();
  for (const char* override_text :
       {"model.d_model=96", "model.num_heads=3", "model.normformer.scale_heads=false",
        "train.optimizer.lr=6e-4", "train.optimizer.eps=1e-8", "model.dropout=0.1",
        "train.seed=4294967295", "train.precision=FP16", "model.activation=GELU_TANH",
        "train.lr_schedule.min_lr=1.17549435e-38"}) {
    NF_ASSERT_OK(ApplyOverride(override_text, &config)) << override_text;
  }
  const std::string text = ResolvedConfigText(config);
  const TrainConfig parsed = Parse(text);
  EXPECT_TRUE(MessageDifferencer::Equivalent(config, parsed)) << text;
  EXPECT_FALSE(MessageDifferencer::Equals(config, parsed)) << "defaults were not made explicit";
  EXPECT_EQ(ResolvedConfigText(parsed), text);
  EXPECT_EQ(parsed.train().optimizer().lr(), 6e-4f);  // floats exactly, not to 6 digits
  EXPECT_EQ(parsed.train().lr_schedule().min_lr(), 1.17549435e-38f);
  NF_EXPECT_OK(ValidateTrainConfig(parsed));
}

// ---- Padded vocabulary ----------------------------------------------------------------------

TEST(PaddedVocabSizeTest, RoundsUpToWholeRowBlocksPerRank) {
  EXPECT_EQ(nf::model::PaddedVocabSize(50257, 1), 50304);
  EXPECT_EQ(nf::model::PaddedVocabSize(50257, 2), 50432);
  EXPECT_EQ(nf::model::PaddedVocabSize(50257, 8), 51200);
  EXPECT_EQ(nf::model::PaddedVocabSize(512, 4), 512);
  EXPECT_EQ(nf::model::PaddedVocabSize(128, 1), 128);
  EXPECT_EQ(nf::model::PaddedVocabSize(129, 1), 256);
  EXPECT_EQ(nf::model::PaddedVocabSize(1, 3), 384);
  EXPECT_EQ(nf::model::PaddedVocabSize(0, 2), 0);
}

}  // namespace
}  // namespace nf::launcher
