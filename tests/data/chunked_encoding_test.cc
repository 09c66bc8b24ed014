// Tests of data/chunked_encoding.h: a text longer than the chunk limit, encoded in chunks, gives
// the ids of encoding it whole, for GPT-2's BPE (a toy vocabulary whose merges involve spaces)
// and, up to the ties SentencePiece itself breaks by float rounding, for SentencePiece models
// trained here with nf-preprocess's options and with the other whitespace options a downloaded
// model may have; where no space fits, chunks end on UTF-8 character boundaries. Small chunk
// limits make every text long.
#include "data/chunked_encoding.h"
#include "data/grapheme_cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/sentencepiece_backend.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/unicode_class.h"
#include "tests/assert_ok.h"
#include "tests/data/gpt2_toy_vocab.h"

namespace nf::data {
namespace {

using Ids = std::vector<int32_t>;
using SpaceAtCut = Tokenizer::SpaceAtCut;

// Limits for cuts without a space in reach, and limits VariedText always has a space within.
constexpr size_t kSmallChunkLimits[] = {4, 7, 16, 31};
constexpr size_t kChunkLimits[] = {64, 100, 257};

// Text with what tokenizers treat specially: pseudo-words and words separated mostly by single
// spaces, but also by runs of spaces, tabs, newlines and CRLF, or glued; punctuation,
// contractions, digits, non-ASCII letters, non-ASCII whitespace (NBSP, U+3000), CJK, emoji and
// characters that normalization changes.
// Every other word is followed by a single space, so a cut point (a single space between two
// non-space characters) comes at least every 49 bytes.
std::string VariedText(std::mt19937& rng, size_t bytes) {
  static const char* const kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to",  "vi",
                                           "pe", "da", "go", "fu", "zi", "ba", "che", "str"};
  static const char* const kWords[] = {
      "über", "naïve", "café", "Ωμέγα", "漢字", "日本語", "42", "3.14", "2026", "😀", "he's",
      "we're", "I'm", "The", "x=1;", "(a,b)", "...", "!?", "-", "#", "\"quo\"",
      // Characters SentencePiece's NFKC normalization changes, deletes, or turns into a space:
      // zero-width space, acute accent, combining acute, fullwidth A, ligature fi, line and
      // next-line separators, BOM, controls, soft hyphen, word joiner, circled 1, "...".
      "\u200B", "\u00B4", "e\u0301", "\u0301", "Ａ", "ﬁ", "\u2028", "\u0085", "\uFEFF", "\x01",
      "\u00AD", "\u2060", "①", "…"};
  static const char* const kSeparators[] = {"  ", "   ", "\t",     "\n",     "\n\n",    "\r\n",
                                            ", ", ". ",  "\u00A0", "\u3000", " \u00A0", ""};
  const auto word = [&] {
    if (rng() % 3 == 0) return std::string(kWords[rng() % std::size(kWords)]);
    std::string syllables;
    for (int s = 1 + rng() % 3; s > 0; --s) syllables += kSyllables[rng() % std::size(kSyllables)];
    return syllables;
  };
  std::string text;
  for (int w = 0; text.size() < bytes; ++w) {
    text += word();
    if (rng() % 8 == 0) text += word();  // two glued
    text += w % 2 == 1 || rng() % 2 == 0 ? " " : kSeparators[rng() % std::size(kSeparators)];
  }
  return text;
}

// Text without a single space between two words (issue 33's long documents that were cut
// mid-word): words, CJK and not, separated by newlines (paragraphs), double or triple spaces,
// tabs, ideographic spaces (U+3000), no-break spaces and line separators.
std::string TextWithoutSingleSpaces(std::mt19937& rng, size_t bytes) {
  static const char* const kWords[] = {"漢字", "日本語の文", "中文段落", "kalo", "minestr",
                                       "über", "42",         "x=1;",     "😀",    "Ωμέγα"};
  static const char* const kSeparators[] = {"\n",     "\n\n",   "  ",     "   ", "\t",
                                            "\u3000", "\u00A0", "\u2028", "\r\n"};
  std::string text;
  while (text.size() < bytes) {
    for (int glued = 1 + rng() % 4; glued > 0; --glued) text += kWords[rng() % std::size(kWords)];
    text += kSeparators[rng() % std::size(kSeparators)];
  }
  return text;
}

// Text with runs of up to 3,000 characters that no model here has seen (Cyrillic, the euro
// sign, a 4-byte character, invalid bytes, mixed), long enough that SentencePieceTokenizer
// cuts them (every 2 KiB), after a separator or glued to the word before, some with a known
// letter inside, and some followed by a word glued to them.
std::string TextWithUnknownRuns(std::mt19937& rng, size_t bytes) {
  static const char* const kUnknown[] = {"ж", "€", "𝄞", "\xff", "ж€", "жж\xffж"};
  std::string text;
  while (text.size() < bytes) {
    text += VariedText(rng, 20);
    if (rng() % 2 == 0) text += "kalo";
    const char* unknown = kUnknown[rng() % std::size(kUnknown)];
    for (size_t n = rng() % 3000; n > 0; --n) text += n == 700 ? "a" : unknown;
    if (rng() % 2 == 0) text += "mine";
  }
  return text;
}

// Text of long stretches without whitespace the tokenizers can cut at (300 to 800 bytes, longer
// than every limit of kChunkLimits): pieces glued together, among them combining sequences
// (which NFKC composes), Hangul jamo, kana with a voiced mark, an emoji with a skin tone,
// characters NFKC changes or deletes (ligature, fullwidth, zero-width space), CJK, characters
// outside the vocabulary and an invalid byte; the stretches separated by a space, a newline, two
// spaces, or the whitespace no model cuts at (U+000B, deleted by NFKC; U+0085, kept).
std::string TextOfLongWords(std::mt19937& rng, size_t bytes) {
  static const char* const kPieces[] = {
      "kalo",   "mine",         "str",    "e\u0301", "cafe\u0301", "\u6F22\u5B57", "\u0436",
      "42",     "...",          "\u0301", "\xff",    "\uFB01",     "\uFF21",       "\u200B",
      "a\u0300\u0316", "\u1100\u1161\u11A8", "\u304B\u3099", "\U0001F44D\U0001F3FD"};
  static const char* const kSeparators[] = {" ", "\n", "  ", "\v", "\u0085"};
  std::string text;
  while (text.size() < bytes) {
    const size_t stretch = 300 + rng() % 500;
    for (const size_t start = text.size(); text.size() - start < stretch;) {
      text += kPieces[rng() % std::size(kPieces)];
    }
    text += kSeparators[rng() % std::size(kSeparators)];
  }
  return text;
}

// Wraps a tokenizer: records the texts Encode is called with, and may claim another
// space_at_cut (to show that the claim matters).
class Recorder final : public Tokenizer {
 public:
  explicit Recorder(const Tokenizer& inner, std::optional<SpaceAtCut> claim = std::nullopt)
      : inner_(inner), claim_(claim) {}
  absl::StatusOr<Ids> Encode(absl::string_view text) const override {
    chunks.emplace_back(text);
    return inner_.Encode(text);
  }
  absl::StatusOr<Ids> EncodeInsideWord(absl::string_view text, bool starts_inside_word,
                                       bool ends_inside_word) const override {
    chunks.emplace_back(text);
    return inner_.EncodeInsideWord(text, starts_inside_word, ends_inside_word);
  }
  bool KeepsTextAcrossCut(absl::string_view text, size_t at) const override {
    return inner_.KeepsTextAcrossCut(text, at);
  }
  void AppendIds(Ids& ids, std::span<const int32_t> next) const override {
    inner_.AppendIds(ids, next);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return inner_.Decode(ids);
  }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::optional<int32_t> end_of_document() const override { return inner_.end_of_document(); }
  SpaceAtCut space_at_cut() const override { return claim_.value_or(inner_.space_at_cut()); }
  // A claimed space side is tested on single spaces alone.
  bool CutsBeforeWhitespace(absl::string_view whitespace) const override {
    return !claim_ && inner_.CutsBeforeWhitespace(whitespace);
  }
  absl::string_view special_token_text() const override { return inner_.special_token_text(); }
  size_t preferred_chunk_bytes() const override { return inner_.preferred_chunk_bytes(); }

