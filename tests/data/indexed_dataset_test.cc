// Tests of data/indexed_dataset.h: the writer's bytes equal layouts spelled out by hand from the
// MMIDIDX specification (both dtypes); a pair written field by field with fwrite (as Megatron's
// and fairseq's writers lay it out, several sequences per document) reads back; random datasets
// round-trip; every malformed input is rejected at Open with one line naming the file and the
// problem; and the writer never leaves a PREFIX.bin/.idx (or temporaries) unless Finish()
// succeeded.
#include "data/indexed_dataset.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/mapped_file.h"
#include "test_util.h"

namespace nf::data {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Bytes = std::vector<uint8_t>;

// A fresh directory under the test temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = ::testing::TempDir() + "nf_indexed_dataset_test_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }

  std::string Prefix(const std::string& name) const { return (path_ / name).string(); }
  // The names of the files in the directory.
  std::set<std::string> Files() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

 private:
  std::filesystem::path path_;
};

Bytes ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFileBytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

IndexedDatasetWriter MakeWriter(const std::string& prefix, TokenDType dtype) {
  absl::StatusOr<IndexedDatasetWriter> writer = IndexedDatasetWriter::Create(prefix, dtype);
  NF_EXPECT_OK(writer);
  if (!writer.ok()) std::abort();
  return *std::move(writer);
}

void WriteDataset(const std::string& prefix, TokenDType dtype,
                  const std::vector<std::vector<int32_t>>& documents) {
  IndexedDatasetWriter writer = MakeWriter(prefix, dtype);
  for (const auto& document : documents) NF_ASSERT_OK(writer.AddDocument(document));
  NF_ASSERT_OK(writer.Finish());
}

std::unique_ptr<IndexedDataset> OpenOrDie(const std::string& prefix) {
  absl::StatusOr<std::unique_ptr<IndexedDataset>> dataset = IndexedDataset::Open(prefix);
  NF_EXPECT_OK(dataset);
  if (!dataset.ok()) std::abort();
  return *std::move(dataset);
}

std::vector<int32_t> Sequence(const IndexedDataset& dataset, int64_t i) {
  std::vector<int32_t> tokens(dataset.sequence_length(i), -7);
  dataset.ReadTokens(i, 0, dataset.sequence_length(i), tokens.data());
  return tokens;
}

// Expects `dataset` to hold exactly `sequences`, one per document.
void ExpectHolds(const IndexedDataset& dataset,
                 const std::vector<std::vector<int32_t>>& sequences) {
  ASSERT_EQ(dataset.num_sequences(), static_cast<int64_t>(sequences.size()));
  ASSERT_EQ(dataset.num_documents(), static_cast<int64_t>(sequences.size()));
  int64_t total = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    EXPECT_EQ(Sequence(dataset, static_cast<int64_t>(i)), sequences[i]) << "sequence " << i;
    EXPECT_EQ(dataset.document_index()[i], static_cast<int64_t>(i));
    total += static_cast<int64_t>(sequences[i].size());
  }
  EXPECT_EQ(dataset.document_index().back(), static_cast<int64_t>(sequences.size()));
  EXPECT_EQ(dataset.total_tokens(), total);
}

// ---- The byte layout, by hand --------------------------------------------------------------

// Documents {0x0102, 2, 0x1234}, {65535}, {} as uint16 (code 8).
TEST(IndexedDatasetFormatTest, U16WriterBytesMatchTheSpecification) {
  const Bytes expected_idx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
      1,   0,   0,   0,   0,   0,   0,   0,     // version 1 (u64)
      8,                                        // dtype code 8: uint16
      3,   0,   0,   0,   0,   0,   0,   0,     // 3 sequences (u64)
      4,   0,   0,   0,   0,   0,   0,   0,     // 4 document index entries (u64)
      3,   0,   0,   0,                         // lengths (i32): 3
      1,   0,   0,   0,                         //   1
      0,   0,   0,   0,                         //   0
      0,   0,   0,   0,   0,   0,   0,   0,     // pointers (i64): byte 0
      6,   0,   0,   0,   0,   0,   0,   0,     //   byte 6
      8,   0,   0,   0,   0,   0,   0,   0,     //   byte 8
      0,   0,   0,   0,   0,   0,   0,   0,     // document index (i64): 0
      1,   0,   0,   0,   0,   0,   0,   0,     //   1
      2,   0,   0,   0,   0,   0,   0,   0,     //   2
      3,   0,   0,   0,   0,   0,   0,   0,     //   3
  };
  const Bytes expected_bin = {0x02, 0x01, 0x02, 0x00, 0x34, 0x12, 0xFF, 0xFF};
  const std::vector<std::vector<int32_t>> documents = {{0x0102, 2, 0x1234}, {65535}, {}};

  ScratchDir dir;
  const std::string prefix = dir.Prefix("u16");
  WriteDataset(prefix, TokenDType::kU16, documents);
  EXPECT_EQ(ReadFileBytes(prefix + ".idx"), expected_idx);
  EXPECT_EQ(ReadFileBytes(prefix + ".bin"), expected_bin);
  EXPECT_EQ(dir.Files(), (std::set<std::string>{"u16.bin", "u16.idx"}));

  const auto dataset = OpenOrDie(prefix);
  EXPECT_EQ(dataset->dtype(), TokenDType::kU16);
  EXPECT_EQ(dataset->prefix(), prefix);
  ExpectHolds(*dataset, documents);
}

