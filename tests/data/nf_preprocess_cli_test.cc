// The nf-preprocess command line, running the real binary of this build: --help, usage errors
// (exit 2, one line naming the problem), a runtime error (exit 1, nothing left behind), a full
// run training a SentencePiece model and writing a dataset that reads back, and documents with
// begin- and end-of-document tokens (--prepend-begin-of-document) for both tokenizers.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli_util.h"
#include "data/indexed_dataset.h"
#include "data/sentencepiece_backend.h"
#include "data/sentencepiece_tokenizer.h"
#include "test_util.h"
#include "tests/data/gpt2_toy_vocab.h"

#ifndef NF_PREPROCESS_BINARY
#error "NF_PREPROCESS_BINARY must name the nf-preprocess executable (tests/CMakeLists.txt)"
#endif

namespace nf::data {
namespace {

using ::nf::testing::Lines;
using ::nf::testing::Outcome;
using ::testing::HasSubstr;

class NfPreprocessCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("nf_preprocess_cli_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Outcome Run(const std::vector<std::string>& args) {
    return ::nf::testing::RunProgram(NF_PREPROCESS_BINARY, args, dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // 400 short JSONL documents over a small vocabulary: enough to train a 40-piece model.
  std::string WriteCorpus() {
    std::ofstream corpus(Path("corpus.jsonl"));
    for (int i = 0; i < 400; ++i) {
      corpus << "{\"text\": \"the quick brown fox " << i % 17 << " jumps over the lazy dog "
             << i % 5 << "\"}\n";
    }
    return Path("corpus.jsonl");
  }
  std::vector<std::string> CorpusTexts() const {
    std::vector<std::string> texts;
    for (int i = 0; i < 400; ++i) {
      texts.push_back(
          absl::StrCat("the quick brown fox ", i % 17, " jumps over the lazy dog ", i % 5));
    }
    return texts;
  }

  // The dataset nf-preprocess writes for `texts` (uint16 tokens), built here from each text's
  // ids: `begin` (when given), tokenizer.Encode(text), `end`. Its .bin and .idx are the
  // reference a run's are compared with, byte for byte.
  std::string WriteExpected(const std::string& name, const Tokenizer& tokenizer,
                            const std::vector<std::string>& texts, std::optional<int32_t> begin,
                            int32_t end) {
    auto writer = IndexedDatasetWriter::Create(Path(name), TokenDType::kU16);
    NF_EXPECT_OK(writer);
    for (const std::string& text : texts) {
      std::vector<int32_t> ids;
      if (begin.has_value()) ids.push_back(*begin);
      absl::StatusOr<std::vector<int32_t>> encoded = tokenizer.Encode(text);
      NF_EXPECT_OK(encoded);
      ids.insert(ids.end(), encoded->begin(), encoded->end());
      ids.push_back(end);
      NF_EXPECT_OK(writer->AddDocument(ids));
    }
    NF_EXPECT_OK(writer->Finish());
    return Path(name);
  }
  // Whether the datasets at the two prefixes are the same bytes.
  void ExpectSameDataset(const std::string& prefix, const std::string& expected) const {
    for (const char* suffix : {".bin", ".idx"}) {
      EXPECT_TRUE(::nf::testing::ReadFile(prefix + suffix) ==
                  ::nf::testing::ReadFile(expected + suffix))
          << prefix << suffix << " differs from " << expected << suffix;
    }
  }

  std::filesystem::path dir_;
};

TEST_F(NfPreprocessCliTest, HelpDocumentsEveryOption) {
  const Outcome outcome = Run({"--help"});
  EXPECT_EQ(outcome.exit_code, 0);
  for (const char* option :
       {"--input", "--format", "--json-key", "--output-prefix", "--tokenizer", "--vocab-file",
        "--merges-file", "--spm-model", "--spm-train-vocab-size", "--workers", "--no-eod",
        "--prepend-begin-of-document", "--parse-special-tokens", "--keep-empty-documents"}) {
    EXPECT_THAT(outcome.out, HasSubstr(option));
  }
}

TEST_F(NfPreprocessCliTest, UsageErrorsExitTwoWithOneLineNamingTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  for (const Case& c : std::vector<Case>{
           {{"--output-prefix", "x"}, "--input"},
           {{"--input", "a.jsonl"}, "--output-prefix"},
           {{"--input", "a", "--output-prefix", "x", "--bogus", "1"}, "--bogus"},
           {{"--input", "a", "--output-prefix", "x", "--workers", "0"}, "--workers"},
           {{"--input", "a", "--output-prefix", "x", "--workers", "100000"},
            "--workers needs a number in [1, 256], got '100000'"},
           {{"--input", "a", "--output-prefix", "x", "--format", "csv"}, "csv"},
           {{"--input", "a", "--output-prefix", "x", "--tokenizer", "gpt2"}, "--vocab-file"},
           {{"--input", "a", "--output-prefix", "x", "--tokenizer", "wordpiece"}, "gpt2"},
           {{"--input", "a", "--output-prefix", "x", "--tokenizer", "sentencepiece", "--spm-model",
             "m", "--parse-special-tokens"},
            "--parse-special-tokens is for --tokenizer gpt2"},
       }) {
    const Outcome outcome = Run(c.args);
    EXPECT_EQ(outcome.exit_code, 2) << c.mentions << ": " << outcome.err;
    ASSERT_FALSE(Lines(outcome.err).empty());
    EXPECT_THAT(Lines(outcome.err)[0], HasSubstr(c.mentions));
  }
}

// --parse-special-tokens with a vocabulary that has no "<|endoftext|>": exit 2, nothing written.
TEST_F(NfPreprocessCliTest, ParseSpecialTokensNeedsEndOfTextInTheVocabulary) {
  const ToyFiles toy = MakeToy({"h e"}, {});
  std::ofstream(Path("vocab.json")) << toy.vocab_json;
  std::ofstream(Path("merges.txt")) << toy.merges_txt;
  std::ofstream(Path("in.jsonl")) << "{\"text\": \"he<|endoftext|>\"}\n";
  const Outcome outcome =
      Run({"--input", Path("in.jsonl"), "--output-prefix", Path("out"), "--tokenizer", "gpt2",
           "--vocab-file", Path("vocab.json"), "--merges-file", Path("merges.txt"), "--no-eod",
           "--parse-special-tokens"});
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_EQ(Lines(outcome.err),
            std::vector<std::string>{"nf-preprocess: --parse-special-tokens: GPT-2 BPE: the "
                                     "vocabulary has no \"<|endoftext|>\" token, so none can be "
                                     "read in the text"});
  EXPECT_FALSE(std::filesystem::exists(Path("out.idx")));
}

// --keep-empty-documents keeps the empty texts as documents without tokens, and says so.
TEST_F(NfPreprocessCliTest, KeepsEmptyDocuments) {
  const ToyFiles toy = MakeToy({"h e"}, {"<|endoftext|>"});
  std::ofstream(Path("vocab.json")) << toy.vocab_json;
  std::ofstream(Path("merges.txt")) << toy.merges_txt;
  std::ofstream(Path("in.jsonl")) << "{\"text\": \"\"}\n{\"text\": \"he\"}\n{\"text\": \"\"}\n";
  const Outcome outcome = Run({"--input", Path("in.jsonl"), "--output-prefix", Path("out"),
                               "--tokenizer", "gpt2", "--vocab-file", Path("vocab.json"),
                               "--merges-file", Path("merges.txt"), "--keep-empty-documents"});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("3 documents (2 empty), 2 tokens"));
  auto dataset = IndexedDataset::Open(Path("out"));
  NF_ASSERT_OK(dataset);
  EXPECT_EQ((*dataset)->num_sequences(), 1);
  EXPECT_EQ((*dataset)->document_index(), (std::vector<int64_t>{0, 0, 1, 1}));
}

// GPT-2 with --prepend-begin-of-document: "<|endoftext|>", its one special token, before and
// after every document, the same for 1 and 3 workers (400 documents: 7 batches); without the
// flag, each document's ids and then the token alone, as before.
TEST_F(NfPreprocessCliTest, Gpt2DocumentsBeginAndEndWithEndOfText) {
  const ToyFiles toy = MakeToy({"h e", "t h", "th e", "o x", "Ġ t", "Ġt he"}, {"<|endoftext|>"});
  std::ofstream(Path("vocab.json")) << toy.vocab_json;
  std::ofstream(Path("merges.txt")) << toy.merges_txt;
  const std::vector<std::string> gpt2 = {"--input",       WriteCorpus(),     "--tokenizer",
                                         "gpt2",          "--vocab-file",    Path("vocab.json"),
                                         "--merges-file", Path("merges.txt")};
  const std::unique_ptr<Gpt2Bpe> bpe = MakeBpe(toy);
  const int32_t end_of_text = toy.ids.at("<|endoftext|>");
  ASSERT_EQ(bpe->begin_of_document(), end_of_text);

  const auto run = [&](const std::string& prefix, const std::vector<std::string>& flags) {
    std::vector<std::string> args = gpt2;
    args.insert(args.end(), {"--output-prefix", Path(prefix)});
    args.insert(args.end(), flags.begin(), flags.end());
    const Outcome outcome = Run(args);
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    return Path(prefix);
  };
  const std::string both =
      WriteExpected("expected_both", *bpe, CorpusTexts(), end_of_text, end_of_text);
  ExpectSameDataset(run("one", {"--prepend-begin-of-document"}), both);
  ExpectSameDataset(run("three", {"--prepend-begin-of-document", "--workers", "3"}), both);
  ExpectSameDataset(
      run("plain", {"--workers", "3"}),
      WriteExpected("expected_plain", *bpe, CorpusTexts(), std::nullopt, end_of_text));

  // Read back: document 3 is the token, its text, the token.
  auto dataset = IndexedDataset::Open(Path("three"));
  NF_ASSERT_OK(dataset);
  std::vector<int32_t> tokens((*dataset)->sequence_length(3));
  (*dataset)->ReadTokens(3, 0, static_cast<int64_t>(tokens.size()), tokens.data());
  ASSERT_GE(tokens.size(), 2u);
  EXPECT_EQ(tokens.front(), end_of_text);
  EXPECT_EQ(tokens.back(), end_of_text);
  EXPECT_EQ(*bpe->Decode(std::span<const int32_t>(tokens).subspan(1, tokens.size() - 2)),
            "the quick brown fox 3 jumps over the lazy dog 3");
}

// SentencePiece with --prepend-begin-of-document: the model nf-preprocess trains has <s> (id 1,
// SentencePiece's default) and </s> (2), and every document is <s> ids </s>, the same for 1 and
// 2 workers; without the flag, ids </s> as before.
TEST_F(NfPreprocessCliTest, SentencePieceDocumentsBeginWithTheBosPiece) {
  const std::string corpus = WriteCorpus();
  const Outcome trained =
      Run({"--input", corpus, "--output-prefix", Path("two"), "--tokenizer", "sentencepiece",
           "--spm-train-vocab-size", "40", "--workers", "2", "--prepend-begin-of-document"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  auto model = SentencePieceTokenizer::Load(Path("two.spm.model"));
  NF_ASSERT_OK(model);
  EXPECT_EQ((*model)->begin_of_document(), 1);
  EXPECT_EQ((*model)->end_of_document(), 2);
  ExpectSameDataset(Path("two"), WriteExpected("expected_both", **model, CorpusTexts(), 1, 2));

  const std::vector<std::string> given = {"--input",       corpus,        "--tokenizer",
                                          "sentencepiece", "--spm-model", Path("two.spm.model")};
  std::vector<std::string> args = given;
  args.insert(args.end(), {"--output-prefix", Path("one"), "--prepend-begin-of-document"});
  Outcome outcome = Run(args);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  ExpectSameDataset(Path("one"), Path("two"));

  args = given;
  args.insert(args.end(), {"--output-prefix", Path("plain"), "--workers", "2"});
  outcome = Run(args);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  ExpectSameDataset(Path("plain"),
                    WriteExpected("expected_plain", **model, CorpusTexts(), std::nullopt, 2));
}

// A tokenizer without a begin-of-document token and --prepend-begin-of-document: exit 2, one line
// naming the flag and the tokenizer, nothing written. The same tokenizers work without the flag.
TEST_F(NfPreprocessCliTest, BeginOfDocumentNeedsATokenizerWithOne) {
  const std::string corpus = WriteCorpus();
  const ToyFiles toy = MakeToy({"h e"}, {});  // no "<|endoftext|>"
  std::ofstream(Path("vocab.json")) << toy.vocab_json;
  std::ofstream(Path("merges.txt")) << toy.merges_txt;
  // A SentencePiece model trained without <s>, as spm_train --bos_id=-1 trains one.
  {
    std::ofstream text(Path("train.txt"));
    for (const std::string& line : CorpusTexts()) text << line << "\n";
  }
  const sentencepiece_backend::Result no_bos =
      sentencepiece_backend::Train({{"input", Path("train.txt")},
                                    {"model_prefix", Path("no_bos")},
                                    {"vocab_size", "40"},
                                    {"bos_id", "-1"},
                                    {"num_threads", "1"}});
  ASSERT_TRUE(no_bos.ok()) << no_bos.message;
  struct Case {
    std::vector<std::string> tokenizer;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"gpt2", "--vocab-file", Path("vocab.json"), "--merges-file", Path("merges.txt"),
             "--no-eod"},
            "nf-preprocess: --prepend-begin-of-document: the GPT-2 vocabulary " +
                Path("vocab.json") + " has no \"<|endoftext|>\" token to begin documents with"},
           {{"sentencepiece", "--spm-model", Path("no_bos.model")},
            "nf-preprocess: --prepend-begin-of-document: the SentencePiece model " +
                Path("no_bos.model") + " has no begin-of-document piece <s> (its bos_id is -1)"},
       }) {
    std::vector<std::string> args = {"--input", corpus, "--output-prefix", Path("out"),
                                     "--tokenizer"};
    args.insert(args.end(), c.tokenizer.begin(), c.tokenizer.end());
    args.push_back("--prepend-begin-of-document");
    const Outcome refused = Run(args);
    EXPECT_EQ(refused.exit_code, 2) << refused.err;
    EXPECT_EQ(Lines(refused.err), std::vector<std::string>{c.message});
    EXPECT_FALSE(std::filesystem::exists(Path("out.bin")));
    EXPECT_FALSE(std::filesystem::exists(Path("out.idx")));

    args.pop_back();
    const Outcome plain = Run(args);
    EXPECT_EQ(plain.exit_code, 0) << plain.err;
    std::filesystem::remove(Path("out.bin"));
    std::filesystem::remove(Path("out.idx"));
  }
}

TEST_F(NfPreprocessCliTest, TrainsATokenizerAndWritesADatasetThatReadsBack) {
  std::ofstream corpus(Path("corpus.jsonl"));
  for (int i = 0; i < 400; ++i) {
    corpus << "{\"text\": \"the quick brown fox " << i % 17 << " jumps over the lazy dog " << i % 5
           << "\"}\n";
  }
  corpus.close();
  const Outcome outcome =
      Run({"--input", Path("corpus.jsonl"), "--output-prefix", Path("out"), "--tokenizer",
           "sentencepiece", "--spm-train-vocab-size", "40", "--workers", "2"});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("400 documents"));
  auto dataset = IndexedDataset::Open(Path("out"));
  NF_ASSERT_OK(dataset);
  EXPECT_EQ((*dataset)->num_sequences(), 400);
  EXPECT_EQ((*dataset)->dtype(), TokenDType::kU16);
  auto tokenizer = SentencePieceTokenizer::Load(Path("out.spm.model"));
  NF_ASSERT_OK(tokenizer);
  // Document 3 reads back as its text followed by the end-of-document token.
  std::vector<int32_t> tokens((*dataset)->sequence_length(3));
  (*dataset)->ReadTokens(3, 0, tokens.size(), tokens.data());
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.back(), *(*tokenizer)->end_of_document());
  tokens.pop_back();
  EXPECT_EQ(*(*tokenizer)->Decode(tokens), "the quick brown fox 3 jumps over the lazy dog 3");
}

