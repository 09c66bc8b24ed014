// nf-preprocess's pipeline with a byte-level toy tokenizer: ordered output for any worker
// count, the dtype rule, the end-of-document token, the begin-of-document token before it,
// empty documents kept as Megatron keeps them, and that a failure or an output without tokens
// leaves nothing behind.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::data {
namespace {

namespace fs = std::filesystem;

// Token = byte value; end of document = 256; begin of document = 2 (ASCII's start of text,
// in no test's text) unless `begin` says none. Documents containing "FAIL" cannot be encoded;
// "VOID" encodes to no ids (as text a SentencePiece model normalizes away).
constexpr int32_t kBegin = 2;
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int64_t vocab = 257, std::optional<int32_t> begin = kBegin)
      : vocab_(vocab), begin_(begin) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    if (text == "VOID") return std::vector<int32_t>{};
    if (text.find("FAIL") != absl::string_view::npos) {
      return absl::InvalidArgumentError("cannot encode FAIL");
    }
    // What SentencePiece does with a document too large for memory.
    if (text.find("HUGE") != absl::string_view::npos) throw std::bad_alloc();
    return std::vector<int32_t>(text.begin(), text.end());
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return std::string(ids.begin(), ids.end());
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> end_of_document() const override { return 256; }
  std::optional<int32_t> begin_of_document() const override { return begin_; }

 private:
  int64_t vocab_;
  std::optional<int32_t> begin_;
};

class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("nf_preprocess_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& contents) {
    std::ofstream((dir_ / name).string(), std::ios::binary) << contents;
    return (dir_ / name).string();
  }
  std::vector<uint8_t> Bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>());
  }
  std::vector<std::string> Documents(const std::string& prefix) {
    auto dataset = IndexedDataset::Open(prefix);
    NF_EXPECT_OK(dataset);
    std::vector<std::string> docs;
    for (int64_t i = 0; i < (*dataset)->num_sequences(); ++i) {
      std::vector<int32_t> tokens((*dataset)->sequence_length(i));
      (*dataset)->ReadTokens(i, 0, tokens.size(), tokens.data());
      std::string text;
      for (int32_t t : tokens) text += t == 256 ? '|' : t == kBegin ? '^' : static_cast<char>(t);
      docs.push_back(text);
    }
    return docs;
  }
  fs::path dir_;
};

TEST_F(PreprocessTest, OutputIsInInputOrderForAnyWorkerCount) {
  std::string jsonl;
  std::vector<std::string> expected;
  for (int i = 0; i < 1000; ++i) {
    jsonl += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
    expected.push_back("document " + std::to_string(i) + "|");
  }
  const std::string a = Write("a.jsonl", jsonl);
  const std::string b = Write("b.txt", "tail one\ntail two\n");
  std::vector<std::string> outputs;
  for (int workers : {1, 3}) {
    const std::string prefix = (dir_ / ("out" + std::to_string(workers))).string();
    auto jsonl_done = Preprocess(
        {.inputs = {a}, .output_prefix = prefix, .workers = workers, .documents_per_batch = 7},
        ByteTokenizer(), {});
    NF_ASSERT_OK(jsonl_done);
    EXPECT_EQ(jsonl_done->documents, 1000);
    EXPECT_EQ(Documents(prefix), expected);
    std::ifstream bin(prefix + ".bin", std::ios::binary);
    outputs.push_back(std::string(std::istreambuf_iterator<char>(bin), {}));
  }
  EXPECT_EQ(outputs[0], outputs[1]);  // byte-identical whatever the worker count

  const std::string lines = (dir_ / "lines").string();
  NF_ASSERT_OK(Preprocess({.inputs = {b, b},
                           .format = InputFormat::kLines,
                           .output_prefix = lines,
                           .append_end_of_document = false},
                          ByteTokenizer(), {}));
  EXPECT_EQ(Documents(lines),
            (std::vector<std::string>{"tail one", "tail two", "tail one", "tail two"}));
}