  mutable std::vector<std::string> chunks;

 private:
  const Tokenizer& inner_;
  std::optional<SpaceAtCut> claim_;
};

// Id = byte; any cut keeps the ids of the bytes it keeps.
class ByteTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<Ids> Encode(absl::string_view text) const override {
    return Ids(text.begin(), text.end());
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return std::string(ids.begin(), ids.end());
  }
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> end_of_document() const override { return std::nullopt; }
};

// ByteTokenizer that asks for chunks of `preferred` bytes (as SentencePiece unigram models do).
class PreferringByteTokenizer final : public Tokenizer {
 public:
  explicit PreferringByteTokenizer(size_t preferred) : preferred_(preferred) {}
  absl::StatusOr<Ids> Encode(absl::string_view text) const override { return bytes_.Encode(text); }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return bytes_.Decode(ids);
  }
  int64_t vocab_size() const override { return 256; }
  std::optional<int32_t> end_of_document() const override { return std::nullopt; }
  size_t preferred_chunk_bytes() const override { return preferred_; }

 private:
  ByteTokenizer bytes_;
  size_t preferred_;
};

// Whether `chunk` is whole UTF-8 characters (no sequence cut at either end).
bool IsWholeCharacters(const std::string& chunk) {
  for (size_t pos = 0; pos < chunk.size();) {
    const Utf8Char c = NextUtf8Char(chunk, pos);
    if (c.length == 1 && static_cast<unsigned char>(chunk[pos]) >= 0x80) return false;
    pos += c.length;
  }
  return true;
}