// A directory, an empty file and a file of blank lines are refused (they gave an empty dataset
// and exit 0), with nothing left behind; so are blank lines kept as empty documents.
TEST_F(NfPreprocessCliTest, InputWithoutDocumentsExitsOneAndLeavesNothing) {
  const Outcome trained = Run({"--input", WriteCorpus(), "--output-prefix", Path("m"),
                               "--tokenizer", "sentencepiece", "--spm-train-vocab-size", "40"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  std::filesystem::create_directories(Path("inputs"));
  std::ofstream(Path("empty.jsonl")) << "";
  std::ofstream(Path("blank.txt")) << "\n  \n\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--input", Path("inputs")}, "is a directory: give the files in it"},
      {{"--input", Path("empty.jsonl")}, "no documents in the input"},
      {{"--input", Path("blank.txt"), "--format", "lines"}, "no documents in the input"},
      // Kept, the blank lines are documents, but empty ones: still nothing to write.
      {{"--input", Path("blank.txt"), "--format", "lines", "--keep-empty-documents"},
       "the input has 3 documents, all empty (no tokens): nothing written"}};
  for (const auto& [input, expected] : cases) {
    std::vector<std::string> args = input;
    for (const std::string& a :
         {std::string("--output-prefix"), Path("out"), std::string("--tokenizer"),
          std::string("sentencepiece"), std::string("--spm-model"), Path("m.spm.model")}) {
      args.push_back(a);
    }
    const Outcome outcome = Run(args);
    EXPECT_EQ(outcome.exit_code, 1) << input[1];
    EXPECT_THAT(outcome.err, HasSubstr(expected)) << input[1];
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string().rfind("out", 0), std::string::npos)
          << entry.path() << " left behind by " << input[1];
    }
  }
}

