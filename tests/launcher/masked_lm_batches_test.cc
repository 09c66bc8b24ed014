// Tests of a masked LM's batches (launcher/batch_source.h with model.objective MASKED_LM): each
// row is its sample's first seq_len tokens corrupted by data::MaskSample, the same whatever the
// micro-batch size (masks are keyed by the sample's stream index and train.seed), for the
// synthetic corpus and a dataset, training and validation; and the validation of the masking's
// fields (data.masked_lm, model.mask_token, model.vocab_size).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/synthetic_corpus.h"
#include "launcher/batch_source.h"
#include "launcher/config.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

namespace fs = std::filesystem;
using ::nf::model::ModelConfig;
using ::nf::testing::ExpectInvalidArgument;
using ::testing::HasSubstr;

constexpr int kSeqLen = 32;
constexpr int kGlobalBatch = 8;

TrainConfig MaskedConfig() {
  TrainConfig config;
  ModelConfig& model = *config.mutable_model();
  model.set_objective(ModelConfig::MASKED_LM);
  model.set_positions(ModelConfig::LEARNED);
  model.set_vocab_size(40);
  model.set_max_seq_len(kSeqLen);
  TrainOptions& train = *config.mutable_train();
  train.set_train_iters(1000);
  train.set_seq_len(kSeqLen);
  train.set_micro_batch_size(2);
  train.set_global_batch_size(kGlobalBatch);
  train.set_seed(7);
  return config;
}

// Rows of one global batch (stream samples [batch_start, batch_start + G)).
struct Rows {
  std::vector<int32_t> inputs, targets;  // [G, seq_len]
  bool operator==(const Rows&) const = default;
};

// The global batch at `batch_start`, loaded through micro-batches of `micro_batch_size`.
Rows LoadGlobalBatch(TrainConfig config, int micro_batch_size, int64_t batch_start,
                     DataSplit split = DataSplit::kTrain) {
  config.mutable_train()->set_micro_batch_size(micro_batch_size);
  absl::StatusOr<std::unique_ptr<BatchSource>> source = MakeBatchSource(config, split);
  NF_EXPECT_OK(source);
  Rows rows;
  if (!source.ok()) return rows;
  for (int64_t j = 0; j < kGlobalBatch / micro_batch_size; ++j) {
    const absl::StatusOr<int64_t> first = (*source)->Load(batch_start, j);
    NF_EXPECT_OK(first);
    EXPECT_EQ(*first, batch_start + j * micro_batch_size);
    const Tensor& inputs = (*source)->inputs();
    const Tensor& targets = (*source)->targets();
    EXPECT_EQ(inputs.shape(), (Shape{micro_batch_size, kSeqLen}));
    EXPECT_EQ(targets.shape(), (Shape{micro_batch_size, kSeqLen}));
    rows.inputs.insert(rows.inputs.end(), inputs.data<int32_t>(),
                       inputs.data<int32_t>() + inputs.numel());
    rows.targets.insert(rows.targets.end(), targets.data<int32_t>(),
                        targets.data<int32_t>() + targets.numel());
  }
  return rows;
}

// The masked rows are the causal LM's input rows (the samples' first seq_len tokens) with the
// chosen positions corrupted: targets -1 where the input is the original, the original where
// chosen, some chosen, and <mask> at most of those.
void ExpectMaskedFrom(const Rows& masked, const Rows& causal, int32_t mask_token) {
  ASSERT_EQ(masked.inputs.size(), causal.inputs.size());
  int64_t chosen = 0, masks = 0;
  for (size_t i = 0; i < masked.inputs.size(); ++i) {
    if (masked.targets[i] == -1) {
      ASSERT_EQ(masked.inputs[i], causal.inputs[i]) << "element " << i;
    } else {
      ASSERT_EQ(masked.targets[i], causal.inputs[i]) << "element " << i;
      ++chosen;
      masks += masked.inputs[i] == mask_token;
    }
  }
  // 8 samples of 32 at 0.15: 4 or 5 each; 80% of them <mask> (the rest random or kept).
  EXPECT_GE(chosen, 8 * 4);
  EXPECT_LE(chosen, 8 * 5);
  EXPECT_GT(masks, chosen / 2);
}

TEST(MaskedLmBatchesTest, SyntheticRowsAreTheSameForEveryMicroBatchSize) {
  const TrainConfig config = MaskedConfig();
  for (const DataSplit split : {DataSplit::kTrain, DataSplit::kValidation}) {
    const Rows reference = LoadGlobalBatch(config, 1, 16, split);
    for (const int m : {2, 4, 8}) {
      EXPECT_EQ(LoadGlobalBatch(config, m, 16, split), reference) << "micro_batch_size " << m;
    }
    TrainConfig causal = config;
    causal.mutable_model()->set_objective(ModelConfig::CAUSAL_LM);
    ExpectMaskedFrom(reference, LoadGlobalBatch(causal, 4, 16, split), 39);
  }
}