// Documents {0x01020304, -1}, {70000} as int32 (code 4).
TEST(IndexedDatasetFormatTest, I32WriterBytesMatchTheSpecification) {
  const Bytes expected_idx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
      1,   0,   0,   0,   0,   0,   0,   0,     // version 1
      4,                                        // dtype code 4: int32
      2,   0,   0,   0,   0,   0,   0,   0,     // 2 sequences
      3,   0,   0,   0,   0,   0,   0,   0,     // 3 document index entries
      2,   0,   0,   0,                         // lengths: 2
      1,   0,   0,   0,                         //   1
      0,   0,   0,   0,   0,   0,   0,   0,     // pointers: byte 0
      8,   0,   0,   0,   0,   0,   0,   0,     //   byte 8
      0,   0,   0,   0,   0,   0,   0,   0,     // document index: 0
      1,   0,   0,   0,   0,   0,   0,   0,     //   1
      2,   0,   0,   0,   0,   0,   0,   0,     //   2
  };
  const Bytes expected_bin = {0x04, 0x03, 0x02, 0x01, 0xFF, 0xFF,
                              0xFF, 0xFF, 0x70, 0x11, 0x01, 0x00};
  const std::vector<std::vector<int32_t>> documents = {{0x01020304, -1}, {70000}};

  ScratchDir dir;
  const std::string prefix = dir.Prefix("i32");
  WriteDataset(prefix, TokenDType::kI32, documents);
  EXPECT_EQ(ReadFileBytes(prefix + ".idx"), expected_idx);
  EXPECT_EQ(ReadFileBytes(prefix + ".bin"), expected_bin);

  const auto dataset = OpenOrDie(prefix);
  EXPECT_EQ(dataset->dtype(), TokenDType::kI32);
  ExpectHolds(*dataset, documents);
}

