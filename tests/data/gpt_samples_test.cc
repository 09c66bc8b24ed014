// Tests of data/gpt_samples.h: the document index shuffles every epoch independently, samples
// tile the document stream with one shared token and cover every token of an epoch exactly once
// per epoch, the final epoch is shuffled apart, samples are reproducible and seed-dependent,
// token origins are located, bad specs are rejected, and the cache file round-trips, is keyed by
// the description, and is rebuilt when it does not match or is corrupt.
#include "data/gpt_samples.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
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
using ::testing::MatchesRegex;

// Documents of the given lengths whose tokens are their positions in the whole source (0, 1,
// 2, ...), so every token value names one place of one document.
std::vector<std::vector<int32_t>> NumberedDocuments(const std::vector<int>& lengths) {
  std::vector<std::vector<int32_t>> documents;
  int32_t next = 0;
  for (const int length : lengths) {
    std::vector<int32_t>& document = documents.emplace_back(length);
    std::iota(document.begin(), document.end(), next);
    next += length;
  }
  return documents;
}

// Lengths with empty documents, one-token documents and documents longer than a sample.
const std::vector<int> kLengths = {5, 0, 13, 1, 8, 21, 3, 0, 9, 17, 2, 11, 6, 30, 4, 7, 1, 19, 10};

std::shared_ptr<const DocumentSource> MakeSource(const std::string& name = "numbered") {
  return std::make_shared<InMemoryDocumentSource>(name, NumberedDocuments(kLengths));
}

GptSamples MustBuild(std::shared_ptr<const DocumentSource> source, const GptSamplesSpec& spec) {
  absl::StatusOr<GptSamples> samples = GptSamples::Build(std::move(source), spec);
  NF_EXPECT_OK(samples);
  if (!samples.ok()) std::abort();
  return *std::move(samples);
}

std::vector<int32_t> Read(const GptSamples& samples, int64_t i) {
  std::vector<int32_t> tokens(samples.seq_len() + 1, -1);
  samples.Sample(i, tokens.data());
  return tokens;
}

int64_t TokensIn(DocumentRange range) {
  int64_t tokens = 0;
  for (int64_t d = range.begin; d < range.end; ++d) tokens += kLengths[d];
  return tokens;
}

// Documents [2, 17): 133 tokens per epoch, not a multiple of the sample length, so samples
// straddle epoch boundaries.
constexpr DocumentRange kRange{.begin = 2, .end = 17};
constexpr int64_t kSeqLen = 8;

TEST(GptSamplesTest, EpochCountIsTheFewestThatHoldTheSamples) {
  const int64_t tokens = TokensIn(kRange);
  for (const int64_t num_samples : {0, 1, 17, 18, 36, 37, 100, 1000}) {
    const GptSamples samples =
        MustBuild(MakeSource(),
                  {.documents = kRange, .seq_len = kSeqLen, .num_samples = num_samples, .seed = 1});
    // n samples read n L + 1 tokens of the stream.
    int64_t epochs = 1;
    while (epochs * tokens < num_samples * kSeqLen + 1) ++epochs;
    EXPECT_EQ(samples.indices().num_epochs, epochs) << num_samples;
    EXPECT_EQ(samples.tokens_per_epoch(), tokens);
    EXPECT_EQ(samples.size(), num_samples);
    // Every whole sample of those epochs is built, at least the ones read.
    EXPECT_EQ(samples.indices().num_samples(), (epochs * tokens - 1) / kSeqLen) << num_samples;
    EXPECT_GE(samples.indices().num_samples(), num_samples);
  }
}

TEST(GptSamplesTest, EveryEpochIsAnIndependentShuffleOfTheRange) {
  const GptSamples samples = MustBuild(
      MakeSource(), {.documents = kRange, .seq_len = kSeqLen, .num_samples = 100, .seed = 5});
  const GptSampleIndices& indices = samples.indices();
  ASSERT_EQ(indices.num_epochs, 7);  // 100 x 8 + 1 tokens of 133 per epoch
  ASSERT_EQ(indices.document_index.size(), 7u * kRange.size());
  std::vector<int64_t> identity(kRange.size());
  std::iota(identity.begin(), identity.end(), kRange.begin);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < indices.num_epochs; ++e) {
    const auto first = indices.document_index.begin() + e * kRange.size();
    std::vector<int64_t> epoch(first, first + kRange.size());
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "epoch " << e << " is not a permutation of the range";
    epochs.push_back(std::move(epoch));
  }
  // 15 documents: two independent shuffles coincide with probability 1/15!.
  for (size_t e = 0; e < epochs.size(); ++e) {
    EXPECT_NE(epochs[e], identity) << "epoch " << e << " is not shuffled";
    for (size_t f = 0; f < e; ++f) EXPECT_NE(epochs[e], epochs[f]) << e << " vs " << f;
  }
}

