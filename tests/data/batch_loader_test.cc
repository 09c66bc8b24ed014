// Tests of data/batch_loader.h: the global batch of a step is the same samples of the blended
// stream whatever the data-parallel size and micro-batch size, ranks take consecutive slices of
// it, targets are inputs shifted by one token, resuming from a consumed-sample count continues
// the exact stream, the buffers are reused, and out-of-vocabulary tokens, reads past the stream
// and bad configurations are reported in one line.
#include "data/batch_loader.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "data/document_source.h"
#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::testing::HasSubstr;

constexpr int64_t kSeqLen = 6;
constexpr int64_t kVocab = 5000;
constexpr int64_t kStream = 96;  // blended samples

// Documents of the given lengths whose tokens count up from `first`: every token value names
// one place of one source.
std::shared_ptr<const DocumentSource> Numbered(const std::string& name, int32_t first,
                                               const std::vector<int>& lengths) {
  std::vector<std::vector<int32_t>> documents;
  for (const int length : lengths) {
    std::vector<int32_t>& document = documents.emplace_back(length);
    std::iota(document.begin(), document.end(), first);
    first += length;
  }
  return std::make_shared<InMemoryDocumentSource>(name, documents);
}

GptSamples MustBuild(std::shared_ptr<const DocumentSource> source, int64_t num_samples,
                     uint32_t seed) {
  const DocumentRange all{.begin = 0, .end = source->num_documents()};
  absl::StatusOr<GptSamples> samples = GptSamples::Build(
      std::move(source),
      {.documents = all, .seq_len = kSeqLen, .num_samples = num_samples, .seed = seed});
  NF_EXPECT_OK(samples);
  if (!samples.ok()) std::abort();
  return *std::move(samples);
}

// Two datasets blended 0.7 / 0.3: "web" tokens from 0, "books" tokens from 2000.
struct Stream {
  std::vector<GptSamples> datasets;
  Blending blending;
};

Stream MakeStream(uint32_t seed = 17) {
  absl::StatusOr<Blending> blending = Blending::Build(std::vector<double>{0.7, 0.3}, kStream);
  NF_EXPECT_OK(blending);
  if (!blending.ok()) std::abort();
  std::vector<GptSamples> datasets;
  datasets.push_back(
      MustBuild(Numbered("web", 0, {40, 3, 17, 25, 9, 60, 1, 33}), blending->counts()[0], seed));
  datasets.push_back(
      MustBuild(Numbered("books", 2000, {120, 75, 4, 98}), blending->counts()[1], seed));
  return {.datasets = std::move(datasets), .blending = *std::move(blending)};
}

BatchLoaderConfig Config(int64_t global, int64_t micro, int64_t dp, int64_t rank) {
  return {.seq_len = kSeqLen,
          .global_batch_size = global,
          .micro_batch_size = micro,
          .data_parallel_size = dp,
          .data_parallel_rank = rank,
          .vocab_size = kVocab};
}

BatchLoader MustCreate(Stream stream, const BatchLoaderConfig& config) {
  absl::StatusOr<BatchLoader> loader =
      BatchLoader::Create(std::move(stream.datasets), std::move(stream.blending), config);
  NF_EXPECT_OK(loader);
  if (!loader.ok()) std::abort();
  return *std::move(loader);
}

using Rows = std::vector<std::vector<int32_t>>;

// Appends the rows of the loader's current inputs (or targets).
void AppendRows(const Tensor& tensor, Rows& rows) {
  const int32_t* data = tensor.data<int32_t>();
  for (int64_t b = 0; b < tensor.dim(0); ++b) {
    rows.emplace_back(data + b * kSeqLen, data + (b + 1) * kSeqLen);
  }
}

// The L + 1 tokens of blended sample i, read straight from the datasets.
std::vector<int32_t> BlendedSample(const Stream& stream, int64_t i) {
  std::vector<int32_t> tokens(kSeqLen + 1);
  stream.datasets[stream.blending.dataset(i)].Sample(stream.blending.sample(i), tokens.data());
  return tokens;
}

// The inputs of global batch `step` gathered over every rank in rank order, each rank reading
// its micro-batches in order.
Rows GlobalBatchInputs(int64_t step, int64_t global, int64_t micro, int64_t dp) {
  Rows rows;
  for (int64_t rank = 0; rank < dp; ++rank) {
    BatchLoader loader = MustCreate(MakeStream(), Config(global, micro, dp, rank));
    EXPECT_EQ(loader.micro_batches_per_step(), global / (dp * micro));
    for (int64_t m = 0; m < loader.micro_batches_per_step(); ++m) {
      const absl::StatusOr<int64_t> first = loader.Load(step * global, m);
      NF_EXPECT_OK(first);
      // Rank d's slice of the global batch, micro-batch by micro-batch.
      EXPECT_EQ(*first, step * global + rank * (global / dp) + m * micro);
      AppendRows(loader.inputs(), rows);
    }
  }
  return rows;
}