TEST(MaskedLmBatchesTest, MasksAreKeyedByStreamIndexAndSeed) {
  const TrainConfig config = MaskedConfig();
  const Rows at_16 = LoadGlobalBatch(config, 2, 16);
  // The batch at 12 holds samples 12..19: its last four rows are the first four at 16.
  const Rows at_12 = LoadGlobalBatch(config, 4, 12);
  const size_t half = at_16.inputs.size() / 2;
  EXPECT_EQ(std::vector<int32_t>(at_12.targets.begin() + half, at_12.targets.end()),
            std::vector<int32_t>(at_16.targets.begin(), at_16.targets.begin() + half));
  EXPECT_EQ(std::vector<int32_t>(at_12.inputs.begin() + half, at_12.inputs.end()),
            std::vector<int32_t>(at_16.inputs.begin(), at_16.inputs.begin() + half));
  TrainConfig reseeded = config;
  reseeded.mutable_train()->set_seed(8);
  EXPECT_NE(LoadGlobalBatch(reseeded, 2, 16).targets, at_16.targets);
}

TEST(MaskedLmBatchesTest, MaskTokenIsTheConfiguredIdOrTheLast) {
  TrainConfig config = MaskedConfig();
  // Every chosen token becomes <mask>.
  config.mutable_data()->mutable_masked_lm()->set_random_token_prob(0);
  config.mutable_data()->mutable_masked_lm()->set_leave_unmasked_prob(0);
  for (const int32_t mask_token : {-1, 0, 17}) {
    config.mutable_model()->set_mask_token(mask_token);
    const int32_t id = mask_token == -1 ? 39 : mask_token;
    const Rows rows = LoadGlobalBatch(config, 4, 0);
    for (size_t i = 0; i < rows.inputs.size(); ++i) {
      if (rows.targets[i] != -1) {
        ASSERT_EQ(rows.inputs[i], id) << "element " << i;
      }
    }
  }
}

// What a step's mean divides by, counted before loading: the targets that are not -1 in the rows
// the batch then loads (a masked LM), or every position (a causal LM).
TEST(MaskedLmBatchesTest, LossTokensCountTheChosenPositionsOfTheBatch) {
  for (const int64_t batch_start : {0, 8, 1000}) {
    const Rows rows = LoadGlobalBatch(MaskedConfig(), 2, batch_start);
    int64_t chosen = 0;
    for (int32_t target : rows.targets) chosen += target != -1;
    absl::StatusOr<std::unique_ptr<BatchSource>> source = MakeBatchSource(MaskedConfig());
    NF_ASSERT_OK(source);
    EXPECT_EQ((*source)->LossTokens(batch_start, kGlobalBatch), chosen) << batch_start;
  }
  TrainConfig causal_config = MaskedConfig();
  causal_config.mutable_model()->set_objective(ModelConfig::CAUSAL_LM);
  absl::StatusOr<std::unique_ptr<BatchSource>> causal = MakeBatchSource(causal_config);
  NF_ASSERT_OK(causal);
  EXPECT_EQ((*causal)->LossTokens(8, kGlobalBatch), kGlobalBatch * kSeqLen);
}

TEST(MaskedLmBatchesTest, DescribeSaysItMasksAndCausalSourcesAreUnchanged) {
  absl::StatusOr<std::unique_ptr<BatchSource>> masked = MakeBatchSource(MaskedConfig());
  NF_ASSERT_OK(masked);
  EXPECT_THAT((*masked)->Describe(), HasSubstr("synthetic"));
  EXPECT_THAT((*masked)->Describe(), HasSubstr("masked"));
  EXPECT_EQ((*masked)->stream_size(), std::numeric_limits<int64_t>::max());

  TrainConfig causal_config = MaskedConfig();
  causal_config.mutable_model()->set_objective(ModelConfig::CAUSAL_LM);
  absl::StatusOr<std::unique_ptr<BatchSource>> causal = MakeBatchSource(causal_config);
  NF_ASSERT_OK(causal);
  EXPECT_THAT((*causal)->Describe(), ::testing::Not(HasSubstr("masked")));
  // The causal LM's targets are the next tokens: no -1 anywhere.
  NF_ASSERT_OK((*causal)->Load(0, 0));
  const Tensor& targets = (*causal)->targets();
  for (int64_t i = 0; i < targets.numel(); ++i) {
    ASSERT_GE(targets.data<int32_t>()[i], 0);
  }
}