// The samples in stream order (inverting the shuffle), for specs that read every built sample.
std::vector<std::vector<int32_t>> SamplesInStreamOrder(const GptSamples& samples) {
  const GptSampleIndices& indices = samples.indices();
  std::vector<std::vector<int32_t>> ordered(indices.num_samples());
  for (int64_t i = 0; i < samples.size(); ++i) ordered[indices.shuffle_index[i]] = Read(samples, i);
  return ordered;
}

TEST(GptSamplesTest, SamplesTileTheStreamAndCoverEveryTokenOncePerEpoch) {
  // Reading every built sample: n = (E T - 1) / L, which needs exactly E epochs (T >= L). For
  // E = 5, E T - 1 = 664 is a multiple of L = 8 and the samples cover the whole stream; for
  // E = 1 and 2 a partial final sample is dropped.
  const int64_t tokens = TokensIn(kRange);
  ASSERT_EQ(tokens, 133);
  for (const int64_t epochs : {1, 2, 5}) {
    const int64_t num_samples = (epochs * tokens - 1) / kSeqLen;
    const GptSamples samples = MustBuild(
        MakeSource(),
        {.documents = kRange, .seq_len = kSeqLen, .num_samples = num_samples, .seed = 11});
    ASSERT_EQ(samples.indices().num_epochs, epochs);
    ASSERT_EQ(samples.indices().num_samples(), num_samples);
    const std::vector<std::vector<int32_t>> ordered = SamplesInStreamOrder(samples);

    // Consecutive samples share one token: the last target of one is the next one's first input.
    std::vector<int32_t> stream;
    for (int64_t j = 0; j < num_samples; ++j) {
      ASSERT_EQ(ordered[j].size(), static_cast<size_t>(kSeqLen + 1));
      if (j + 1 < num_samples) {
        ASSERT_EQ(ordered[j].back(), ordered[j + 1].front()) << j;
      }
      stream.insert(stream.end(), ordered[j].begin(), ordered[j].end() - 1);
    }
    stream.push_back(ordered.back().back());
    ASSERT_EQ(static_cast<int64_t>(stream.size()), num_samples * kSeqLen + 1);

    // The stream is the documents of the document index, back to back.
    std::vector<int32_t> expected;
    const std::vector<std::vector<int32_t>> documents = NumberedDocuments(kLengths);
    for (const int64_t d : samples.indices().document_index) {
      expected.insert(expected.end(), documents[d].begin(), documents[d].end());
    }
    expected.resize(stream.size());
    EXPECT_EQ(stream, expected);

    // Epoch e is stream tokens [e T, (e + 1) T): every token of the range exactly once, and
    // the final epoch's covered part (up to the dropped partial sample) without repeats.
    std::vector<int32_t> range_tokens(tokens);
    std::iota(range_tokens.begin(), range_tokens.end(), documents[kRange.begin].front());
    for (int64_t e = 0; e * tokens < static_cast<int64_t>(stream.size()); ++e) {
      const auto first = stream.begin() + e * tokens;
      const auto last = stream.begin() + std::min<int64_t>((e + 1) * tokens, stream.size());
      std::vector<int32_t> epoch(first, last);
      std::sort(epoch.begin(), epoch.end());
      if (last - first == tokens) {
        EXPECT_EQ(epoch, range_tokens) << "epoch " << e;
      } else {
        EXPECT_EQ(std::adjacent_find(epoch.begin(), epoch.end()), epoch.end()) << "epoch " << e;
        EXPECT_GE(last - first, tokens - kSeqLen) << "more than a partial sample dropped";
      }
    }
  }
}