TEST(BatchLoaderTest, GlobalBatchIsTheStreamSliceWhateverTheLayout) {
  constexpr int64_t kGlobal = 12;
  const Stream stream = MakeStream();
  for (const int64_t step : {0, 3, 7}) {
    // Reference: the stream's samples [s G, (s + 1) G), inputs = tokens [0, L).
    Rows expected;
    for (int64_t i = step * kGlobal; i < (step + 1) * kGlobal; ++i) {
      const std::vector<int32_t> tokens = BlendedSample(stream, i);
      expected.emplace_back(tokens.begin(), tokens.end() - 1);
    }
    for (const auto& [dp, micro] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 12}, {1, 1}, {2, 3}, {3, 2}, {4, 3}, {6, 1}, {12, 1}}) {
      EXPECT_EQ(GlobalBatchInputs(step, kGlobal, micro, dp), expected)
          << "step " << step << ", dp " << dp << ", micro-batch " << micro;
    }
  }
}

TEST(BatchLoaderTest, TargetsAreInputsShiftedByOneToken) {
  const Stream stream = MakeStream();
  BatchLoader loader = MustCreate(MakeStream(), Config(8, 4, 1, 0));
  for (int64_t m = 0; m < 2; ++m) {
    const absl::StatusOr<int64_t> first = loader.Load(16, m);
    NF_ASSERT_OK(first);
    Rows inputs, targets;
    AppendRows(loader.inputs(), inputs);
    AppendRows(loader.targets(), targets);
    for (int64_t b = 0; b < 4; ++b) {
      const std::vector<int32_t> tokens = BlendedSample(stream, *first + b);
      EXPECT_EQ(inputs[b], std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
      EXPECT_EQ(targets[b], std::vector<int32_t>(tokens.begin() + 1, tokens.end()));
    }
  }
}

using MicroBatches = std::vector<std::pair<int64_t, Rows>>;

// Runs Next() for `steps` global batches, returning the first-sample index and inputs of each
// micro-batch.
MicroBatches RunSteps(BatchLoader& loader, int64_t steps) {
  MicroBatches out;
  for (int64_t n = 0; n < steps * loader.micro_batches_per_step(); ++n) {
    const absl::StatusOr<int64_t> first = loader.Next();
    NF_EXPECT_OK(first);
    Rows rows;
    AppendRows(loader.inputs(), rows);
    out.emplace_back(*first, std::move(rows));
  }
  return out;
}

TEST(BatchLoaderTest, ResumingFromConsumedSamplesContinuesTheExactStream) {
  const BatchLoaderConfig config = Config(8, 2, 2, 1);
  BatchLoader straight = MustCreate(MakeStream(), config);
  const MicroBatches all = RunSteps(straight, 5);
  EXPECT_EQ(straight.consumed_samples(), 40);

  BatchLoader first_run = MustCreate(MakeStream(), config);
  RunSteps(first_run, 2);
  ASSERT_EQ(first_run.consumed_samples(), 16);
  BatchLoader resumed = MustCreate(MakeStream(), config);
  resumed.ResumeFrom(first_run.consumed_samples());
  const MicroBatches rest = RunSteps(resumed, 3);
  EXPECT_EQ(rest, MicroBatches(all.begin() + 2 * 2, all.end()));
  EXPECT_EQ(resumed.consumed_samples(), 40);
}

TEST(BatchLoaderTest, ResumingWithAnotherGlobalBatchStartsAtTheConsumedSample) {
  // 2 steps of 8, then global batches of 12: the third step reads samples [16, 28), which
  // is not a multiple of the new batch size.
  BatchLoader loader = MustCreate(MakeStream(), Config(12, 3, 1, 0));
  loader.ResumeFrom(16);
  const Stream stream = MakeStream();
  Rows expected;
  for (int64_t i = 16; i < 28; ++i) {
    const std::vector<int32_t> tokens = BlendedSample(stream, i);
    expected.emplace_back(tokens.begin(), tokens.end() - 1);
  }
  Rows rows;
  for (const auto& [first, micro_rows] : RunSteps(loader, 1)) {
    rows.insert(rows.end(), micro_rows.begin(), micro_rows.end());
  }
  EXPECT_EQ(rows, expected);
  EXPECT_EQ(loader.consumed_samples(), 28);
}

TEST(BatchLoaderTest, BatchesReuseTheLoadersBuffers) {
  BatchLoader loader = MustCreate(MakeStream(), Config(8, 4, 1, 0));
  const int32_t* inputs = loader.inputs().data<int32_t>();
  const int32_t* targets = loader.targets().data<int32_t>();
  EXPECT_EQ(loader.inputs().shape(), (Shape{4, kSeqLen}));
  EXPECT_EQ(loader.targets().dtype(), DType::kI32);
  RunSteps(loader, 3);
  EXPECT_EQ(loader.inputs().data<int32_t>(), inputs);
  EXPECT_EQ(loader.targets().data<int32_t>(), targets);
}

TEST(BatchLoaderTest, TokenOutsideTheVocabularyNamesDatasetDocumentAndToken) {
  // Document 2 of "bad" holds token 7777 at offset 1; the vocabulary is [0, 5000).
  const auto source = std::make_shared<InMemoryDocumentSource>(
      "bad", std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {5, 6, 7}, {8, 7777, 9}, {10, 11}});
  absl::StatusOr<Blending> blending = Blending::Build(std::vector<double>{1.0}, 2);
  NF_ASSERT_OK(blending);
  std::vector<GptSamples> datasets;
  datasets.push_back(MustBuild(source, 2, 1));
  BatchLoader loader = MustCreate(
      {.datasets = std::move(datasets), .blending = *std::move(blending)}, Config(2, 2, 1, 0));
  // Two samples of 7 tokens span the first epoch's 12 (and one token more): the micro-batch of
  // both reads all of document 2, wherever the shuffle put it.
  const absl::Status status = loader.Next().status();
  ExpectInvalidArgument(status, "data: token 7777 at offset 1 of document 2 of dataset bad");
  EXPECT_THAT(std::string(status.message()), HasSubstr("vocabulary [0, 5000)"));
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  EXPECT_EQ(loader.consumed_samples(), 0) << "a failed read must not advance";

  // Negative tokens are out of range too.
  const auto negative = std::make_shared<InMemoryDocumentSource>(
      "neg", std::vector<std::vector<int32_t>>{{1, 2, 3, -4, 5, 6, 7, 8}});
  absl::StatusOr<Blending> one = Blending::Build(std::vector<double>{1.0}, 1);
  NF_ASSERT_OK(one);
  std::vector<GptSamples> negative_datasets;
  negative_datasets.push_back(MustBuild(negative, 1, 1));
  BatchLoader negative_loader = MustCreate(
      {.datasets = std::move(negative_datasets), .blending = *std::move(one)}, Config(1, 1, 1, 0));
  ExpectInvalidArgument(negative_loader.Next().status(),
                        "token -4 at offset 3 of document 0 of dataset neg");
}