// A document with a stretch of more than a chunk (1 MiB) without whitespace has no exact cut
// there: it is encoded all the same, its text kept, and the run says how many documents were
// cut inexactly and which (issue 45: it named none). Documents whose long stretches have
// whitespace, newlines included, are cut exactly: no word.
TEST_F(NfPreprocessCliTest, ADocumentCutWithoutAnExactCutIsReported) {
  const Outcome trained = Run({"--input", WriteCorpus(), "--output-prefix", Path("m"),
                               "--tokenizer", "sentencepiece", "--spm-train-vocab-size", "40"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  std::string paragraphs;  // lines of 60 letters: no single space, a newline every 61 bytes
  while (paragraphs.size() < (size_t{3} << 20) / 2) paragraphs += std::string(60, 'o') + "\\n";
  std::ofstream(Path("long.jsonl")) << "{\"text\": \"" << std::string((size_t{3} << 20) / 2, 'o')
                                    << "\"}\n{\"text\": \"" << paragraphs << "\"}\n";
  const Outcome outcome = Run({"--input", Path("long.jsonl"), "--output-prefix", Path("out"),
                               "--tokenizer", "sentencepiece", "--spm-model", Path("m.spm.model")});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("nf-preprocess: 2 documents"));
  EXPECT_EQ(outcome.err,
            "nf-preprocess: warning: 1 documents had a stretch of 1048576 bytes without "
            "whitespace the tokenizer can be cut at (" +
                Path("long.jsonl") +
                " document 1); each was cut there between two characters, keeping its text, "
                "where its ids may differ from encoding it whole (docs/design.md, section 6.1)\n");
  // The text is kept: the ids decode to the document (before, a word start at the cut added a
  // space there).
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> model =
      SentencePieceTokenizer::Load(Path("m.spm.model"));
  NF_ASSERT_OK(model);
  absl::StatusOr<std::unique_ptr<IndexedDataset>> dataset = IndexedDataset::Open(Path("out"));
  NF_ASSERT_OK(dataset);
  std::vector<int32_t> ids((*dataset)->sequence_length(0));
  (*dataset)->ReadTokens(0, 0, static_cast<int64_t>(ids.size()), ids.data());
  ids.pop_back();  // end-of-document
  absl::StatusOr<std::string> decoded = (*model)->Decode(ids);
  NF_ASSERT_OK(decoded);
  EXPECT_TRUE(*decoded == std::string((size_t{3} << 20) / 2, 'o'))
      << decoded->size() << " bytes, " << std::count(decoded->begin(), decoded->end(), ' ')
      << " spaces";
}

// SentencePiece trains only on lines of 1 to 4192 bytes. A corpus of one 200k-character line (e
// + U+0301, 100k times) printed some 60 lines of SentencePiece's log ending in "Internal:
// [!sentences_.empty()]"; now one line says why and what to do, before SentencePiece runs, and
// nothing is left behind.
TEST_F(NfPreprocessCliTest, TrainingWithoutALineSentencePieceTrainsOnSaysSoInOneLine) {
  std::string line;
  for (int i = 0; i < 100'000; ++i) line += "e\u0301";
  std::ofstream(Path("one_line.jsonl")) << "{\"text\": \"" << line << "\"}\n";
  const Outcome outcome = Run({"--input", Path("one_line.jsonl"), "--output-prefix", Path("out"),
                               "--tokenizer", "sentencepiece", "--spm-train-vocab-size", "100"});
  EXPECT_EQ(outcome.exit_code, 1);
  EXPECT_EQ(outcome.err, "nf-preprocess: SentencePiece training of " + Path("out.spm") +
                             ": no line of the training text has 1 to 4192 bytes, and "
                             "SentencePiece skips longer lines (its one line has 300000 bytes): "
                             "break the text into lines (sentences or paragraphs) of at most "
                             "4192 bytes\n");
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().rfind("out", 0), std::string::npos)
        << entry.path() << " left behind";
  }
}