TEST(GptSamplesTest, FinalEpochIsShuffledApart) {
  // 40 samples of 8 take 321 tokens, 3 epochs of 133; samples [0, 33) end within the first 2
  // epochs (33 x 8 + 1 <= 266) and are read first, in shuffled order.
  const GptSamples samples = MustBuild(
      MakeSource(), {.documents = kRange, .seq_len = kSeqLen, .num_samples = 40, .seed = 3});
  const GptSampleIndices& indices = samples.indices();
  ASSERT_EQ(indices.num_epochs, 3);
  ASSERT_EQ(indices.separate_from, 33);
  std::vector<int64_t> first(indices.shuffle_index.begin(),
                             indices.shuffle_index.begin() + indices.separate_from);
  std::vector<int64_t> rest(indices.shuffle_index.begin() + indices.separate_from,
                            indices.shuffle_index.end());
  std::vector<int64_t> sorted_first = first, sorted_rest = rest;
  std::sort(sorted_first.begin(), sorted_first.end());
  std::sort(sorted_rest.begin(), sorted_rest.end());
  std::vector<int64_t> expected_first(indices.separate_from), expected_rest(rest.size());
  std::iota(expected_first.begin(), expected_first.end(), 0);
  std::iota(expected_rest.begin(), expected_rest.end(), indices.separate_from);
  EXPECT_EQ(sorted_first, expected_first);
  EXPECT_EQ(sorted_rest, expected_rest);
  EXPECT_NE(first, expected_first) << "not shuffled";
  EXPECT_NE(rest, expected_rest) << "not shuffled";
}

TEST(GptSamplesTest, SamplesAreReproducibleAndSeedDependent) {
  const GptSamplesSpec spec{.documents = kRange, .seq_len = kSeqLen, .num_samples = 60, .seed = 9};
  const GptSamples a = MustBuild(MakeSource(), spec);
  const GptSamples b = MustBuild(MakeSource(), spec);
  EXPECT_EQ(a.indices().document_index, b.indices().document_index);
  EXPECT_EQ(a.indices().sample_index, b.indices().sample_index);
  EXPECT_EQ(a.indices().shuffle_index, b.indices().shuffle_index);
  // Reading order and repetition change nothing: a sample is a pure function of its index.
  for (int64_t i = spec.num_samples - 1; i >= 0; --i) EXPECT_EQ(Read(a, i), Read(b, i)) << i;
  EXPECT_EQ(Read(a, 4), Read(a, 4));

  GptSamplesSpec other = spec;
  other.seed = 10;
  const GptSamples c = MustBuild(MakeSource(), other);
  EXPECT_NE(c.indices().document_index, a.indices().document_index);
  EXPECT_NE(c.indices().shuffle_index, a.indices().shuffle_index);
  int differing = 0;
  for (int64_t i = 0; i < spec.num_samples; ++i) differing += Read(a, i) != Read(c, i);
  EXPECT_GT(differing, spec.num_samples / 2);
}

TEST(GptSamplesTest, LocateNamesTheDocumentAndOffsetOfEveryToken) {
  const GptSamples samples = MustBuild(
      MakeSource(), {.documents = kRange, .seq_len = kSeqLen, .num_samples = 50, .seed = 2});
  // Token value v sits at offset v - (first token of its document) of that document.
  std::vector<int64_t> document_of, offset_of;
  for (size_t d = 0; d < kLengths.size(); ++d) {
    for (int o = 0; o < kLengths[d]; ++o) {
      document_of.push_back(static_cast<int64_t>(d));
      offset_of.push_back(o);
    }
  }
  for (int64_t i = 0; i < samples.size(); ++i) {
    const std::vector<int32_t> tokens = Read(samples, i);
    for (int64_t k = 0; k <= kSeqLen; ++k) {
      const GptSamples::TokenOrigin origin = samples.Locate(i, k);
      EXPECT_EQ(origin.document, document_of[tokens[k]]) << i << ", " << k;
      EXPECT_EQ(origin.offset, offset_of[tokens[k]]) << i << ", " << k;
    }
  }
}