// A text's ids encoded whole and by EncodeInChunks, whose chunks are checked to fit the limit.
struct WholeAndChunked {
  Ids whole, chunked;
  std::vector<std::string> chunks;
  int64_t inexact_cuts = 0;
};

WholeAndChunked EncodeBothWays(const Tokenizer& tokenizer, const std::string& text, size_t limit) {
  const Recorder recorder(tokenizer);
  absl::StatusOr<Ids> whole = tokenizer.Encode(text);
  int64_t inexact_cuts = -1;
  absl::StatusOr<Ids> chunked = EncodeInChunks(recorder, text, limit, &inexact_cuts);
  NF_EXPECT_OK(whole);
  NF_EXPECT_OK(chunked);
  if (text.size() > limit) {
    EXPECT_GT(recorder.chunks.size(), 1u);
  }
  for (const std::string& chunk : recorder.chunks) EXPECT_LE(chunk.size(), limit);
  return {.whole = whole.value_or(Ids{}),
          .chunked = chunked.value_or(Ids{}),
          .chunks = recorder.chunks,
          .inexact_cuts = inexact_cuts};
}

std::string Chunks(const WholeAndChunked& result) {
  return absl::StrCat("chunks:\n[", absl::StrJoin(result.chunks, "]\n["), "]");
}

// A SentencePiece model's pieces and scores, from the PREFIX.vocab its training wrote: one
// "piece<TAB>score" line per id.
struct Vocabulary {
  std::vector<std::string> pieces;
  std::vector<double> scores;
};

Vocabulary ReadVocabulary(const std::string& path) {
  Vocabulary vocabulary;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    vocabulary.pieces.push_back(line.substr(0, tab));
    vocabulary.scores.push_back(std::stod(line.substr(tab + 1)));
  }
  return vocabulary;
}

// Whether `chunked` segments the text as `whole` does, except where two segmentations of a
// stretch score the same within float precision (a run of four periods as "." "..." or "..."
// "."; "salostr" as "sa" "lostr" or "salo" "str", -11.85593 and -11.85590). SentencePiece
// compares paths by a float running score, so it breaks such a tie by rounding, which depends
// on all the text before; a chunk starts that sum afresh and may break it the other way. A
// space lost or doubled at a cut, or a word split, spells another text and is never a tie.
::testing::AssertionResult SameSegmentationUpToTies(const Ids& whole, const Ids& chunked,
                                                    const Vocabulary& vocabulary) {
  // A float running score of magnitude S rounds in steps of S * 2^-23; a few steps of the whole
  // text's total are what a comparison late in the text may get wrong.
  double total = 0;
  for (const int32_t id : whole) total += vocabulary.scores.at(id);
  const double tolerance = std::abs(total) * 0x1p-20;
  constexpr size_t kMaxTiePieces = 8;
  size_t i = 0, j = 0;
  while (i < whole.size() && j < chunked.size()) {
    if (whole[i] == chunked[j]) {
      ++i, ++j;
      continue;
    }
    // The shortest stretches from i and j that spell the same text.
    const size_t i0 = i, j0 = j;
    std::string spelled_whole, spelled_chunked;
    double score_whole = 0, score_chunked = 0;
    do {
      const bool extend_whole = spelled_whole.size() <= spelled_chunked.size();
      size_t& k = extend_whole ? i : j;
      const Ids& ids = extend_whole ? whole : chunked;
      if (k == ids.size() || k - (extend_whole ? i0 : j0) == kMaxTiePieces) {
        return ::testing::AssertionFailure() << "id " << j0 << " is " << chunked[j0] << " ("
                                             << vocabulary.pieces.at(chunked[j0]) << ") where "
                                             << "the whole text has " << whole[i0] << " ("
                                             << vocabulary.pieces.at(whole[i0]) << ")";
      }
      (extend_whole ? spelled_whole : spelled_chunked) += vocabulary.pieces.at(ids[k]);
      (extend_whole ? score_whole : score_chunked) += vocabulary.scores.at(ids[k]);
      ++k;
    } while (spelled_whole != spelled_chunked);
    if (std::abs(score_whole - score_chunked) > tolerance) {
      return ::testing::AssertionFailure()
             << "\"" << spelled_whole << "\" scores " << score_chunked << " from id " << j0
             << ", not the whole text's " << score_whole;
    }
  }
  if (i != whole.size() || j != chunked.size()) {
    return ::testing::AssertionFailure()
           << chunked.size() << " ids, the whole text " << whole.size();
  }
  return ::testing::AssertionSuccess();
}