// Documents {}, {7, 8}, {}, {}, {9}, {} with the empty ones added as Megatron's
// IndexedDatasetBuilder.add_document([], []) records them: no sequence, and a document index
// entry that repeats the sequence count at that point (add_document appends
// len(sequence_lengths) after extending it by nothing).
TEST(IndexedDatasetFormatTest, EmptyDocumentsAreIndexEntriesWithoutSequences) {
  const Bytes expected_idx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
      1,   0,   0,   0,   0,   0,   0,   0,     // version 1
      8,                                        // dtype code 8: uint16
      2,   0,   0,   0,   0,   0,   0,   0,     // 2 sequences: only the non-empty documents
      7,   0,   0,   0,   0,   0,   0,   0,     // 7 document index entries: 6 documents + 1
      2,   0,   0,   0,                         // lengths: 2
      1,   0,   0,   0,                         //   1
      0,   0,   0,   0,   0,   0,   0,   0,     // pointers: byte 0
      4,   0,   0,   0,   0,   0,   0,   0,     //   byte 4
      0,   0,   0,   0,   0,   0,   0,   0,     // document index: 0
      0,   0,   0,   0,   0,   0,   0,   0,     //   0 (empty)
      1,   0,   0,   0,   0,   0,   0,   0,     //   1 ({7, 8})
      1,   0,   0,   0,   0,   0,   0,   0,     //   1 (empty)
      1,   0,   0,   0,   0,   0,   0,   0,     //   1 (empty)
      2,   0,   0,   0,   0,   0,   0,   0,     //   2 ({9})
      2,   0,   0,   0,   0,   0,   0,   0,     //   2 (empty)
  };
  ScratchDir dir;
  const std::string prefix = dir.Prefix("empties");
  IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kU16);
  NF_ASSERT_OK(writer.AddEmptyDocument());
  NF_ASSERT_OK(writer.AddDocument(std::vector<int32_t>{7, 8}));
  NF_ASSERT_OK(writer.AddEmptyDocument());
  NF_ASSERT_OK(writer.AddEmptyDocument());
  NF_ASSERT_OK(writer.AddDocument(std::vector<int32_t>{9}));
  NF_ASSERT_OK(writer.AddEmptyDocument());
  NF_ASSERT_OK(writer.Finish());
  EXPECT_EQ(writer.AddEmptyDocument().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFileBytes(prefix + ".idx"), expected_idx);
  EXPECT_EQ(ReadFileBytes(prefix + ".bin"), (Bytes{7, 0, 8, 0, 9, 0}));

  const auto dataset = OpenOrDie(prefix);
  EXPECT_EQ(dataset->num_sequences(), 2);
  EXPECT_EQ(dataset->num_documents(), 6);
  EXPECT_EQ(dataset->document_index(), (std::vector<int64_t>{0, 0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(Sequence(*dataset, 1), (std::vector<int32_t>{9}));
}

TEST(IndexedDatasetFormatTest, EmptyDatasetIsHeaderAndALoneZero) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("empty");
  WriteDataset(prefix, TokenDType::kU16, {});
  EXPECT_EQ(ReadFileBytes(prefix + ".idx"),
            (Bytes{'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0,
                   0,   0,   0,   0,   0,   1,   0,   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_TRUE(ReadFileBytes(prefix + ".bin").empty());
  const auto dataset = OpenOrDie(prefix);
  EXPECT_EQ(dataset->num_sequences(), 0);
  EXPECT_EQ(dataset->num_documents(), 0);
  EXPECT_EQ(dataset->total_tokens(), 0);
  EXPECT_EQ(dataset->document_index(), std::vector<int64_t>{0});
}

// ---- A pair written by an independent writer -------------------------------------------------

// Writes the fields one fwrite each, the way the Python writers struct.pack and tobytes()
// them; documents may span several sequences (Megatron's sentence-split datasets do).
template <typename Token>
void FwritePair(const std::string& prefix, uint8_t code,
                const std::vector<std::vector<int32_t>>& sequences,
                const std::vector<int64_t>& document_index) {
  std::FILE* bin = std::fopen((prefix + ".bin").c_str(), "wb");
  ASSERT_NE(bin, nullptr);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  int64_t pointer = 0;
  for (const auto& sequence : sequences) {
    for (int32_t token : sequence) {
      const auto value = static_cast<Token>(token);
      ASSERT_EQ(std::fwrite(&value, sizeof(value), 1, bin), 1u);
    }
    lengths.push_back(static_cast<int32_t>(sequence.size()));
    pointers.push_back(pointer);
    pointer += static_cast<int64_t>(sequence.size() * sizeof(Token));
  }
  ASSERT_EQ(std::fclose(bin), 0);

  std::FILE* idx = std::fopen((prefix + ".idx").c_str(), "wb");
  ASSERT_NE(idx, nullptr);
  ASSERT_EQ(std::fwrite("MMIDIDX\0\0", 1, 9, idx), 9u);
  const uint64_t version = 1, sequence_count = sequences.size(),
                 document_count = document_index.size();
  ASSERT_EQ(std::fwrite(&version, 8, 1, idx), 1u);
  ASSERT_EQ(std::fwrite(&code, 1, 1, idx), 1u);
  ASSERT_EQ(std::fwrite(&sequence_count, 8, 1, idx), 1u);
  ASSERT_EQ(std::fwrite(&document_count, 8, 1, idx), 1u);
  ASSERT_EQ(std::fwrite(lengths.data(), 4, lengths.size(), idx), lengths.size());
  ASSERT_EQ(std::fwrite(pointers.data(), 8, pointers.size(), idx), pointers.size());
  ASSERT_EQ(std::fwrite(document_index.data(), 8, document_index.size(), idx),
            document_index.size());
  ASSERT_EQ(std::fclose(idx), 0);
}

TEST(IndexedDatasetFormatTest, ReadsAPairWrittenFieldByField) {
  const std::vector<std::vector<int32_t>> sequences = {{5, 6, 7}, {65535, 0},      {},
                                                       {100},     {1, 2, 3, 4, 5}, {42}};
  // Three documents: sequences [0, 2), [2, 3), [3, 6), and an empty one at the end.
  const std::vector<int64_t> document_index = {0, 2, 3, 6, 6};
  ScratchDir dir;
  for (const TokenDType dtype : {TokenDType::kU16, TokenDType::kI32}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const std::string prefix = dir.Prefix(absl::StrCat("fwrite", static_cast<int>(dtype)));
    if (dtype == TokenDType::kU16) {
      FwritePair<uint16_t>(prefix, 8, sequences, document_index);
    } else {
      FwritePair<int32_t>(prefix, 4, sequences, document_index);
    }
    const auto dataset = OpenOrDie(prefix);
    EXPECT_EQ(dataset->dtype(), dtype);
    ASSERT_EQ(dataset->num_sequences(), 6);
    EXPECT_EQ(dataset->num_documents(), 4);
    EXPECT_EQ(dataset->document_index(), document_index);
    EXPECT_EQ(dataset->total_tokens(), 12);
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(dataset->sequence_length(i), static_cast<int64_t>(sequences[i].size()));
      EXPECT_EQ(Sequence(*dataset, i), sequences[i]) << "sequence " << i;
    }
    // A window inside a sequence.
    std::vector<int32_t> window(3);
    dataset->ReadTokens(4, 1, 3, window.data());
    EXPECT_EQ(window, (std::vector<int32_t>{2, 3, 4}));
  }
}

// ---- Round trip ------------------------------------------------------------------------------

TEST(IndexedDatasetRoundTripTest, RandomDocumentsBothDTypes) {
  ScratchDir dir;
  std::mt19937 rng(20240601);
  for (const TokenDType dtype : {TokenDType::kU16, TokenDType::kI32}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    std::uniform_int_distribution<int32_t> token =
        dtype == TokenDType::kU16
            ? std::uniform_int_distribution<int32_t>(0, 65535)
            : std::uniform_int_distribution<int32_t>(std::numeric_limits<int32_t>::min(),
                                                     std::numeric_limits<int32_t>::max());
    std::uniform_int_distribution<int> length(0, 700);
    std::vector<std::vector<int32_t>> documents(1500);
    for (auto& document : documents) {
      document.resize(length(rng));
      for (int32_t& t : document) t = token(rng);
    }
    // One document longer than the writer's 1 MiB write chunk, and the extremes of the range.
    documents[700].resize(400000);
    for (int32_t& t : documents[700]) t = token(rng);
    documents[3] = dtype == TokenDType::kU16
                       ? std::vector<int32_t>{0, 65535}
                       : std::vector<int32_t>{std::numeric_limits<int32_t>::min(),
                                              std::numeric_limits<int32_t>::max()};

    const std::string prefix = dir.Prefix(absl::StrCat("random", static_cast<int>(dtype)));
    WriteDataset(prefix, dtype, documents);
    const auto dataset = OpenOrDie(prefix);
    EXPECT_EQ(dataset->dtype(), dtype);
    ExpectHolds(*dataset, documents);

    // Windows at random offsets read the same tokens as whole sequences.
    std::vector<int32_t> window;
    for (int trial = 0; trial < 200; ++trial) {
      const auto i = std::uniform_int_distribution<int64_t>(0, 1499)(rng);
      const int64_t n = dataset->sequence_length(i);
      const auto offset = std::uniform_int_distribution<int64_t>(0, n)(rng);
      const auto count = std::uniform_int_distribution<int64_t>(0, n - offset)(rng);
      window.assign(count, -7);
      dataset->ReadTokens(i, offset, count, window.data());
      EXPECT_TRUE(std::equal(window.begin(), window.end(), documents[i].begin() + offset));
    }
  }
}

// ---- Malformed inputs ------------------------------------------------------------------------

// The fields of an .idx, to be spoiled one at a time.
struct IdxFields {
  std::string magic{"MMIDIDX\0\0", 9};
  uint64_t version = 1;
  uint8_t code = 8;
  uint64_t sequence_count = 3;
  uint64_t document_count = 4;
  std::vector<int32_t> lengths = {3, 1, 2};
  std::vector<int64_t> pointers = {0, 6, 8};
  std::vector<int64_t> document_index = {0, 1, 2, 3};
};

void PutLittleEndian(Bytes* out, uint64_t value, int bytes) {
  for (int b = 0; b < bytes; ++b) out->push_back(static_cast<uint8_t>(value >> (8 * b)));
}

Bytes Serialize(const IdxFields& f) {
  Bytes out(f.magic.begin(), f.magic.end());
  PutLittleEndian(&out, f.version, 8);
  out.push_back(f.code);
  PutLittleEndian(&out, f.sequence_count, 8);
  PutLittleEndian(&out, f.document_count, 8);
  for (int32_t v : f.lengths) PutLittleEndian(&out, static_cast<uint32_t>(v), 4);
  for (int64_t v : f.pointers) PutLittleEndian(&out, static_cast<uint64_t>(v), 8);
  for (int64_t v : f.document_index) PutLittleEndian(&out, static_cast<uint64_t>(v), 8);
  return out;
}

// The .bin that goes with the default IdxFields: 3 + 1 + 2 uint16 tokens.
const Bytes kValidBin = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0};

struct BadCase {
  std::string name;
  std::function<void(IdxFields*)> spoil_fields;  // applied before serializing
  std::function<void(Bytes* idx, Bytes* bin)> spoil_bytes;
  absl::StatusCode code;
  std::string file;     // ".idx" or ".bin": the file the message must name
  std::string problem;  // what the message must say
};

// Cases spoil either the fields or the serialized bytes; kKeep leaves the other alone.
const auto kKeepFields = [](IdxFields*) {};
const auto kKeepBytes = [](Bytes*, Bytes*) {};
constexpr auto kCorrupt = absl::StatusCode::kDataLoss;

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases = {
      {.name = "missing_idx",
       .spoil_fields = kKeepFields,
       .spoil_bytes = kKeepBytes,
       .code = absl::StatusCode::kNotFound,
       .file = ".idx",
       .problem = "No such file"},
      {.name = "missing_bin",
       .spoil_fields = kKeepFields,
       .spoil_bytes = kKeepBytes,
       .code = absl::StatusCode::kNotFound,
       .file = ".bin",
       .problem = "No such file"},
  };
  // The rest are all corruptions; (name, spoil fields, spoil bytes, file, problem).
  auto add = [&cases](std::string name, std::function<void(IdxFields*)> spoil_fields,
                      std::function<void(Bytes*, Bytes*)> spoil_bytes, std::string file,
                      std::string problem) {
    cases.push_back({.name = std::move(name),
                     .spoil_fields = std::move(spoil_fields),
                     .spoil_bytes = std::move(spoil_bytes),
                     .code = kCorrupt,
                     .file = std::move(file),
                     .problem = std::move(problem)});
  };
  add(
      "empty_idx", kKeepFields, [](Bytes* idx, Bytes*) { idx->clear(); }, ".idx",
      "the file is 0 bytes, shorter than the 34-byte header");
  add(
      "idx_shorter_than_header", kKeepFields, [](Bytes* idx, Bytes*) { idx->resize(33); }, ".idx",
      "the file is 33 bytes, shorter than the 34-byte header");
  // The valid .idx is 34 + 3 * 12 + 4 * 8 = 102 bytes.
  add(
      "truncated_idx", kKeepFields,
      [](Bytes* idx, Bytes*) { idx->erase(idx->end() - 8, idx->end()); }, ".idx",
      "the file is 94 bytes, expected exactly 102");
  add(
      "idx_with_trailing_bytes", kKeepFields, [](Bytes* idx, Bytes*) { idx->push_back(0); }, ".idx",
      "the file is 103 bytes, expected exactly 102");
  add(
      "multimodal_modes", kKeepFields,
      [](Bytes* idx, Bytes*) {
        idx->insert(idx->end(), {0, 0, 0});
      },
      ".idx", "multimodal sequence modes are not supported");
  add(
      "truncated_bin", kKeepFields, [](Bytes*, Bytes* bin) { bin->pop_back(); }, ".bin",
      "sequence 2 (byte offset 8, 2 tokens) runs past the end of the 11-byte");
  add(
      "empty_bin", kKeepFields, [](Bytes*, Bytes* bin) { bin->clear(); }, ".bin",
      "sequence 0 (byte offset 0, 3 tokens) runs past the end of the 0-byte");
  add(
      "bin_with_trailing_bytes", kKeepFields, [](Bytes*, Bytes* bin) { bin->push_back(9); }, ".bin",
      "the file is 13 bytes but");
  add(
      "wrong_magic", [](IdxFields* f) { f->magic[0] = 'X'; }, kKeepBytes, ".idx",
      "wrong magic \"XMIDIDX\\x00\\x00\"");
  // fairseq's older, non-mmap IndexedDataset.
  add(
      "tntidx_magic", [](IdxFields* f) { f->magic = std::string("TNTIDX\0\0\0", 9); }, kKeepBytes,
      ".idx", "wrong magic");
  add(
      "wrong_version", [](IdxFields* f) { f->version = 2; }, kKeepBytes, ".idx",
      "version 2, expected 1");
  add(
      "dtype_code_zero", [](IdxFields* f) { f->code = 0; }, kKeepBytes, ".idx",
      "unknown dtype code 0");
  add(
      "dtype_code_out_of_range", [](IdxFields* f) { f->code = 9; }, kKeepBytes, ".idx",
      "unknown dtype code 9");
  add(
      "dtype_code_255", [](IdxFields* f) { f->code = 255; }, kKeepBytes, ".idx",
      "unknown dtype code 255");
  add(
      "dtype_f32_unsupported", [](IdxFields* f) { f->code = 7; }, kKeepBytes, ".idx",
      "dtype code 7 (float32) is not supported");
  add(
      "dtype_i64_unsupported", [](IdxFields* f) { f->code = 5; }, kKeepBytes, ".idx",
      "dtype code 5 (int64) is not supported");
  add(
      "negative_length", [](IdxFields* f) { f->lengths[1] = -1; }, kKeepBytes, ".idx",
      "sequence 1 has negative length -1");
  add(
      "pointer_past_the_end", [](IdxFields* f) { f->pointers[2] = int64_t{1} << 40; }, kKeepBytes,
      ".bin", "sequence 2 (byte offset 1099511627776, 2 tokens) runs past the end");
  add(
      "pointer_at_int64_max",
      [](IdxFields* f) { f->pointers[2] = std::numeric_limits<int64_t>::max(); }, kKeepBytes,
      ".bin", "runs past the end");
  add(
      "negative_pointer", [](IdxFields* f) { f->pointers[1] = -2; }, kKeepBytes, ".bin",
      "sequence 1 (byte offset -2, 1 tokens) runs past the end");
  add(
      "length_past_the_end", [](IdxFields* f) { f->lengths[2] = 0x7FFFFFFF; }, kKeepBytes, ".bin",
      "sequence 2 (byte offset 8, 2147483647 tokens) runs past the end");
  add(
      "pointers_not_contiguous",
      [](IdxFields* f) {
        f->lengths = {3, 1, 1};
        f->pointers = {0, 8, 10};
      },
      kKeepBytes, ".idx", "sequence 1 starts at byte 8, expected 6");
  add(
      "pointers_overlap", [](IdxFields* f) { f->pointers[1] = 4; }, kKeepBytes, ".idx",
      "sequence 1 starts at byte 4, expected 6");
  add(
      "huge_sequence_count",
      [](IdxFields* f) { f->sequence_count = std::numeric_limits<uint64_t>::max(); }, kKeepBytes,
      ".idx", "sequence count 18446744073709551615 and document count 4 need more");
  add(
      "huge_document_count",
      [](IdxFields* f) { f->document_count = std::numeric_limits<uint64_t>::max(); }, kKeepBytes,
      ".idx", "sequence count 3 and document count 18446744073709551615 need more");
  // 12 * S is 8 modulo 2^64: a size computed carelessly would match the 50-byte file.
  add(
      "sequence_count_wrapping_the_size",
      [](IdxFields* f) {
        f->sequence_count = 1537228672809129302u;
        f->document_count = 1;
        f->lengths = {};
        f->pointers = {};
        f->document_index = {0, 0};
      },
      kKeepBytes, ".idx", "sequence count 1537228672809129302 and document count 1 need more");
  // 8 * D is 0 modulo 2^64.
  add(
      "document_count_wrapping_the_size",
      [](IdxFields* f) {
        f->document_count = uint64_t{1} << 61;
        f->document_index = {};
      },
      kKeepBytes, ".idx", "document count 2305843009213693952 need more");
  add(
      "empty_document_index",
      [](IdxFields* f) {
        f->document_count = 0;
        f->document_index = {};
      },
      kKeepBytes, ".idx", "the document index is empty");
  add(
      "document_index_not_starting_at_zero",
      [](IdxFields* f) {
        f->document_index = {1, 1, 2, 3};
      },
      kKeepBytes, ".idx", "document index starts at 1, expected 0");
  add(
      "document_index_decreasing",
      [](IdxFields* f) {
        f->document_index = {0, 2, 1, 3};
      },
      kKeepBytes, ".idx", "document index decreases at entry 2 (2 then 1)");
  add(
      "document_index_negative",
      [](IdxFields* f) {
        f->document_index = {0, -1, 2, 3};
      },
      kKeepBytes, ".idx", "document index decreases at entry 1 (0 then -1)");
  add(
      "document_index_short_of_the_count",
      [](IdxFields* f) {
        f->document_index = {0, 1, 2, 2};
      },
      kKeepBytes, ".idx", "document index ends at 2, expected the sequence count 3");
  add(
      "document_index_past_the_count",
      [](IdxFields* f) {
        f->document_index = {0, 1, 2, 4};
      },
      kKeepBytes, ".idx", "document index ends at 4, expected the sequence count 3");
  return cases;
}

// gtest prints parameters; the name says it all (the default would dump the object's bytes).
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class IndexedDatasetBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(IndexedDatasetBadInputTest, RejectedAtOpenWithOneLineNamingFileAndProblem) {
  const BadCase& c = GetParam();
  ScratchDir dir;
  const std::string prefix = dir.Prefix("bad");
  IdxFields fields;
  c.spoil_fields(&fields);
  Bytes idx = Serialize(fields);
  Bytes bin = kValidBin;
  c.spoil_bytes(&idx, &bin);
  if (c.name != "missing_idx") WriteFileBytes(prefix + ".idx", idx);
  if (c.name != "missing_bin") WriteFileBytes(prefix + ".bin", bin);

  absl::StatusOr<std::unique_ptr<IndexedDataset>> dataset = IndexedDataset::Open(prefix);
  ASSERT_FALSE(dataset.ok());
  const std::string message(dataset.status().message());
  EXPECT_EQ(dataset.status().code(), c.code) << message;
  EXPECT_THAT(message, HasSubstr(prefix + c.file)) << "must name the file";
  EXPECT_THAT(message, HasSubstr(c.problem));
  EXPECT_THAT(message, Not(HasSubstr("\n")));
}

INSTANTIATE_TEST_SUITE_P(Table, IndexedDatasetBadInputTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

// The unspoiled fields open: the table's cases fail for the reason they name, not another.
TEST(IndexedDatasetBadInputBaseline, UnspoiledFieldsOpen) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("good");
  WriteFileBytes(prefix + ".idx", Serialize(IdxFields{}));
  WriteFileBytes(prefix + ".bin", kValidBin);
  const auto dataset = OpenOrDie(prefix);
  ExpectHolds(*dataset, {{1, 2, 3}, {4}, {5, 6}});
}

TEST(IndexedDatasetBadInputBaseline, DirectoryInsteadOfIdx) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("dir");
  std::filesystem::create_directory(prefix + ".idx");
  WriteFileBytes(prefix + ".bin", kValidBin);
  absl::StatusOr<std::unique_ptr<IndexedDataset>> dataset = IndexedDataset::Open(prefix);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(std::string(dataset.status().message()),
              HasSubstr(prefix + ".idx: not a regular file"));
}

