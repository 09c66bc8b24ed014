// Tests of data/indexed_document_source.h on a real MMIDIDX pair written byte by byte here:
// sequences are the source's documents, splits of real documents map onto their sequences, and
// GPT sample indices over the file-backed source are cached beside PREFIX.bin/.idx, reloaded,
// and equal to those built from the same documents in memory.
#include "data/indexed_document_source.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/gpt_samples.h"
#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::testing::MatchesRegex;

template <typename T>
void Put(std::ofstream& out, T value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Writes PREFIX.bin/.idx (u16 tokens) holding `sequences`, grouped into documents by
// `document_index` (0, then the sequence count at the end of each document).
void WriteMmidIdx(const std::string& prefix, const std::vector<std::vector<int32_t>>& sequences,
                  const std::vector<int64_t>& document_index) {
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  std::vector<int64_t> pointers;
  int64_t pointer = 0;
  for (const std::vector<int32_t>& sequence : sequences) {
    pointers.push_back(pointer);
    for (const int32_t token : sequence) Put(bin, static_cast<uint16_t>(token));
    pointer += 2 * static_cast<int64_t>(sequence.size());
  }
  ASSERT_TRUE(bin.good());
  std::ofstream idx(prefix + ".idx", std::ios::binary);
  idx.write("MMIDIDX\0\0", 9);
  Put<uint64_t>(idx, 1);
  Put<uint8_t>(idx, 8);  // u16
  Put<uint64_t>(idx, sequences.size());
  Put<uint64_t>(idx, document_index.size());
  for (const std::vector<int32_t>& sequence : sequences) {
    Put<int32_t>(idx, static_cast<int32_t>(sequence.size()));
  }
  for (const int64_t p : pointers) Put<int64_t>(idx, p);
  for (const int64_t d : document_index) Put<int64_t>(idx, d);
  ASSERT_TRUE(idx.good());
}

// Sequences of these lengths whose tokens count up from 0.
std::vector<std::vector<int32_t>> NumberedSequences(const std::vector<int>& lengths) {
  std::vector<std::vector<int32_t>> sequences;
  int32_t next = 0;
  for (const int length : lengths) {
    std::vector<int32_t>& sequence = sequences.emplace_back(length);
    std::iota(sequence.begin(), sequence.end(), next);
    next += length;
  }
  return sequences;
}

class IndexedDocumentSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/indexed_document_source_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    prefix_ = dir_ + "/corpus";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<IndexedDocumentSource> Open() {
    absl::StatusOr<std::shared_ptr<IndexedDocumentSource>> source =
        IndexedDocumentSource::Open(prefix_);
    NF_EXPECT_OK(source);
    if (!source.ok()) std::abort();
    return *source;
  }

  std::string dir_, prefix_;
};

const std::vector<int> kLengths = {9, 4, 15, 1, 7, 12, 3, 20, 6, 11};

TEST_F(IndexedDocumentSourceTest, SequencesAreDocumentsAndSplitsFollowTheDocumentIndex) {
  // Ten sequences in four documents: [0, 3), [3, 4), [4, 8), [8, 10).
  const std::vector<std::vector<int32_t>> sequences = NumberedSequences(kLengths);
  WriteMmidIdx(prefix_, sequences, {0, 3, 4, 8, 10});
  const std::shared_ptr<IndexedDocumentSource> source = Open();
  EXPECT_EQ(source->name(), prefix_);
  EXPECT_EQ(source->cache_prefix(), prefix_);
  ASSERT_EQ(source->num_documents(), 10);
  for (int64_t d = 0; d < source->num_documents(); ++d) {
    ASSERT_EQ(source->document_length(d), kLengths[d]);
    std::vector<int32_t> tokens(kLengths[d] - 1);
    source->ReadTokens(d, 1, kLengths[d] - 1, tokens.data());
    EXPECT_EQ(tokens, std::vector<int32_t>(sequences[d].begin() + 1, sequences[d].end()));
  }

  const auto sequences_of = [&](int64_t begin, int64_t end) {
    absl::StatusOr<DocumentRange> range = source->SequencesOf({.begin = begin, .end = end});
    NF_EXPECT_OK(range);
    return range.ok() ? *range : DocumentRange{.begin = -1, .end = -1};
  };
  EXPECT_EQ(sequences_of(0, 4), (DocumentRange{.begin = 0, .end = 10}));
  EXPECT_EQ(sequences_of(1, 3), (DocumentRange{.begin = 3, .end = 8}));
  EXPECT_EQ(sequences_of(2, 2), (DocumentRange{.begin = 4, .end = 4}));
  ExpectInvalidArgument(source->SequencesOf({.begin = 3, .end = 5}).status(),
                        "document range [3, 5) is not within the 4 documents of " + prefix_);
  ExpectInvalidArgument(source->SequencesOf({.begin = 2, .end = 1}).status(), "[2, 1)");
}

TEST_F(IndexedDocumentSourceTest, SampleIndicesAreCachedBesideTheData) {
  const std::vector<std::vector<int32_t>> sequences = NumberedSequences(kLengths);
  std::vector<int64_t> one_per_document(kLengths.size() + 1);
  std::iota(one_per_document.begin(), one_per_document.end(), 0);
  WriteMmidIdx(prefix_, sequences, one_per_document);
  const GptSamplesSpec spec{
      .documents = {.begin = 1, .end = 9}, .seq_len = 5, .num_samples = 30, .seed = 8};

  absl::StatusOr<GptSamples> built = GptSamples::Build(Open(), spec);
  NF_ASSERT_OK(built);
  EXPECT_FALSE(built->loaded_from_cache());
  EXPECT_THAT(built->cache_path(), MatchesRegex(prefix_ + "_gpt_[0-9a-f]{16}\\.samples"));
  EXPECT_TRUE(std::filesystem::exists(built->cache_path()));

  // Another run (a fresh mapping of the files) loads the indices instead of building them.
  absl::StatusOr<GptSamples> loaded = GptSamples::Build(Open(), spec);
  NF_ASSERT_OK(loaded);
  EXPECT_TRUE(loaded->loaded_from_cache());

  // The same documents in memory give the same samples.
  absl::StatusOr<GptSamples> in_memory =
      GptSamples::Build(std::make_shared<InMemoryDocumentSource>("memory", sequences), spec);
  NF_ASSERT_OK(in_memory);
  for (int64_t i = 0; i < spec.num_samples; ++i) {
    std::vector<int32_t> a(spec.seq_len + 1), b(spec.seq_len + 1), c(spec.seq_len + 1);
    built->Sample(i, a.data());
    loaded->Sample(i, b.data());
    in_memory->Sample(i, c.data());
    EXPECT_EQ(a, c) << i;
    EXPECT_EQ(b, c) << i;
  }
}

}  // namespace
}  // namespace nf::data