// A dataset of 60 documents of 30 to 49 tokens of a Markov chain over the 40 ids.
class MaskedLmDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("nf_masked_lm_batches_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string prefix = (dir_ / "chain").string();
    auto writer = data::IndexedDatasetWriter::Create(prefix, data::TokenDType::kU16);
    NF_ASSERT_OK(writer);
    auto chain = data::SyntheticCorpus::Create(40, 2, 11);
    NF_ASSERT_OK(chain);
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> tokens(30 + d % 20);
      chain->Sample(d, static_cast<int64_t>(tokens.size()), tokens.data());
      NF_ASSERT_OK(writer->AddDocument(tokens));
    }
    NF_ASSERT_OK(writer->Finish());
    config_ = MaskedConfig();
    config_.mutable_data()->set_path(prefix);
    config_.mutable_data()->set_split("80,20,0");
    config_.mutable_train()->set_eval_iters(2);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  TrainConfig config_;
};

TEST_F(MaskedLmDatasetTest, RowsAreTheSameForEveryMicroBatchSize) {
  for (const DataSplit split : {DataSplit::kTrain, DataSplit::kValidation}) {
    const Rows reference = LoadGlobalBatch(config_, 1, 8, split);
    for (const int m : {2, 8}) {
      EXPECT_EQ(LoadGlobalBatch(config_, m, 8, split), reference) << "micro_batch_size " << m;
    }
    TrainConfig causal = config_;
    causal.mutable_model()->set_objective(ModelConfig::CAUSAL_LM);
    ExpectMaskedFrom(reference, LoadGlobalBatch(causal, 4, 8, split), 39);
  }
}

// ---- Validation --------------------------------------------------------------------------------

TEST(MaskedLmValidationTest, AcceptsTheDefaultsAndBoundaries) {
  NF_EXPECT_OK(ValidateTrainConfig(MaskedConfig()));
  TrainConfig config = MaskedConfig();
  MaskedLmConfig& masked_lm = *config.mutable_data()->mutable_masked_lm();
  masked_lm.set_mask_prob(1);
  masked_lm.set_random_token_prob(0.5f);
  masked_lm.set_leave_unmasked_prob(0.5f);
  config.mutable_model()->set_mask_token(39);
  NF_EXPECT_OK(ValidateTrainConfig(config));
  masked_lm.set_random_token_prob(0);
  masked_lm.set_leave_unmasked_prob(0);
  config.mutable_model()->set_mask_token(0);
  NF_EXPECT_OK(ValidateTrainConfig(config));
}

TEST(MaskedLmValidationTest, RejectsBadFieldsNamingThem) {
  struct Case {
    float mask_prob = 0.15f, random_token_prob = 0.1f, leave_unmasked_prob = 0.1f;
    int32_t mask_token = -1;
    const char* mentions;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : std::vector<Case>{
           {.mask_prob = 0, .mentions = "data.masked_lm.mask_prob must be in (0, 1] (got 0)"},
           {.mask_prob = 1.5f, .mentions = "data.masked_lm.mask_prob must be in (0, 1]"},
           {.mask_prob = nan, .mentions = "data.masked_lm.mask_prob must be in (0, 1]"},
           {.random_token_prob = -0.1f,
           .mentions = "data.masked_lm.random_token_prob must be >= 0"},
           {.leave_unmasked_prob = nan,
           .mentions = "data.masked_lm.leave_unmasked_prob must be >= 0"},
           {.random_token_prob = 0.6f,
           .leave_unmasked_prob = 0.5f,
           .mentions =
                "data.masked_lm.random_token_prob (0.6) + data.masked_lm.leave_unmasked_prob "
                "(0.5) must be at most 1"},
           {.mask_token = -2,
           .mentions = "model.mask_token (-2) must be in [-1, model.vocab_size)"},
           {.mask_token = 40,
           .mentions = "model.mask_token (40) must be in [-1, model.vocab_size)"},
       }) {
    TrainConfig config = MaskedConfig();
    MaskedLmConfig& masked_lm = *config.mutable_data()->mutable_masked_lm();
    masked_lm.set_mask_prob(c.mask_prob);
    masked_lm.set_random_token_prob(c.random_token_prob);
    masked_lm.set_leave_unmasked_prob(c.leave_unmasked_prob);
    config.mutable_model()->set_mask_token(c.mask_token);
    const absl::Status status = ValidateTrainConfig(config);
    ExpectInvalidArgument(status, c.mentions);
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos) << status;
  }
}

TEST(MaskedLmValidationTest, RejectsAOneTokenVocabulary) {
  TrainConfig config = MaskedConfig();
  config.mutable_model()->set_vocab_size(1);
  ExpectInvalidArgument(ValidateTrainConfig(config),
                        "model.objective MASKED_LM needs model.vocab_size >= 2 (got 1)");
}

// A masked LM generates no text: samples written while training are refused before the run.
TEST(MaskedLmValidationTest, RejectsTrainingSamples) {
  TrainConfig config = MaskedConfig();
  config.mutable_train()->mutable_samples()->add_prompts("The");
  ExpectInvalidArgument(ValidateTrainConfig(config),
                        "train.samples (text generated while training) needs a causal LM, and "
                        "this model is a masked LM (model.objective MASKED_LM");
}

}  // namespace
}  // namespace nf::launcher