// ---- A file truncated under the reader ------------------------------------------------------

// Two documents of 40,000 u16 tokens: the .bin is 160,000 bytes, the second document starts at
// byte 80,000 and mostly lies in pages that no longer exist once the file is cut at the first
// page boundary after the first document.
off_t CutAfterFirstDocument() {
  const off_t page = ::sysconf(_SC_PAGESIZE);
  return (80000 / page + 1) * page;
}

std::string WriteTwoLongDocuments(const ScratchDir& dir) {
  const std::string prefix = dir.Prefix("long");
  WriteDataset(prefix, TokenDType::kU16,
               {std::vector<int32_t>(40000, 5), std::vector<int32_t>(40000, 6)});
  return prefix;
}

TEST(IndexedDatasetTruncatedTest, ReadingPastTheNewEndIsOneLineNamingTheFile) {
  ScratchDir dir;
  const std::string prefix = WriteTwoLongDocuments(dir);
  const std::unique_ptr<IndexedDataset> dataset = OpenOrDie(prefix);
  // What another program (an nf-preprocess writing the same prefix, a copy) does to the file.
  ASSERT_EQ(::truncate((prefix + ".bin").c_str(), CutAfterFirstDocument()), 0);
  EXPECT_EQ(Sequence(*dataset, 0), std::vector<int32_t>(40000, 5));  // still all there
  // Without the handler the process dies of SIGBUS without a word.
  EXPECT_EXIT(
      Sequence(*dataset, 1), ::testing::ExitedWithCode(kMappedFileTruncatedExitCode),
      ::testing::ContainsRegex("^[^\n]*" + prefix +
                               ".bin was truncated or replaced while this process was reading "
                               "it \\(SIGBUS at byte " +
                               std::to_string(CutAfterFirstDocument()) +
                               " of the 160000 bytes it had when opened\\); restore the "
                               "file[^\n]*\n$"));
}