TEST(ChunkedEncodingTest, TextWithinTheLimitIsEncodedInOneCall) {
  const ByteTokenizer bytes;
  const Recorder recorder(bytes);
  const std::string text(100, 'a');
  NF_ASSERT_OK(EncodeInChunks(recorder, text, 100));
  EXPECT_EQ(recorder.chunks, std::vector<std::string>{text});
}

// Each way of placing the space: the chunks, put back together with the space where the claim
// says it went, are the text, and fit the limit. Where a space is in reach, the space of each
// cut is where the claim says.
TEST(ChunkedEncodingTest, CutsAtSingleSpacesKeepTheText) {
  const ByteTokenizer bytes;
  std::mt19937 rng(1);
  for (const SpaceAtCut claim :
       {SpaceAtCut::kStartsNext, SpaceAtCut::kEndsPrevious, SpaceAtCut::kDropped}) {
    for (int trial = 0; trial < 20; ++trial) {
      const std::string text = VariedText(rng, 2000);
      for (const size_t limit : kChunkLimits) {
        const Recorder recorder(bytes, claim);
        NF_ASSERT_OK(EncodeInChunks(recorder, text, limit));
        const std::vector<std::string>& chunks = recorder.chunks;
        EXPECT_EQ(absl::StrJoin(chunks, claim == SpaceAtCut::kDropped ? " " : ""), text);
        for (size_t i = 0; i < chunks.size(); ++i) {
          ASSERT_LE(chunks[i].size(), limit);
          if (i == 0) continue;
          const std::string& before = chunks[i - 1];
          const std::string& after = chunks[i];
          switch (claim) {
            case SpaceAtCut::kStartsNext:
              EXPECT_TRUE(after[0] == ' ' && after[1] != ' ') << absl::CHexEscape(after);
              break;
            case SpaceAtCut::kEndsPrevious:
              EXPECT_TRUE(before.back() == ' ' && before[before.size() - 2] != ' ')
                  << absl::CHexEscape(before);
              break;
            case SpaceAtCut::kDropped:
              EXPECT_TRUE(before.back() != ' ' && after[0] != ' ');
              break;
          }
        }
      }
      for (const size_t limit : kSmallChunkLimits) {  // also cut where no space is in reach
        const Recorder recorder(bytes, claim);
        NF_ASSERT_OK(EncodeInChunks(recorder, text, limit));
        if (claim != SpaceAtCut::kDropped) {
          EXPECT_EQ(absl::StrJoin(recorder.chunks, ""), text);
        }
        for (const std::string& chunk : recorder.chunks) EXPECT_LE(chunk.size(), limit);
      }
    }
  }
}

TEST(ChunkedEncodingTest, TextWithoutSpacesIsCutAtCharacterBoundaries) {
  // 1-, 2-, 3- and 4-byte characters, no space anywhere.
  static const char* const kCharacters[] = {"a", "é", "漢", "😀", "\u3000", "\n", "7"};
  std::mt19937 rng(2);
  std::string text;
  while (text.size() < 3000) text += kCharacters[rng() % std::size(kCharacters)];
  const ByteTokenizer bytes;
  for (size_t limit = 1; limit <= 40; ++limit) {
    const Recorder recorder(bytes);
    NF_ASSERT_OK(EncodeInChunks(recorder, text, limit));
    EXPECT_EQ(absl::StrJoin(recorder.chunks, ""), text);
    for (const std::string& chunk : recorder.chunks) {
      EXPECT_LE(chunk.size(), std::max<size_t>(limit, 4));  // below 4, one character is allowed
      EXPECT_TRUE(IsWholeCharacters(chunk)) << "limit " << limit << ": " << absl::CHexEscape(chunk);
    }
  }
}

TEST(ChunkedEncodingTest, InvalidUtf8IsCutAnyway) {
  std::mt19937 rng(3);
  const ByteTokenizer bytes;
  for (int trial = 0; trial < 50; ++trial) {
    std::string text(1000, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 64 : rng());
    for (const size_t limit : kSmallChunkLimits) {
      const Recorder recorder(bytes);
      NF_ASSERT_OK(EncodeInChunks(recorder, text, limit));
      EXPECT_EQ(absl::StrJoin(recorder.chunks, ""), text);
      for (const std::string& chunk : recorder.chunks) EXPECT_LE(chunk.size(), limit);
    }
  }
}