TEST_F(PreprocessTest, TokenDTypeFollowsTheVocabularySize) {
  const std::string input = Write("in.txt", "x\n");
  for (const auto& [vocab, dtype] : std::vector<std::pair<int64_t, TokenDType>>{
           {257, TokenDType::kU16}, {65499, TokenDType::kU16}, {65500, TokenDType::kI32}}) {
    // StrCat, not "v" + std::to_string(...): GCC 12 at -O3 reports a false -Wrestrict there.
    const std::string prefix = (dir_ / absl::StrCat("v", vocab)).string();
    NF_ASSERT_OK(
        Preprocess({.inputs = {input}, .format = InputFormat::kLines, .output_prefix = prefix},
                   ByteTokenizer(vocab), {}));
    EXPECT_EQ((*IndexedDataset::Open(prefix))->dtype(), dtype) << vocab;
  }
}

// Empty documents kept as Megatron's tools/preprocess_data.py keeps them. Its Encoder.encode
// tokenizes each JSONL text and appends the end-of-document token only `if len(doc_ids) > 0 and
// append_eod`, with sentence_lens = [len(ids)] for a non-empty text and [] for an empty one; the
// writer then calls IndexedDatasetBuilder.add_document(doc_ids, sentence_lens), which writes the
// ids to .bin, extends sequence_lengths by sentence_lens and appends len(sequence_lengths) to
// document_indices (which starts as [0]). For the texts "", "ab", "", "VOID" (no ids), "c", ""
// with ids = bytes and end of document 256 (uint16, code 8):
//   --append-eod: sequence_lengths [3, 2], pointers [0, 6] (bytes), document_indices
//     [0, 0, 1, 1, 1, 2, 2], .bin 97 98 256 99 256;
//   without it: sequence_lengths [2, 1], pointers [0, 4], the same document_indices, .bin 97 98
//     99.
// So: 2 sequences, 7 document index entries (6 documents), with and without the token.
TEST_F(PreprocessTest, KeptEmptyDocumentsAreWhatMegatronWrites) {
  const std::string input = Write("e.jsonl",
                                  "{\"text\": \"\"}\n{\"text\": \"ab\"}\n{\"text\": \"\"}\n"
                                  "{\"text\": \"VOID\"}\n{\"text\": \"c\"}\n{\"text\": \"\"}\n");
  const auto idx = [](uint8_t first_length, uint8_t second_length, uint8_t second_pointer) {
    std::vector<uint8_t> bytes = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                  8,   2,   0,   0,   0,   0,   0,   0, 0, 7, 0, 0, 0, 0, 0, 0, 0};
    for (const uint8_t length : {first_length, second_length}) {
      bytes.insert(bytes.end(), {length, 0, 0, 0});  // i32
    }
    for (const uint8_t pointer : {uint8_t{0}, second_pointer}) {
      bytes.insert(bytes.end(), {pointer, 0, 0, 0, 0, 0, 0, 0});  // i64
    }
    for (const uint8_t entry : {0, 0, 1, 1, 1, 2, 2}) {
      bytes.insert(bytes.end(), {entry, 0, 0, 0, 0, 0, 0, 0});  // i64
    }
    return bytes;
  };
  for (const bool eod : {true, false}) {
    const std::string prefix = (dir_ / (eod ? "with_eod" : "without_eod")).string();
    const auto done = Preprocess({.inputs = {input},
                                  .output_prefix = prefix,
                                  .workers = 2,
                                  .append_end_of_document = eod,
                                  .keep_empty_documents = true,
                                  .documents_per_batch = 2},
                                 ByteTokenizer(), {});
    NF_ASSERT_OK(done);
    EXPECT_EQ(done->documents, 6);
    EXPECT_EQ(done->empty_documents, 4);
    EXPECT_EQ(done->tokens, eod ? 5 : 3);
    if (eod) {
      EXPECT_EQ(Bytes(prefix + ".idx"), idx(3, 2, 6));
      EXPECT_EQ(Bytes(prefix + ".bin"), (std::vector<uint8_t>{97, 0, 98, 0, 0, 1, 99, 0, 0, 1}));
    } else {
      EXPECT_EQ(Bytes(prefix + ".idx"), idx(2, 1, 4));
      EXPECT_EQ(Bytes(prefix + ".bin"), (std::vector<uint8_t>{97, 0, 98, 0, 99, 0}));
    }
    auto dataset = IndexedDataset::Open(prefix);
    NF_ASSERT_OK(dataset);
    EXPECT_EQ((*dataset)->num_documents(), 6);
  }
  // By default the empty texts are skipped and "VOID" is its end-of-document token alone.
  const std::string prefix = (dir_ / "default").string();
  const auto done = Preprocess({.inputs = {input}, .output_prefix = prefix}, ByteTokenizer(), {});
  NF_ASSERT_OK(done);
  EXPECT_EQ(done->empty_documents, 0);
  EXPECT_EQ(Documents(prefix), (std::vector<std::string>{"ab|", "|", "c|"}));
}