TEST(IndexedDatasetTruncatedTest, OtherSigbusGoesToThePreviousHandler) {
  ScratchDir dir;
  const std::unique_ptr<IndexedDataset> dataset = OpenOrDie(WriteTwoLongDocuments(dir));
  // The handler that was there before ours takes it: the default action, or AddressSanitizer's
  // report in the sanitizer build (which installs its own SIGBUS handler first).
#ifdef __SANITIZE_ADDRESS__
  EXPECT_EXIT(::raise(SIGBUS), ::testing::ExitedWithCode(1), "AddressSanitizer: BUS");
#else
  EXPECT_EXIT(::raise(SIGBUS), ::testing::KilledBySignal(SIGBUS), "");
#endif
}

TEST(IndexedDatasetTruncatedTest, ClosedDatasetsAreForgotten) {
  ScratchDir dir;
  const std::string prefix = WriteTwoLongDocuments(dir);
  // Mapping and unmapping many times must not fill the handler's table of mappings.
  for (int i = 0; i < 5000; ++i) OpenOrDie(prefix);
  const std::unique_ptr<IndexedDataset> dataset = OpenOrDie(prefix);
  ASSERT_EQ(::truncate((prefix + ".bin").c_str(), CutAfterFirstDocument()), 0);
  EXPECT_EXIT(Sequence(*dataset, 1), ::testing::ExitedWithCode(kMappedFileTruncatedExitCode),
              ::testing::HasSubstr(prefix + ".bin was truncated"));
}