// Merges of the words of VariedText, with and without their leading space, and of whitespace
// runs: a cut that moved a space would change the ids.
std::unique_ptr<Gpt2Bpe> ToyGpt2() {
  const std::string space = ByteSymbol(' '), newline = ByteSymbol('\n');
  std::vector<std::string> merges = {space + " " + space, newline + " " + newline};
  for (const char* word : {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "th"}) {
    const std::string left(1, word[0]), right(1, word[1]);
    merges.push_back(left + " " + right);
    merges.push_back(space + " " + word);
  }
  merges.push_back("th e");
  merges.push_back(space + "th e");
  merges.push_back("' s");
  merges.push_back("4 2");
  merges.push_back(space + " 42");
  merges.push_back(ByteSymbol(0xC3) + " " + ByteSymbol(0xA9));  // é
  return MakeBpe(MakeToy(merges, {"<|endoftext|>"}));
}

// A tokenizer's preferred chunk size: text is cut at the last space within it, or, where none
// is, at the first space beyond it (an exact cut, not an inexact one at the preferred size);
// only past the limit with no space at all is a cut inexact.
TEST(ChunkedEncodingTest, PreferredChunksEndAtTheNearestExactCut) {
  const PreferringByteTokenizer tokenizer(16);
  const std::string long_word(40, 'w');
  const std::string text =
      "ab cd ef gh ij kl mn op " + long_word + " qr st " + std::string(150, 'z') + " uv";
  const Recorder recorder(tokenizer);
  int64_t inexact_cuts = -1;
  const absl::StatusOr<Ids> ids = EncodeInChunks(recorder, text, 100, &inexact_cuts);
  NF_ASSERT_OK(ids);
  EXPECT_EQ(*ids, *tokenizer.Encode(text));
  EXPECT_EQ(inexact_cuts, 1);  // the 150 z's, longer than the limit of 100
  EXPECT_EQ(recorder.chunks,
            (std::vector<std::string>{"ab cd ef gh ij", " kl mn op", " " + long_word, " qr st",
                                      " " + std::string(99, 'z'), std::string(51, 'z'), " uv"}));
  // A tokenizer's preference above the limit is the limit.
  const PreferringByteTokenizer large(1000);
  const Recorder large_recorder(large);
  NF_ASSERT_OK(EncodeInChunks(large_recorder, text, 100));
  EXPECT_EQ(large_recorder.chunks.front(), "ab cd ef gh ij kl mn op " + long_word + " qr st");
}

TEST(ChunkedEncodingTest, Gpt2IdsAreThoseOfTheWholeText) {
  const std::unique_ptr<Gpt2Bpe> bpe = ToyGpt2();
  ASSERT_EQ(bpe->space_at_cut(), SpaceAtCut::kStartsNext);
  std::mt19937 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    const std::string text = VariedText(rng, 3000);
    for (const size_t limit : kChunkLimits) {
      const WholeAndChunked result = EncodeBothWays(*bpe, text, limit);
      ASSERT_EQ(result.chunked, result.whole) << "limit " << limit << ", " << Chunks(result);
    }
  }
}

// Before every whitespace character that follows a non-space one is an exact cut for GPT-2: text
// without single spaces is cut there, with the ids of the whole text and no inexact cut.
TEST(ChunkedEncodingTest, Gpt2CutsBeforeAnyWhitespace) {
  const std::unique_ptr<Gpt2Bpe> bpe = ToyGpt2();
  std::mt19937 rng(8);
  for (int trial = 0; trial < 20; ++trial) {
    const std::string text = TextWithoutSingleSpaces(rng, 3000);
    for (const size_t limit : kChunkLimits) {
      const WholeAndChunked result = EncodeBothWays(*bpe, text, limit);
      ASSERT_EQ(result.chunked, result.whole) << "limit " << limit << ", " << Chunks(result);
      ASSERT_EQ(result.inexact_cuts, 0) << "limit " << limit << ", " << Chunks(result);
    }
  }
  // Without whitespace there is no exact cut: counted.
  const WholeAndChunked blob = EncodeBothWays(*bpe, std::string(300, 'x'), 64);
  EXPECT_EQ(blob.inexact_cuts, 4);
}

TEST(ChunkedEncodingTest, Gpt2WithTheSpaceOnTheWrongSideDiffers) {
  // What the test above would not notice if the space's side did not matter.
  const std::unique_ptr<Gpt2Bpe> bpe = ToyGpt2();
  std::mt19937 rng(5);
  const std::string text = VariedText(rng, 3000);
  const Recorder wrong(*bpe, SpaceAtCut::kEndsPrevious);
  const absl::StatusOr<Ids> chunked = EncodeInChunks(wrong, text, 100);
  NF_ASSERT_OK(chunked);
  EXPECT_NE(*chunked, *bpe->Encode(text));
}