TEST(GptSamplesTest, RejectsBadSpecs) {
  const auto build = [](DocumentRange range, int64_t seq_len, int64_t num_samples) {
    return GptSamples::Build(
               MakeSource("corpus-x"),
               {.documents = range, .seq_len = seq_len, .num_samples = num_samples, .seed = 1})
        .status();
  };
  ExpectInvalidArgument(build({.begin = 3, .end = 3}, 4, 10), "corpus-x");
  ExpectInvalidArgument(build({.begin = 5, .end = 2}, 4, 10), "document range [5, 2)");
  ExpectInvalidArgument(build({.begin = -1, .end = 2}, 4, 10), "document range [-1, 2)");
  ExpectInvalidArgument(build({.begin = 0, .end = 20}, 4, 10), "within its 19 documents");
  ExpectInvalidArgument(build(kRange, 0, 10), "seq_len 0");
  ExpectInvalidArgument(build(kRange, 4, -1), "num_samples -1");
  ExpectInvalidArgument(build({.begin = 1, .end = 2}, 4, 10), "hold no tokens");
  ExpectInvalidArgument(build(kRange, 1 << 20, int64_t{1} << 40), "more than");
}

// ---- Cache ------------------------------------------------------------------------------------

// A fresh directory under the test's temporary directory, removed with the fixture.
class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpt_samples_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

// The numbered documents, cached under `prefix` like a file-backed dataset.
class CachedSource : public InMemoryDocumentSource {
 public:
  CachedSource(std::string prefix, const std::vector<int>& lengths)
      : InMemoryDocumentSource(prefix, NumberedDocuments(lengths)), prefix_(std::move(prefix)) {}
  std::string cache_prefix() const override { return prefix_; }

 private:
  std::string prefix_;
};

void ExpectSameIndices(const GptSamples& a, const GptSamples& b) {
  EXPECT_EQ(a.indices().num_epochs, b.indices().num_epochs);
  EXPECT_EQ(a.indices().separate_from, b.indices().separate_from);
  EXPECT_EQ(a.indices().document_index, b.indices().document_index);
  EXPECT_EQ(a.indices().sample_index, b.indices().sample_index);
  EXPECT_EQ(a.indices().shuffle_index, b.indices().shuffle_index);
}

constexpr GptSamplesSpec kSpec{
    .documents = kRange, .seq_len = kSeqLen, .num_samples = 40, .seed = 4};

TEST(GptSamplesCacheTest, InMemorySourcesAreNotCached) {
  const GptSamples samples = MustBuild(MakeSource(), kSpec);
  EXPECT_TRUE(samples.cache_path().empty());
  EXPECT_FALSE(samples.loaded_from_cache());
}

TEST_F(CacheTest, RoundTripLoadsWhatWasBuilt) {
  const std::string prefix = dir_ + "/corpus";
  const auto source = std::make_shared<CachedSource>(prefix, kLengths);
  const GptSamples built = MustBuild(source, kSpec);
  EXPECT_FALSE(built.loaded_from_cache());
  EXPECT_THAT(built.cache_path(), MatchesRegex(".*/corpus_gpt_[0-9a-f]{16}\\.samples"));
  // Only the renamed file remains: no temporary left behind.
  EXPECT_EQ(Files(), std::vector<std::string>{
                         std::filesystem::path(built.cache_path()).filename().string()});

  const GptSamples loaded = MustBuild(source, kSpec);
  EXPECT_TRUE(loaded.loaded_from_cache());
  EXPECT_EQ(loaded.cache_path(), built.cache_path());
  ExpectSameIndices(loaded, built);
  // The cache changes nothing: the same indices as without it.
  ExpectSameIndices(loaded, MustBuild(MakeSource(prefix), kSpec));
  for (int64_t i = 0; i < kSpec.num_samples; ++i) EXPECT_EQ(Read(loaded, i), Read(built, i));
}

TEST_F(CacheTest, KeyCoversTheWholeDescription) {
  const auto source = std::make_shared<CachedSource>(dir_ + "/corpus", kLengths);
  std::vector<GptSamplesSpec> specs(5, kSpec);
  specs[1].seed += 1;
  specs[2].seq_len += 1;
  specs[3].num_samples += 1;
  specs[4].documents.end -= 1;
  std::vector<std::string> paths;
  for (const GptSamplesSpec& spec : specs) paths.push_back(MustBuild(source, spec).cache_path());
  // The same documents with other lengths, under the same name.
  std::vector<int> lengths = kLengths;
  std::swap(lengths[3], lengths[4]);
  paths.push_back(
      MustBuild(std::make_shared<CachedSource>(dir_ + "/corpus", lengths), kSpec).cache_path());
  std::vector<std::string> distinct = paths;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct.size(), paths.size());
  EXPECT_EQ(Files().size(), paths.size());
}