// ---- Writer ----------------------------------------------------------------------------------

TEST(IndexedDatasetWriterTest, NothingAppearsWithoutFinish) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("unfinished");
  {
    IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kU16);
    NF_ASSERT_OK(writer.AddDocument(std::vector<int32_t>{1, 2, 3}));
    // Work in progress lives under temporary names only.
    for (const std::string& name : dir.Files()) {
      EXPECT_THAT(name, HasSubstr(".tmp-"));
      EXPECT_NE(name, "unfinished.bin");
      EXPECT_NE(name, "unfinished.idx");
    }
  }
  EXPECT_TRUE(dir.Files().empty()) << "temporaries left behind";
  EXPECT_EQ(IndexedDataset::Open(prefix).status().code(), absl::StatusCode::kNotFound);
}

TEST(IndexedDatasetWriterTest, ExistingPairIsReplacedOnlyAtFinish) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("pair");
  const std::vector<std::vector<int32_t>> old_documents = {{1, 2}, {3}};
  const std::vector<std::vector<int32_t>> new_documents = {{7, 8, 9, 10}, {}, {11}};
  WriteDataset(prefix, TokenDType::kU16, old_documents);

  // An abandoned rewrite leaves the old pair as it was.
  {
    IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kI32);
    for (const auto& d : new_documents) NF_ASSERT_OK(writer.AddDocument(d));
    ExpectHolds(*OpenOrDie(prefix), old_documents);
  }
  EXPECT_EQ(dir.Files(), (std::set<std::string>{"pair.bin", "pair.idx"}));
  ExpectHolds(*OpenOrDie(prefix), old_documents);

  // A finished one replaces it, and only at Finish.
  IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kI32);
  for (const auto& d : new_documents) NF_ASSERT_OK(writer.AddDocument(d));
  ExpectHolds(*OpenOrDie(prefix), old_documents);
  NF_ASSERT_OK(writer.Finish());
  EXPECT_EQ(dir.Files(), (std::set<std::string>{"pair.bin", "pair.idx"}));
  const auto dataset = OpenOrDie(prefix);
  EXPECT_EQ(dataset->dtype(), TokenDType::kI32);
  ExpectHolds(*dataset, new_documents);
}