TEST(ChunkedEncodingTest, Gpt2TextWithoutSpacesStillRoundTrips) {
  const std::unique_ptr<Gpt2Bpe> bpe = ToyGpt2();
  std::string text;
  for (int i = 0; i < 200; ++i) text += "漢字kamié😀";
  const absl::StatusOr<Ids> ids = EncodeInChunks(*bpe, text, 100);
  NF_ASSERT_OK(ids);
  EXPECT_EQ(*bpe->Decode(*ids), text);
}

TEST(ChunkedEncodingTest, Gpt2SpecialTokenIsNeverCut) {
  // Without spaces every cut is at a character boundary; "<|endoftext|>" read as the token must
  // not be cut there (it would be text on both sides), wherever it falls against the limit.
  const std::unique_ptr<Gpt2Bpe> bpe = ToyGpt2();
  NF_ASSERT_OK(bpe->ParseSpecialTokens(true));
  const int32_t eod = *bpe->end_of_document();
  for (const size_t limit : {13, 16, 31, 64}) {
    for (size_t offset = 0; offset < 40; ++offset) {
      const std::string text = std::string(offset, 'k') + "<|endoftext|>" + std::string(30, 'a') +
                               "<|endoftext|><|endoftext|>é漢<|endoftext|>";
      const Recorder recorder(*bpe);
      const absl::StatusOr<Ids> ids = EncodeInChunks(recorder, text, limit);
      NF_ASSERT_OK(ids);
      EXPECT_EQ(std::count(ids->begin(), ids->end(), eod), 4)
          << "limit " << limit << ", offset " << offset;
      EXPECT_EQ(*ids, *bpe->Encode(text)) << "limit " << limit << ", offset " << offset;
      EXPECT_EQ(absl::StrJoin(recorder.chunks, ""), text);
      for (const std::string& chunk : recorder.chunks) {
        EXPECT_LT(chunk.size(), limit + 13);  // past the limit only by a token it starts with
      }
    }
  }
}

// SentencePiece models trained on VariedText, one per whitespace configuration: what
// nf-preprocess trains (SentencePiece's defaults) and what downloaded models use.
struct SentencePieceConfig {
  std::string name;
  std::unordered_map<std::string, std::string> flags;  // beyond input, prefix, vocabulary
  SpaceAtCut expected;
  // A side for the space that changes the ids (none where remove_extra_whitespaces strips a
  // chunk's edge spaces, so that every side gives the same).
  std::optional<SpaceAtCut> wrong = std::nullopt;
};

void PrintTo(const SentencePieceConfig& config, std::ostream* out) { *out << config.name; }

const std::vector<SentencePieceConfig>& SentencePieceConfigs() {
  static const auto* configs = new std::vector<SentencePieceConfig>{
      {.name = "defaults", .flags = {}, .expected = SpaceAtCut::kDropped, .wrong = std::nullopt},
      {.name = "bpe",
       .flags = {{"model_type", "bpe"}},
       .expected = SpaceAtCut::kDropped,
       .wrong = std::nullopt},
      // As Llama's tokenizer: spaces kept as they are, digits split, bytes for unknown text.
      {.name = "kept_whitespace",
       .flags = {{"remove_extra_whitespaces", "false"},
                 {"allow_whitespace_only_pieces", "true"},
                 {"split_digits", "true"},
                 {"byte_fallback", "true"}},
       .expected = SpaceAtCut::kDropped,
       .wrong = SpaceAtCut::kStartsNext},
      {.name = "no_dummy_prefix",
       .flags = {{"add_dummy_prefix", "false"}, {"remove_extra_whitespaces", "false"}},
       .expected = SpaceAtCut::kStartsNext,
       .wrong = SpaceAtCut::kDropped},
      {.name = "suffix",
       .flags = {{"treat_whitespace_as_suffix", "true"}},
       .expected = SpaceAtCut::kDropped,
       .wrong = std::nullopt},
      {.name = "suffix_no_dummy_prefix",
       .flags = {{"treat_whitespace_as_suffix", "true"},
                 {"add_dummy_prefix", "false"},
                 {"remove_extra_whitespaces", "false"}},
       .expected = SpaceAtCut::kEndsPrevious,
       .wrong = SpaceAtCut::kStartsNext},
  };
  return *configs;
}