TEST(BatchLoaderTest, ReadingPastTheStreamIsOutOfRange) {
  BatchLoader loader = MustCreate(MakeStream(), Config(12, 3, 2, 1));
  NF_ASSERT_OK(loader.Load(kStream - 12, 1));
  const absl::Status status = loader.Load(kStream - 6, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("training stream of 96"));
  EXPECT_EQ(loader.Load(0, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(loader.Load(-12, 0).status().code(), absl::StatusCode::kOutOfRange);
  loader.ResumeFrom(kStream);
  EXPECT_EQ(loader.Next().status().code(), absl::StatusCode::kOutOfRange);
}

TEST(BatchLoaderTest, RejectsBadConfigurations) {
  const auto create = [](const BatchLoaderConfig& config) {
    return BatchLoader::Create(MakeStream().datasets, MakeStream().blending, config).status();
  };
  ExpectInvalidArgument(create(Config(10, 2, 4, 0)),
                        "global batch size 10 is not a positive multiple of data-parallel size 4 "
                        "x micro-batch size 2");
  ExpectInvalidArgument(create(Config(0, 1, 1, 0)), "global batch size 0");
  ExpectInvalidArgument(create(Config(8, 2, 2, 2)), "data-parallel rank 2 is not in [0, 2)");
  ExpectInvalidArgument(create(Config(8, 0, 2, 0)), "micro-batch size 0");
  BatchLoaderConfig vocab = Config(8, 2, 2, 0);
  vocab.vocab_size = 0;
  ExpectInvalidArgument(create(vocab), "vocab_size 0");
  BatchLoaderConfig seq = Config(8, 2, 2, 0);
  seq.seq_len = kSeqLen + 1;
  ExpectInvalidArgument(create(seq), "dataset web has");

  // A blend over more datasets than given, or a dataset shorter than the blend needs.
  Stream stream = MakeStream();
  stream.datasets.pop_back();
  ExpectInvalidArgument(
      BatchLoader::Create(stream.datasets, stream.blending, Config(8, 2, 2, 0)).status(),
      "1 datasets for a blend of 2");
  Stream short_stream = MakeStream();
  short_stream.datasets[1] = MustBuild(Numbered("books", 2000, {120, 75, 4, 98}), 5, 17);
  ExpectInvalidArgument(
      BatchLoader::Create(short_stream.datasets, short_stream.blending, Config(8, 2, 2, 0))
          .status(),
      "dataset books has 5 samples of 6 tokens; the blend needs");
}

}  // namespace
}  // namespace nf::data