// An output without tokens is refused, kept empty documents or not, with nothing left behind:
// no documents at all (as before), or only empty ones.
TEST_F(PreprocessTest, OnlyEmptyDocumentsAreRefused) {
  const std::string empty_texts = Write("e.jsonl", "{\"text\": \"\"}\n\n{\"text\": \"\"}\n");
  const std::string blank_lines = Write("b.txt", "\n \t\n");
  const std::string one_void = Write("v.txt", "VOID\n");
  struct Case {
    std::string input;
    InputFormat format;
    bool keep;
    bool eod;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {empty_texts, InputFormat::kJsonl, false, true,
            "no documents in the input (empty, or only blank lines or empty texts): nothing "
            "written"},
           {empty_texts, InputFormat::kJsonl, true, true,
            "the input has 2 documents, all empty (no tokens): nothing written"},
           {blank_lines, InputFormat::kLines, false, true,
            "no documents in the input (empty, or only blank lines or empty texts): nothing "
            "written"},
           {blank_lines, InputFormat::kLines, true, false,
            "the input has 2 documents, all empty (no tokens): nothing written"},
           {one_void, InputFormat::kLines, true, true,
            "the input has 1 document, and it is empty (no tokens): nothing written"},
           {one_void, InputFormat::kLines, false, false,
            "the input has 1 document, and it is empty (no tokens): nothing written"},
       }) {
    const std::string prefix = (dir_ / "out").string();
    const auto done = Preprocess({.inputs = {c.input},
                                  .format = c.format,
                                  .output_prefix = prefix,
                                  .append_end_of_document = c.eod,
                                  .keep_empty_documents = c.keep},
                                 ByteTokenizer(), {});
    ASSERT_FALSE(done.ok()) << c.input << " keep " << c.keep;
    EXPECT_EQ(done.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(done.status().message(), c.message) << c.input << " keep " << c.keep;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string().find("out"), std::string::npos)
          << "left behind: " << entry.path();
    }
  }
}

// A failing document, a malformed line, or a missing input: an error naming the cause, and no
// file that looks like a dataset (nor temporaries) in the output directory.
TEST_F(PreprocessTest, FailuresLeaveNothingBehind) {
  std::string many;
  for (int i = 0; i < 500; ++i) many += "{\"text\": \"ok " + std::to_string(i) + "\"}\n";
  const std::string failing = Write("f.jsonl", many + "{\"text\": \"FAIL\"}\n" + many);
  const std::string malformed = Write("m.jsonl", many + "{\"text\": \n" + many);
  struct Case {
    std::string input, mentions;
  };
  const std::string huge = Write("h.jsonl", many + "{\"text\": \"HUGE\"}\n" + many);
  for (const Case& c : std::vector<Case>{{failing, "cannot encode FAIL"},
                                         {huge, "out of memory encoding a document of 4 bytes"},
                                         {malformed, "m.jsonl:501:"},
                                         {(dir_ / "missing.jsonl").string(), "missing.jsonl"}}) {
    const std::string prefix = (dir_ / "out").string();
    auto done = Preprocess(
        {.inputs = {c.input}, .output_prefix = prefix, .workers = 2, .documents_per_batch = 16},
        ByteTokenizer(), {});
    ASSERT_FALSE(done.ok()) << c.input;
    EXPECT_NE(done.status().message().find(c.mentions), std::string::npos) << done.status();
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(name.find("out"), std::string::npos) << "left behind: " << name;
    }
  }
}