// 20 texts of `make_text`, each encoded in chunks at every limit of kChunkLimits: the whole
// text's segmentation up to ties, and with `all_exact` not one inexact cut.
void ExpectChunkedAsWhole(const Tokenizer& model, const Vocabulary& vocabulary,
                          std::string (*make_text)(std::mt19937&, size_t), std::mt19937& rng,
                          bool all_exact) {
  for (int trial = 0; trial < 20; ++trial) {
    const std::string text = make_text(rng, 3000);
    for (const size_t limit : kChunkLimits) {
      const WholeAndChunked result = EncodeBothWays(model, text, limit);
      ASSERT_TRUE(SameSegmentationUpToTies(result.whole, result.chunked, vocabulary))
          << "limit " << limit << ", " << Chunks(result);
      if (all_exact) {
        ASSERT_EQ(result.inexact_cuts, 0) << "limit " << limit << ", " << Chunks(result);
      }
    }
  }
}

class ChunkedSentencePieceTest : public ::testing::TestWithParam<SentencePieceConfig> {
 protected:
  // The models are trained once, on one corpus: training is the slow part.
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::path(::testing::TempDir()) /
                                     absl::StrCat("nf_chunked_encoding_test_", getpid()));
    std::filesystem::create_directories(*dir_);
    std::mt19937 rng(6);
    std::ofstream corpus(Path("corpus.txt"));
    for (int i = 0; i < 2000; ++i) {
      std::string sentence = VariedText(rng, 100);
      for (char& c : sentence) c = c == '\n' || c == '\r' ? ' ' : c;  // one sentence a line
      corpus << sentence << "\n";
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return (*dir_ / name).string(); }

  // The model of `config`, trained once per configuration: the suite's tests share it.
  static std::unique_ptr<SentencePieceTokenizer> Train(const SentencePieceConfig& config) {
    const std::string prefix = Path(config.name);
    if (!std::filesystem::exists(prefix + ".model")) TrainModel(config, prefix);
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> model =
        SentencePieceTokenizer::Load(prefix + ".model");
    NF_EXPECT_OK(model);
    return model.ok() ? *std::move(model) : nullptr;
  }

  // nf-preprocess's own training for "defaults", SentencePiece's trainer with the flags else.
  static void TrainModel(const SentencePieceConfig& config, const std::string& prefix) {
    if (config.flags.empty()) {
      NF_EXPECT_OK(SentencePieceTokenizer::Train(
          {.inputs = {Path("corpus.txt")}, .model_prefix = prefix, .vocab_size = 400}));
      return;
    }
    std::unordered_map<std::string, std::string> flags = config.flags;
    flags.insert({{"input", Path("corpus.txt")},
                  {"model_prefix", prefix},
                  {"vocab_size", "400"},
                  {"character_coverage", "1.0"}});
    const sentencepiece_backend::Result trained = sentencepiece_backend::Train(flags);
    EXPECT_TRUE(trained.ok()) << trained.message;
  }

  static std::filesystem::path* dir_;
};

std::filesystem::path* ChunkedSentencePieceTest::dir_ = nullptr;

TEST_P(ChunkedSentencePieceTest, IdsAreThoseOfTheWholeText) {
  const std::unique_ptr<SentencePieceTokenizer> model = Train(GetParam());
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->space_at_cut(), GetParam().expected);
  const Vocabulary vocabulary = ReadVocabulary(Path(GetParam().name + ".vocab"));
  ASSERT_EQ(static_cast<int64_t>(vocabulary.pieces.size()), model->vocab_size());
  std::mt19937 rng(7);
  ExpectChunkedAsWhole(*model, vocabulary, VariedText, rng, /*all_exact=*/false);
  if (const std::optional<SpaceAtCut> wrong = GetParam().wrong) {
    const std::string text = VariedText(rng, 3000);
    const absl::StatusOr<Ids> chunked = EncodeInChunks(Recorder(*model, *wrong), text, 100);
    NF_ASSERT_OK(chunked);
    EXPECT_FALSE(SameSegmentationUpToTies(*model->Encode(text), *chunked, vocabulary));
  }
}

// Text without single spaces is cut before its other whitespace where the model removes extra
// whitespace (the defaults and bpe here: nf-preprocess's and most models'), with the whole text's
// ids up to ties and no inexact cut; a model that keeps whitespace allows no such cut. Before,
// such text was cut mid-word and SentencePiece put a word start (▁) there.
TEST_P(ChunkedSentencePieceTest, TextWithoutSingleSpacesIsCutBeforeItsOtherWhitespace) {
  const std::unique_ptr<SentencePieceTokenizer> model = Train(GetParam());
  ASSERT_NE(model, nullptr);
  const bool removes_extra_whitespace =
      GetParam().name == "defaults" || GetParam().name == "bpe" || GetParam().name == "suffix";
  // NFKC makes these a space; U+000B it deletes, joining the words around it.
  for (const char* c : {"\n", "\t", "\u3000", "\u00A0", "\u2028"}) {
    EXPECT_EQ(model->CutsBeforeWhitespace(c), removes_extra_whitespace) << absl::CEscape(c);
  }
  EXPECT_FALSE(model->CutsBeforeWhitespace("\v"));
  if (!removes_extra_whitespace) return;
  const Vocabulary vocabulary = ReadVocabulary(Path(GetParam().name + ".vocab"));
  std::mt19937 rng(9);
  ExpectChunkedAsWhole(*model, vocabulary, TextWithoutSingleSpaces, rng, /*all_exact=*/true);
}