TEST(IndexedDatasetWriterTest, MappedOldPairSurvivesReplacement) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("mapped");
  WriteDataset(prefix, TokenDType::kU16, {{1, 2, 3}});
  const auto old_dataset = OpenOrDie(prefix);
  WriteDataset(prefix, TokenDType::kU16, {{4, 5}});
  // The renames replace directory entries; the old mapping still sees the old files.
  EXPECT_EQ(Sequence(*old_dataset, 0), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Sequence(*OpenOrDie(prefix), 0), (std::vector<int32_t>{4, 5}));
}

TEST(IndexedDatasetWriterTest, OutOfRangeTokensAreRejectedNamingDocumentAndToken) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("range");
  IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kU16);
  NF_ASSERT_OK(writer.AddDocument(std::vector<int32_t>{1, 2}));
  nf::testing::ExpectInvalidArgument(writer.AddDocument(std::vector<int32_t>{5, 6, 65536}),
                                     "document 1 token 2 is 65536, outside the uint16 range");
  // A rejected document is not written and takes no document number.
  nf::testing::ExpectInvalidArgument(writer.AddDocument(std::vector<int32_t>{-1}),
                                     "document 1 token 0 is -1");
  NF_ASSERT_OK(writer.AddDocument(std::vector<int32_t>{65535, 0}));
  NF_ASSERT_OK(writer.Finish());
  ExpectHolds(*OpenOrDie(prefix), {{1, 2}, {65535, 0}});
}