TEST_F(NfPreprocessCliTest, MalformedInputExitsOneAndLeavesNothing) {
  std::ofstream(Path("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"text\": broken}\n";
  const Outcome trained = Run({"--input", WriteCorpus(), "--output-prefix", Path("m"),
                               "--tokenizer", "sentencepiece", "--spm-train-vocab-size", "40"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const Outcome outcome = Run({"--input", Path("bad.jsonl"), "--output-prefix", Path("out"),
                               "--tokenizer", "sentencepiece", "--spm-model", Path("m.spm.model")});
  EXPECT_EQ(outcome.exit_code, 1);
  EXPECT_THAT(outcome.err, HasSubstr("bad.jsonl:2:"));
  EXPECT_FALSE(std::filesystem::exists(Path("out.bin")));
  EXPECT_FALSE(std::filesystem::exists(Path("out.idx")));
}

// Tokenizer files that cannot be read, and an output that cannot be written: exit 1, one line
// naming the file and the OS's reason. A directory as --spm-model made SentencePiece throw
// (an internal error naming no file); the training text's error said "Success" for its reason.
TEST_F(NfPreprocessCliTest, UnreadableTokenizerFilesAndUnwritableOutputsNameThePathAndTheReason) {
  const std::string input = WriteCorpus();
  std::filesystem::create_directory(Path("a_directory"));
  std::ofstream(Path("merges.txt")) << "#version: 0.2\n";
  struct Case {
    std::vector<std::string> tokenizer;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"sentencepiece", "--spm-model", Path("a_directory")},
            "nf-preprocess: cannot open SentencePiece model " + Path("a_directory") +
                ": Is a directory"},
           {{"gpt2", "--vocab-file", Path("a_directory"), "--merges-file", Path("merges.txt")},
            "nf-preprocess: cannot read " + Path("a_directory") + ": Is a directory"},
       }) {
    std::vector<std::string> args = {"--input", input, "--output-prefix", Path("out"),
                                     "--tokenizer"};
    args.insert(args.end(), c.tokenizer.begin(), c.tokenizer.end());
    const Outcome outcome = Run(args);
    EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
    EXPECT_EQ(Lines(outcome.err), std::vector<std::string>{c.message});
  }
  // The SentencePiece training text, first thing written, into a directory that is not there.
  const std::string missing = Path("no_such_dir/out");
  const Outcome outcome = Run({"--input", input, "--output-prefix", missing, "--tokenizer",
                               "sentencepiece", "--spm-train-vocab-size", "40"});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  const std::vector<std::string> lines = Lines(outcome.err);
  ASSERT_EQ(lines.size(), 1u) << outcome.err;
  EXPECT_THAT(lines[0], ::testing::StartsWith("nf-preprocess: cannot create directory " + missing +
                                              ".spm-train.tmp-"));
  EXPECT_THAT(lines[0], ::testing::EndsWith(": No such file or directory"));
}

// The outputs never land in a checkpoint or over an input: refused with exit 2 and one line,
// before anything is written (a prefix inside a checkpoint used to put .bin/.idx among its
// shards). Links planted at the names nf-preprocess writes (the trained model's, the training
// text's old fixed name) reach nothing: the model is trained in a staging directory of its own
// and moved into place, replacing the links.
TEST_F(NfPreprocessCliTest, OutputsStayOutOfCheckpointsAndInputsAndLinksReachNothing) {
  const std::string corpus = WriteCorpus();
  const std::filesystem::path checkpoint = dir_ / "run" / "checkpoints" / "iter_0000005";
  std::filesystem::create_directories(checkpoint);
  std::ofstream(checkpoint / "manifest.pb") << "precious";
  std::ofstream(Path("tokens.bin")) << "an input";
  const std::vector<std::string> spm = {"--tokenizer", "sentencepiece", "--spm-train-vocab-size",
                                        "40"};
  for (const auto& [input, prefix, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {corpus, (checkpoint / "data").string(),
            "--output-prefix " + (checkpoint / "data.bin").string() + " is inside checkpoint " +
                checkpoint.string()},
           {Path("tokens.bin"), Path("tokens"),
            "--output-prefix " + Path("tokens.bin") + " is --input " + Path("tokens.bin") +
                ", which this command reads"}}) {
    std::vector<std::string> args = {"--input", input, "--output-prefix", prefix};
    args.insert(args.end(), spm.begin(), spm.end());
    const Outcome outcome = Run(args);
    EXPECT_EQ(outcome.exit_code, 2) << outcome.err;
    ASSERT_EQ(Lines(outcome.err).size(), 1u) << outcome.err;
    EXPECT_THAT(outcome.err, HasSubstr("nf-preprocess: " + message));
  }
  EXPECT_EQ(std::vector<std::string>({"manifest.pb"}), [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(checkpoint)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  }());
  EXPECT_EQ(::nf::testing::ReadFile(Path("tokens.bin")), "an input");

  // (A symbolic link into a checkpoint is refused like the checkpoint's own path; a hard link
  // cannot be told from a file by its path, and one elsewhere is a file worth keeping too.)
  const std::filesystem::path victim = checkpoint / "manifest.pb", elsewhere = dir_ / "notes";
  std::ofstream(elsewhere) << "mine";
  std::filesystem::create_symlink(elsewhere, Path("out.spm.model"));
  std::filesystem::create_hard_link(victim, Path("out.spm.vocab"));
  std::filesystem::create_symlink(victim, Path("out.spm-train.txt"));
  std::vector<std::string> args = {"--input", corpus, "--output-prefix", Path("out")};
  args.insert(args.end(), spm.begin(), spm.end());
  const Outcome trained = Run(args);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_EQ(::nf::testing::ReadFile(victim), "precious");
  EXPECT_EQ(::nf::testing::ReadFile(elsewhere), "mine");
  EXPECT_FALSE(std::filesystem::is_symlink(Path("out.spm.model")));
  NF_EXPECT_OK(SentencePieceTokenizer::Load(Path("out.spm.model")).status());
  EXPECT_TRUE(std::filesystem::is_symlink(Path("out.spm-train.txt")));
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
  }
}

}  // namespace
}  // namespace nf::data