// Runs of unknown characters, which SentencePieceTokenizer::Encode cuts and splices (0.1.97 takes
// time quadratic in a run's length in one call), keep the ids of one 0.1.97 call on the whole
// text (up to ties): each model's <unk> (or its byte pieces) where the text has one, never a word
// start or a second <unk> at a cut.
TEST_P(ChunkedSentencePieceTest, RunsOfUnknownCharactersKeepTheWholeTextsIds) {
  const std::unique_ptr<SentencePieceTokenizer> model = Train(GetParam());
  ASSERT_NE(model, nullptr);
  std::unique_ptr<sentencepiece_backend::Model> library;
  const sentencepiece_backend::Result loaded =
      sentencepiece_backend::Model::Load(Path(GetParam().name + ".model"), &library);
  ASSERT_TRUE(loaded.ok()) << loaded.message;
  const Vocabulary vocabulary = ReadVocabulary(Path(GetParam().name + ".vocab"));
  std::mt19937 rng(11);
  for (int trial = 0; trial < 8; ++trial) {
    const std::string text = TextWithUnknownRuns(rng, 30000);
    // Every configuration is cut, a dummy suffix too (the text before a cut is encoded without
    // it; before issue 45 only a dummy prefix's word start was spliced away, and runs in a
    // suffix model were not cut at all).
    EXPECT_FALSE(model->UnknownRunCuts(text).empty()) << "trial " << trial;
    std::vector<int> whole;
    ASSERT_TRUE(library->Encode(text, &whole).ok());
    const absl::StatusOr<Ids> ours = model->Encode(text);
    NF_ASSERT_OK(ours);
    ASSERT_TRUE(SameSegmentationUpToTies(Ids(whole.begin(), whole.end()), *ours, vocabulary))
        << "trial " << trial;
  }
}

// A stretch without whitespace longer than the limit is cut inexactly, inside a word, and the
// text is kept: the chunks' ids decode to what the whole text's ids decode to (the text in
// SentencePiece's normal form, one " ⁇ " for each run of unknown text). Before issue 45 the
// chunk after such a cut was encoded with the dummy prefix's word start, a space in the text
// there; and a cut could split a combining sequence ('e' | U+0301), changing its normal form.
// Every cut is at a grapheme cluster boundary between two non-whitespace characters.
TEST_P(ChunkedSentencePieceTest, CutsInsideWordsKeepTheText) {
  const std::unique_ptr<SentencePieceTokenizer> model = Train(GetParam());
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(13);
  for (int trial = 0; trial < 10; ++trial) {
    const std::string text = TextOfLongWords(rng, 3000);
    const absl::StatusOr<Ids> whole = model->Encode(text);
    NF_ASSERT_OK(whole);
    const absl::StatusOr<std::string> expected = model->Decode(*whole);
    NF_ASSERT_OK(expected);
    for (const size_t limit : kChunkLimits) {
      const WholeAndChunked result = EncodeBothWays(*model, text, limit);
      EXPECT_GT(result.inexact_cuts, 0) << "limit " << limit;
      const absl::StatusOr<std::string> decoded = model->Decode(result.chunked);
      NF_ASSERT_OK(decoded);
      const size_t differ = static_cast<size_t>(
          std::mismatch(decoded->begin(), decoded->end(), expected->begin(), expected->end())
              .first -
          decoded->begin());
      ASSERT_EQ(*decoded, *expected)
          << "trial " << trial << ", limit " << limit << ": from byte " << differ << ", \""
          << absl::CEscape(decoded->substr(differ > 20 ? differ - 20 : 0, 40))
          << "\" where the whole text's ids give \""
          << absl::CEscape(expected->substr(differ > 20 ? differ - 20 : 0, 40)) << "\"";
      size_t at = 0;
      for (size_t c = 0; c + 1 < result.chunks.size(); ++c) {
        at = text.find(result.chunks[c], at) + result.chunks[c].size();
        EXPECT_TRUE(IsGraphemeClusterBoundary(text, at))
            << "chunk " << c << " ends inside a grapheme cluster: " << Chunks(result);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Whitespace, ChunkedSentencePieceTest,
                         ::testing::ValuesIn(SentencePieceConfigs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace nf::data