// Overwrites bytes of a file at `offset`; a negative offset counts from the end.
void Patch(const std::string& path, int64_t offset, const std::string& bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekp(offset, offset < 0 ? std::ios::end : std::ios::beg);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << path;
}

TEST_F(CacheTest, MismatchedOrCorruptFilesAreRebuilt) {
  const auto source = std::make_shared<CachedSource>(dir_ + "/corpus", kLengths);
  const GptSamples reference = MustBuild(MakeSource(dir_ + "/corpus"), kSpec);
  const std::string path = MustBuild(source, kSpec).cache_path();
  GptSamplesSpec other_spec = kSpec;
  other_spec.seed += 1;
  const std::string other = MustBuild(source, other_spec).cache_path();

  // Each damage is caught by a different check: magic, description (edited, or another spec's
  // file under this name), size, and values (an out-of-range shuffle entry at the file's end).
  const std::vector<std::pair<std::string, std::function<void()>>> damages = {
      {"magic", [&] { Patch(path, 0, "X"); }},
      {"description", [&] { Patch(path, 40, "#"); }},
      {"another spec",
       [&] {
         std::filesystem::copy_file(other, path, std::filesystem::copy_options::overwrite_existing);
       }},
      {"truncated",
       [&] { std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8); }},
      {"value", [&] { Patch(path, -8, std::string(8, '\x7f')); }},
  };
  for (const auto& [what, damage] : damages) {
    damage();
    const GptSamples rebuilt = MustBuild(source, kSpec);
    EXPECT_FALSE(rebuilt.loaded_from_cache()) << what;
    ExpectSameIndices(rebuilt, reference);
    // The rebuild replaced the file: the next build loads it.
    const GptSamples reloaded = MustBuild(source, kSpec);
    EXPECT_TRUE(reloaded.loaded_from_cache()) << what;
    ExpectSameIndices(reloaded, reference);
  }
}

TEST_F(CacheTest, UnwritableCacheIsAnErrorNamingTheFile) {
  const auto source = std::make_shared<CachedSource>(dir_ + "/missing/corpus", kLengths);
  const absl::Status status = GptSamples::Build(source, kSpec).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(dir_ + "/missing/corpus_gpt_"));
}

TEST_F(CacheTest, ReaderChecksDescriptionAndShape) {
  const GptSampleIndices indices{.num_epochs = 2,
                                 .separate_from = 1,
                                 .document_index = {3, 1, 2, 2, 3, 1},
                                 .sample_index = {0, 0, 1, 2, 4, 1},
                                 .shuffle_index = {0, 2, 1}};
  const GptSampleIndexShape shape{
      .num_epochs = 2, .separate_from = 1, .document_index_size = 6, .num_samples = 3};
  const std::string path = SampleIndexCachePath(dir_ + "/p", "description");
  EXPECT_EQ(ReadSampleIndexCache(path, "description", shape).status().code(),
            absl::StatusCode::kNotFound);
  NF_ASSERT_OK(WriteSampleIndexCache(path, "description", indices));

  const absl::StatusOr<GptSampleIndices> read = ReadSampleIndexCache(path, "description", shape);
  NF_ASSERT_OK(read);
  EXPECT_EQ(read->num_epochs, 2);
  EXPECT_EQ(read->separate_from, 1);
  EXPECT_EQ(read->document_index, indices.document_index);
  EXPECT_EQ(read->sample_index, indices.sample_index);
  EXPECT_EQ(read->shuffle_index, indices.shuffle_index);

  const absl::Status wrong_description = ReadSampleIndexCache(path, "descriptioN", shape).status();
  EXPECT_EQ(wrong_description.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong_description.message()), HasSubstr("description"));
  GptSampleIndexShape wrong_shape = shape;
  wrong_shape.num_samples = 4;
  const absl::Status shape_status = ReadSampleIndexCache(path, "description", wrong_shape).status();
  EXPECT_EQ(shape_status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shape_status.message()), HasSubstr("shape"));
  // The key is the description's: another description, another file.
  EXPECT_NE(SampleIndexCachePath(dir_ + "/p", "descriptioN"), path);
}

}  // namespace
}  // namespace nf::data