// --prepend-begin-of-document: every document reads [begin] + ids + [end] ("^document 7|"), or
// [begin] + ids without the end token, in input order and byte for byte the same for any worker
// count; without it, the same tokenizer writes what it wrote before ("document 7|", checked
// above with the begin token defined but not asked for).
TEST_F(PreprocessTest, BeginOfDocumentStartsEveryDocumentForAnyWorkerCount) {
  std::string jsonl;
  for (int i = 0; i < 1000; ++i) jsonl += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
  const std::string input = Write("a.jsonl", jsonl);
  for (const bool eod : {true, false}) {
    std::vector<std::string> expected;
    for (int i = 0; i < 1000; ++i) {
      expected.push_back("^document " + std::to_string(i) + (eod ? "|" : ""));
    }
    std::vector<std::vector<uint8_t>> outputs;
    for (const int workers : {1, 3}) {
      const std::string prefix = (dir_ / absl::StrCat("out", workers, eod ? "_eod" : "")).string();
      const auto done = Preprocess({.inputs = {input},
                                    .output_prefix = prefix,
                                    .workers = workers,
                                    .append_end_of_document = eod,
                                    .prepend_begin_of_document = true,
                                    .documents_per_batch = 7},
                                   ByteTokenizer(), {});
      NF_ASSERT_OK(done);
      EXPECT_EQ(done->documents, 1000);
      EXPECT_EQ(Documents(prefix), expected) << workers << " workers";
      outputs.push_back(Bytes(prefix + ".bin"));
      const std::vector<uint8_t> idx = Bytes(prefix + ".idx");
      outputs.back().insert(outputs.back().end(), idx.begin(), idx.end());
    }
    EXPECT_EQ(outputs[0], outputs[1]);  // .bin and .idx, whatever the worker count
  }
}

// Empty documents keep no tokens with the begin token asked for, as with the end token: for the
// texts "", "ab", "", "VOID", "c", "" (KeptEmptyDocumentsAreWhatMegatronWrites) two sequences,
// 2 97 98 256 and 2 99 256, and the same document index. Not kept, "VOID" (no ids) is the two
// tokens alone.
TEST_F(PreprocessTest, KeptEmptyDocumentsStayWithoutTheBeginToken) {
  const std::string input = Write("e.jsonl",
                                  "{\"text\": \"\"}\n{\"text\": \"ab\"}\n{\"text\": \"\"}\n"
                                  "{\"text\": \"VOID\"}\n{\"text\": \"c\"}\n{\"text\": \"\"}\n");
  const std::string kept = (dir_ / "kept").string();
  const auto done = Preprocess({.inputs = {input},
                                .output_prefix = kept,
                                .workers = 2,
                                .prepend_begin_of_document = true,
                                .keep_empty_documents = true,
                                .documents_per_batch = 2},
                               ByteTokenizer(), {});
  NF_ASSERT_OK(done);
  EXPECT_EQ(done->documents, 6);
  EXPECT_EQ(done->empty_documents, 4);
  EXPECT_EQ(done->tokens, 7);
  EXPECT_EQ(Bytes(kept + ".bin"),
            (std::vector<uint8_t>{2, 0, 97, 0, 98, 0, 0, 1, 2, 0, 99, 0, 0, 1}));
  auto dataset = IndexedDataset::Open(kept);
  NF_ASSERT_OK(dataset);
  EXPECT_EQ((*dataset)->document_index(), (std::vector<int64_t>{0, 0, 1, 1, 1, 2, 2}));

  const std::string skipped = (dir_ / "skipped").string();
  NF_ASSERT_OK(
      Preprocess({.inputs = {input}, .output_prefix = skipped, .prepend_begin_of_document = true},
                 ByteTokenizer(), {}));
  EXPECT_EQ(Documents(skipped), (std::vector<std::string>{"^ab|", "^|", "^c|"}));
}

// A tokenizer without a begin-of-document token: refused when the token is asked for, nothing
// written; without the flag it writes as before.
TEST_F(PreprocessTest, BeginOfDocumentNeedsATokenizerWithOne) {
  const std::string input = Write("in.txt", "x\n");
  const std::string prefix = (dir_ / "out").string();
  const auto done = Preprocess({.inputs = {input},
                                .format = InputFormat::kLines,
                                .output_prefix = prefix,
                                .prepend_begin_of_document = true},
                               ByteTokenizer(257, std::nullopt), {});
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(done.status().message(),
            "the tokenizer has no begin-of-document token; leave out --prepend-begin-of-document "
            "or use a tokenizer with one");
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find("out"), std::string::npos)
        << "left behind: " << entry.path();
  }
  NF_ASSERT_OK(
      Preprocess({.inputs = {input}, .format = InputFormat::kLines, .output_prefix = prefix},
                 ByteTokenizer(257, std::nullopt), {}));
  EXPECT_EQ(Documents(prefix), std::vector<std::string>{"x|"});
}

}  // namespace
}  // namespace nf::data