TEST(IndexedDatasetWriterTest, MisuseIsAnErrorNotACrash) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("misuse");
  IndexedDatasetWriter writer = MakeWriter(prefix, TokenDType::kU16);
  NF_ASSERT_OK(writer.Finish());
  EXPECT_EQ(writer.Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer.AddDocument(std::vector<int32_t>{1}).code(),
            absl::StatusCode::kFailedPrecondition);

  IndexedDatasetWriter moved = MakeWriter(dir.Prefix("moved"), TokenDType::kU16);
  IndexedDatasetWriter target = std::move(moved);
  EXPECT_EQ(moved.Finish().code(), absl::StatusCode::kFailedPrecondition);  // NOLINT
  NF_ASSERT_OK(target.Finish());
  EXPECT_EQ(OpenOrDie(dir.Prefix("moved"))->num_sequences(), 0);
}

TEST(IndexedDatasetWriterTest, CreateInAMissingDirectoryNamesThePath) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("no/such/dir/data");
  absl::StatusOr<IndexedDatasetWriter> writer =
      IndexedDatasetWriter::Create(prefix, TokenDType::kU16);
  ASSERT_FALSE(writer.ok());
  // The OS's error as the one file writer reports it (core/files/durable_files.h).
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(writer.status().message()),
              HasSubstr("indexed dataset writer: cannot create " + prefix + ".bin.tmp-"));
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr(": No such file or directory"));
}

TEST(IndexedDatasetWriterTest, TwoWritersOfOnePrefixDoNotShareTemporaries) {
  ScratchDir dir;
  const std::string prefix = dir.Prefix("twice");
  IndexedDatasetWriter first = MakeWriter(prefix, TokenDType::kU16);
  IndexedDatasetWriter second = MakeWriter(prefix, TokenDType::kU16);
  NF_ASSERT_OK(first.AddDocument(std::vector<int32_t>{1}));
  NF_ASSERT_OK(second.AddDocument(std::vector<int32_t>{2, 2}));
  NF_ASSERT_OK(first.Finish());
  ExpectHolds(*OpenOrDie(prefix), {{1}});
  NF_ASSERT_OK(second.Finish());
  ExpectHolds(*OpenOrDie(prefix), {{2, 2}});
  EXPECT_EQ(dir.Files(), (std::set<std::string>{"twice.bin", "twice.idx"}));
}

}  // namespace
}  // namespace nf::data
