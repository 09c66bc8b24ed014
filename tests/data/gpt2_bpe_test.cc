// Tests of data/gpt2_bpe.h against hand-worked encodings with a toy vocabulary: the 256
// byte-level symbols (id = byte value) and a handful of merges. Each case is worked through in
// its comment: the pre-tokens (GPT-2's regex), the byte -> symbol map, then the merges by rank.
// Also: the heap-based merge loop against a direct transcription of encoder.py's loop on random
// merge tables, byte-exact round trips of random byte strings, concurrent encoding, and load
// errors that name the file and line.
#include "data/gpt2_bpe.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/gpt2_pretokenizer.h"
#include "data/unicode_class.h"
#include "data/vocab_json.h"
#include "test_util.h"
#include "tests/data/gpt2_toy_vocab.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

// The symbol string of a byte string (what encoder.py's byte_encoder makes of it).
std::string Symbols(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += ByteSymbol(b);
  return out;
}

// The toy model of the hand-worked cases. Ranks are line order; ids 256.. in the same order.
// ("Ġ" is the space symbol, "Ċ" the newline symbol, "Ã©" the two bytes of "é".)
const std::vector<std::string>& ToyMerges() {
  static const auto* merges = new std::vector<std::string>{
      "l l",      // rank 0  -> "ll"      256
      "h e",      // rank 1  -> "he"      257
      "he ll",    // rank 2  -> "hell"    258
      "hell o",   // rank 3  -> "hello"   259
      "Ġ w",      // rank 4  -> "Ġw"      260
      "o r",      // rank 5  -> "or"      261
      "Ġw or",    // rank 6  -> "Ġwor"    262
      "Ġwor l",   // rank 7  -> "Ġworl"   263
      "Ġworl d",  // rank 8  -> "Ġworld"  264
      "' s",      // rank 9  -> "'s"      265
      "1 2",      // rank 10 -> "12"      266
      "! !",      // rank 11 -> "!!"      267
      "Ġ Ġ",      // rank 12 -> "ĠĠ"      268
      "Ċ Ċ",      // rank 13 -> "ĊĊ"      269
      "Ã ©",      // rank 14 -> "Ã©"      270
      "' r",      // rank 15 -> "'r"      271
      "'r e",     // rank 16 -> "'re"     272
      "e l",      // rank 17 -> "el"      273 (competes with "h e" for the e of "hel")
  };
  return *merges;
}

class Gpt2BpeToyTest : public ::testing::Test {
 protected:
  Gpt2BpeToyTest() : toy_(MakeToy(ToyMerges(), {"<|endoftext|>"})), bpe_(MakeBpe(toy_)) {}

  Ids Encode(const std::string& text) {
    absl::StatusOr<Ids> ids = bpe_->Encode(text);
    NF_EXPECT_OK(ids);
    if (ids.ok()) {
      absl::StatusOr<std::string> decoded = bpe_->Decode(*ids);
      NF_EXPECT_OK(decoded);
      if (decoded.ok()) {
        EXPECT_EQ(*decoded, text);
      }
    }
    return ids.ok() ? *ids : Ids{};
  }

  ToyFiles toy_;
  std::unique_ptr<Gpt2Bpe> bpe_;
};

TEST_F(Gpt2BpeToyTest, VocabularyAndEndOfDocument) {
  EXPECT_EQ(bpe_->vocab_size(), 256 + 18 + 1);
  EXPECT_EQ(bpe_->end_of_document(), 274);
  EXPECT_EQ(toy_.ids.at("el"), 273);
  EXPECT_EQ(toy_.ids.at(Symbols(" world")), 264);
}

TEST_F(Gpt2BpeToyTest, WordsWithLeadingSpaces) {
  // "hello world": pre-tokens "hello", " world" (` ?\p{L}+` takes the space into the word).
  // "hello" = h e l l o: the best pair is (l,l) rank 0 -> h e ll o; then (h,e) rank 1 ->
  // he ll o; (he,ll) rank 2 -> hell o; (hell,o) rank 3 -> hello = 259.
  // " world" = Ġ w o r l d: (Ġ,w) 4 -> Ġw o r l d; (o,r) 5 -> Ġw or l d; (Ġw,or) 6; (Ġwor,l) 7;
  // (Ġworl,d) 8 -> Ġworld = 264.
  EXPECT_THAT(Encode("hello world"), ElementsAre(259, 264));
  // "hell": (l,l) rank 0 is merged first although (h,e) is to its left -> h e ll -> he ll ->
  // hell = 258.
  EXPECT_THAT(Encode("hell"), ElementsAre(258));
  // "hel": (h,e) rank 1 and (e,l) rank 17 both want the e; rank 1 wins -> he l = 257, 'l' (108).
  // Merging left to right or by (e,l) first would give h el.
  EXPECT_THAT(Encode("hel"), ElementsAre(257, 'l'));
  // "lll": both (l,l) pairs have rank 0; encoder.py merges occurrences left to right without
  // overlap -> ll l. "llll" -> ll ll.
  EXPECT_THAT(Encode("lll"), ElementsAre(256, 'l'));
  EXPECT_THAT(Encode("llll"), ElementsAre(256, 256));
  // " hello": one pre-token Ġ h e l l o; Ġ has no merge with h, the rest is as above.
  EXPECT_THAT(Encode(" hello"), ElementsAre(' ', 259));
}

TEST_F(Gpt2BpeToyTest, Contractions) {
  // "he's": pre-tokens "he", "'s" (the contraction alternatives come first): he = 257, then
  // (',s) rank 9 -> 's = 265.
  EXPECT_THAT(Encode("he's"), ElementsAre(257, 265));
  // "we're": "we" (no merges: 'w' 'e'), "'re": (',r) 15 -> 'r e; ('r,e) 16 -> 're = 272.
  EXPECT_THAT(Encode("we're"), ElementsAre('w', 'e', 272));
  // Case-sensitive, as in GPT-2: "HE'S" is "HE", "'" (a punctuation run, stopped by the letter),
  // "S".
  EXPECT_THAT(Encode("HE'S"), ElementsAre('H', 'E', '\'', 'S'));
  // " 's": the space joins the punctuation run " '" (` ?[^\s\p{L}\p{N}]+`), then "s".
  EXPECT_THAT(Encode(" 's"), ElementsAre(' ', '\'', 's'));
}

TEST_F(Gpt2BpeToyTest, Digits) {
  // "abc123 12": pre-tokens "abc" (letters), "123" (` ?\p{N}+`), " 12".
  // "123": (1,2) rank 10 -> 12 3 = 266, '3'. " 12": Ġ 1 2 -> Ġ 12 = ' ', 266.
  EXPECT_THAT(Encode("abc123 12"), ElementsAre('a', 'b', 'c', 266, '3', ' ', 266));
}

TEST_F(Gpt2BpeToyTest, PunctuationRuns) {
  // "hello!!! !!": "hello", "!!!" (one run), " !!" (space + run).
  // "!!!": both (!,!) pairs rank 11, left to right -> !! ! = 267, '!'. " !!": Ġ !! = ' ', 267.
  EXPECT_THAT(Encode("hello!!! !!"), ElementsAre(259, 267, '!', ' ', 267));
  // "a.,;b": "a", ".,;", "b": no merges.
  EXPECT_THAT(Encode("a.,;b"), ElementsAre('a', '.', ',', ';', 'b'));
}

TEST_F(Gpt2BpeToyTest, WhitespaceRuns) {
  // "a  b": "a", then at the first space ` ?\p{L}+` fails (space, space), `\s+(?!\S)` takes
  // both spaces, sees 'b' and backtracks to one: " "; then " b". -> 'a', ' ', ' ', 'b'.
  EXPECT_THAT(Gpt2PreTokenize("a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Encode("a  b"), ElementsAre('a', ' ', ' ', 'b'));
  // "a   b": "a", "  " ((Ġ,Ġ) rank 12 -> ĠĠ = 268), " b".
  EXPECT_THAT(Encode("a   b"), ElementsAre('a', 268, ' ', 'b'));
  // Trailing spaces: `\s+(?!\S)` takes the whole run at the end: "   " = Ġ Ġ Ġ -> ĠĠ Ġ.
  EXPECT_THAT(Encode("a   "), ElementsAre('a', 268, ' '));
  // Non-ASCII whitespace (U+3000, 3 bytes E3 80 80) is \s but never the optional space:
  // "a\u3000b" -> "a", "\u3000" (`\s+` alone), "b".
  EXPECT_THAT(Gpt2PreTokenize("a\u3000b"), ElementsAre("a", "\u3000", "b"));
  EXPECT_THAT(Encode("a\u3000b"), ElementsAre('a', 0xE3, 0x80, 0x80, 'b'));
}

TEST_F(Gpt2BpeToyTest, Newlines) {
  // "a\n\nb": the run "\n\n" before 'b' backtracks to "\n"; the second "\n" is a single
  // whitespace before a non-space and not a space, so it is `\s+` alone.
  EXPECT_THAT(Gpt2PreTokenize("a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(Encode("a\n\nb"), ElementsAre('a', '\n', '\n', 'b'));
  // At the end of the text the run stays whole: "\n\n" = Ċ Ċ -> (Ċ,Ċ) rank 13 -> ĊĊ = 269.
  EXPECT_THAT(Encode("a\n\n"), ElementsAre('a', 269));
  // "a\n\n b": the run "\n\n " backtracks to "\n\n" (269) and the space joins "b".
  EXPECT_THAT(Gpt2PreTokenize("a\n\n b"), ElementsAre("a", "\n\n", " b"));
  EXPECT_THAT(Encode("a\n\n b"), ElementsAre('a', 269, ' ', 'b'));
  // Windows line ends: "\r\n" before 'b' is "\r" (the backtracked run) and "\n" (`\s+`).
  EXPECT_THAT(Gpt2PreTokenize("a\r\nb"), ElementsAre("a", "\r", "\n", "b"));
}

TEST_F(Gpt2BpeToyTest, NonAsciiLetters) {
  // "café" is one \p{L}+ pre-token; é is C3 A9 = symbols Ã ©, merged by rank 14 into 270.
  EXPECT_THAT(Encode("café"), ElementsAre('c', 'a', 'f', 270));
  // " 漢字": letters (Lo) with the space: bytes 20 E6 BC A2 E5 AD 97, no merges.
  EXPECT_THAT(Gpt2PreTokenize("a 漢字!"), ElementsAre("a", " 漢字", "!"));
  EXPECT_THAT(Encode(" 漢字"), ElementsAre(' ', 0xE6, 0xBC, 0xA2, 0xE5, 0xAD, 0x97));
  // Numbers beyond ASCII are \p{N}: Arabic-Indic three (U+0663) and ½ (No) join "12".
  EXPECT_THAT(Gpt2PreTokenize("x12\u0663½y"), ElementsAre("x", "12\u0663½", "y"));
}

TEST_F(Gpt2BpeToyTest, EmojiAreBytes) {
  // 😀 (F0 9F 98 80) is a symbol (So), so "hi😀😀!" is "hi", "😀😀!" (one punctuation run); with
  // no merges every byte is its own token.
  EXPECT_THAT(Gpt2PreTokenize("hi😀😀!"), ElementsAre("hi", "😀😀!"));
  EXPECT_THAT(Encode("hi😀"), ElementsAre('h', 'i', 0xF0, 0x9F, 0x98, 0x80));
}

TEST_F(Gpt2BpeToyTest, InvalidUtf8IsEncodedBytewise) {
  // Each invalid byte is a character of the punctuation class: "a\xff\xfeb" -> "a",
  // "\xff\xfe", "b"; a truncated "é" (C3 alone) before "x" likewise.
  const std::string text =
      "a\xff\xfe"
      "b\xc3";
  EXPECT_THAT(Gpt2PreTokenize(text), ElementsAre("a", "\xff\xfe", "b", "\xc3"));
  EXPECT_THAT(Encode(text), ElementsAre('a', 0xFF, 0xFE, 'b', 0xC3));
  // Overlong "/" (C0 AF) and a UTF-16 surrogate (ED A0 80) are not characters either.
  EXPECT_THAT(Encode("\xc0\xaf\xed\xa0\x80"), ElementsAre(0xC0, 0xAF, 0xED, 0xA0, 0x80));
}

TEST_F(Gpt2BpeToyTest, EndOfTextInTheTextIsOrdinaryText) {
  // The control token is appended by the caller, never parsed from a document: "<|", "endoftext",
  // "|>".
  EXPECT_THAT(Gpt2PreTokenize("<|endoftext|>"), ElementsAre("<|", "endoftext", "|>"));
  const Ids ids = Encode("<|endoftext|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 274), 0);
  absl::StatusOr<std::string> decoded = bpe_->Decode(Ids{274});
  NF_ASSERT_OK(decoded);
  EXPECT_EQ(*decoded, "<|endoftext|>");
}

TEST_F(Gpt2BpeToyTest, EndOfTextIsTheTokenWhenSpecialTokensAreParsed) {
  // As Hugging Face tokenizers reads GPT-2's added special token: the text is cut at each
  // "<|endoftext|>" first and the text between is pre-tokenized on its own.
  NF_ASSERT_OK(bpe_->ParseSpecialTokens(true));
  EXPECT_EQ(bpe_->special_token_text(), "<|endoftext|>");
  EXPECT_THAT(Encode("hello<|endoftext|> world"), ElementsAre(259, 274, 264));
  EXPECT_THAT(Encode("<|endoftext|>"), ElementsAre(274));
  EXPECT_THAT(Encode("<|endoftext|><|endoftext|>"), ElementsAre(274, 274));
  // " " is a piece of its own, never " <|" as when the literal is text.
  EXPECT_THAT(Encode(" <|endoftext|>"), ElementsAre(' ', 274));
  EXPECT_THAT(Encode("hello <|endoftext|>hello"), ElementsAre(259, ' ', 274, 259));
  // Only the exact literal: another case, a prefix, and the one inside a longer text.
  const Ids other = Encode("<|ENDOFTEXT|> <|endoftext");
  EXPECT_EQ(std::count(other.begin(), other.end(), 274), 0);
  const Ids inner = Encode("<|endo<|endoftext|>ftext|>");
  EXPECT_EQ(std::count(inner.begin(), inner.end(), 274), 1);
  // Off again: text.
  NF_ASSERT_OK(bpe_->ParseSpecialTokens(false));
  EXPECT_EQ(bpe_->special_token_text(), "");
  const Ids text = Encode("hello<|endoftext|> world");
  EXPECT_EQ(std::count(text.begin(), text.end(), 274), 0);
}

TEST(Gpt2BpeTest, ParsingSpecialTokensNeedsEndOfTextInTheVocabulary) {
  const std::unique_ptr<Gpt2Bpe> bpe = MakeBpe(MakeToy({"h e"}, {}));
  ExpectInvalidArgument(bpe->ParseSpecialTokens(true), "no \"<|endoftext|>\" token");
  NF_EXPECT_OK(bpe->ParseSpecialTokens(false));
}

TEST_F(Gpt2BpeToyTest, RandomBytesRoundTrip) {
  std::mt19937 rng(42);
  // Bytes drawn mostly from a set that exercises every class and broken UTF-8.
  const std::string interesting = "ab lo1!'s\n\t\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80\xff\x80";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(std::uniform_int_distribution<int>(0, 40)(rng), '\0');
    for (char& c : text) {
      c = rng() % 3 == 0 ? static_cast<char>(rng()) : interesting[rng() % interesting.size()];
    }
    absl::StatusOr<Ids> ids = bpe_->Encode(text);
    NF_ASSERT_OK(ids);
    for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < bpe_->vocab_size()) << id;
    absl::StatusOr<std::string> decoded = bpe_->Decode(*ids);
    NF_ASSERT_OK(decoded);
    ASSERT_EQ(*decoded, text);
  }
}

TEST_F(Gpt2BpeToyTest, ConcurrentEncodingAgrees) {
  const std::string text = "hello world, he's here!!  12 café\n\n hello hell lll";
  const Ids expected = Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<Ids> ids = bpe_->Encode(absl::StrCat(text, " ", i % 7));
        if (!ids.ok() || !std::equal(expected.begin(), expected.end(), ids->begin())) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

TEST_F(Gpt2BpeToyTest, DecodeRejectsUnknownIds) {
  ExpectInvalidArgument(bpe_->Decode(Ids{1, 275}).status(), "id 275 at position 1");
  ExpectInvalidArgument(bpe_->Decode(Ids{-1}).status(), "id -1 at position 0");
}

// encoder.py's bpe() transcribed over symbol strings: repeatedly take the pair of lowest rank
// and merge all its occurrences left to right.
std::vector<std::string> ReferenceBpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.push_back(std::string(1, c));
  while (symbols.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> best_pair;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        best_pair = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == best_pair.first &&
          symbols[i + 1] == best_pair.second) {
        merged.push_back(symbols[i] + symbols[i + 1]);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols = std::move(merged);
  }
  return symbols;
}

TEST(Gpt2BpeTest, MergeOrderMatchesEncoderPyOnRandomMergeTables) {
  std::mt19937 rng(7);
  for (int table = 0; table < 30; ++table) {
    // Random merges over "abc" whose file order is shuffled, so a merge often has a better rank
    // than the merges that build its parts: the case where merging one rank completely before
    // the pairs it creates matters.
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::string> merges;
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (merges.size() < 25) {
      const std::string l = tokens[rng() % tokens.size()];
      const std::string r = tokens[rng() % tokens.size()];
      if (l.size() + r.size() > 6 || ranks.count({l, r})) continue;
      ranks[{l, r}] = 0;
      merges.push_back(l + " " + r);
      if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) tokens.push_back(l + r);
    }
    std::shuffle(merges.begin(), merges.end(), rng);
    for (size_t i = 0; i < merges.size(); ++i) {
      const size_t space = merges[i].find(' ');
      ranks[{merges[i].substr(0, space), merges[i].substr(space + 1)}] = static_cast<int>(i);
    }
    const ToyFiles toy = MakeToy(merges, {});
    const std::unique_ptr<Gpt2Bpe> bpe = MakeBpe(toy);
    for (int trial = 0; trial < 100; ++trial) {
      std::string word(1 + rng() % 30, 'a');
      for (char& c : word) c = "abc"[rng() % 3];
      Ids expected;
      for (const std::string& symbol : ReferenceBpe(word, ranks)) {
        expected.push_back(toy.ids.at(symbol));
      }
      absl::StatusOr<Ids> ids = bpe->Encode(word);
      NF_ASSERT_OK(ids);
      ASSERT_EQ(*ids, expected) << "word " << word << " merges " << absl::StrJoin(merges, ", ");
    }
  }
}

TEST(Gpt2BpeTest, LongPreTokenIsFast) {
  // One 1 MB pre-token of digits: quadratic merging would take minutes.
  const std::unique_ptr<Gpt2Bpe> bpe = MakeBpe(MakeToy({"1 2", "12 12", "1212 1212"}, {}));
  std::string digits;
  for (int i = 0; i < 500000; ++i) digits += "12";
  absl::StatusOr<Ids> ids = bpe->Encode(digits);
  NF_ASSERT_OK(ids);
  EXPECT_EQ(ids->size(), 500000u / 4);
}

TEST(UnicodeClassTest, SpotChecks) {
  EXPECT_EQ(ClassifyCodePoint('x'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(0xAA), CharClass::kLetter);     // ª (Lo)
  EXPECT_EQ(ClassifyCodePoint(0x1C5), CharClass::kLetter);    // ǅ (Lt)
  EXPECT_EQ(ClassifyCodePoint(0x2B0), CharClass::kLetter);    // ʰ (Lm)
  EXPECT_EQ(ClassifyCodePoint(0x105C0), CharClass::kLetter);  // Todhri letter a (Unicode 16)
  EXPECT_EQ(ClassifyCodePoint(0xB2), CharClass::kNumber);     // ² (No)
  EXPECT_EQ(ClassifyCodePoint(0x216B), CharClass::kNumber);   // Ⅻ (Nl)
  EXPECT_EQ(ClassifyCodePoint(0x1D7CE), CharClass::kNumber);  // mathematical bold zero (Nd)
  EXPECT_EQ(ClassifyCodePoint(0x10D40), CharClass::kNumber);  // Garay digit zero (Unicode 16)
  EXPECT_EQ(ClassifyCodePoint(0x85), CharClass::kSpace);      // NEL
  EXPECT_EQ(ClassifyCodePoint(0x205F), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(0x1C), CharClass::kOther);    // \s in Python's re, not in regex
  EXPECT_EQ(ClassifyCodePoint(0x200B), CharClass::kOther);  // zero-width space: not White_Space
  EXPECT_EQ(ClassifyCodePoint(0x301), CharClass::kOther);   // combining acute (Mn)
  EXPECT_EQ(ClassifyCodePoint(0x1F600), CharClass::kOther);
  EXPECT_EQ(ClassifyCodePoint(0x10FFFF), CharClass::kOther);
  // Letters of Unicode 17, after the Unicode 16 of HF tokenizers' regex engine
  // (data/gen_unicode_classes.py): CJK extension J, Sidetic.
  EXPECT_EQ(ClassifyCodePoint(0x323B0), CharClass::kOther);
  EXPECT_EQ(ClassifyCodePoint(0x10940), CharClass::kOther);
  // The longest code point and the first past Unicode's range.
  EXPECT_EQ(NextUtf8Char("\xF4\x8F\xBF\xBF", 0).length, 4);
  EXPECT_EQ(NextUtf8Char("\xF4\x90\x80\x80", 0).length, 1);
}

TEST(VocabJsonTest, EscapesAndSurrogatePairs) {
  absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> vocab =
      ParseVocabJson(R"({"\u0120the": 0, "\ud83d\ude00": 1, "a\"\\\/\n": 2, "é": 3})", "v.json");
  NF_ASSERT_OK(vocab);
  EXPECT_EQ(vocab->at("\xC4\xA0the"), 0);  // U+0120, GPT-2's space symbol
  EXPECT_EQ(vocab->at("😀"), 1);
  EXPECT_EQ(vocab->at("a\"\\/\n"), 2);
  EXPECT_EQ(vocab->at("é"), 3);
}

TEST(VocabJsonTest, ErrorsNameFileLineAndColumn) {
  const auto error = [](absl::string_view json) { return ParseVocabJson(json, "v.json").status(); };
  ExpectInvalidArgument(error("{\"a\": 1,\n \"b\" 2}"), "v.json:2:6: expected ':'");
  ExpectInvalidArgument(error("{\"a\": 1.5}"), "v.json:1:8: ids must be integers");
  ExpectInvalidArgument(error("{\"a\": -1}"), "v.json:1:7: id -1 is outside");
  ExpectInvalidArgument(error("{\"a\": 3000000000}"), "id 3000000000 is outside");
  ExpectInvalidArgument(error("{\"a\": 01}"), "leading zero");
  ExpectInvalidArgument(error("{\"a\": 1, \"a\": 2}"), "v.json:1:10: duplicate key \"a\"");
  ExpectInvalidArgument(error("{\"a\": 1,}"), "expected a string key");
  ExpectInvalidArgument(error("{\"a\": 1} x"), "unexpected text after the object");
  ExpectInvalidArgument(error("[1]"), "expected '{'");
  ExpectInvalidArgument(error("{\"\\x\": 1}"), "unknown escape");
  ExpectInvalidArgument(error("{\"\\ud83d\": 1}"), "high surrogate without its low surrogate");
  ExpectInvalidArgument(error("{\"\\ude00\": 1}"), "unpaired low surrogate");
  ExpectInvalidArgument(error("{\"\xff\": 1}"), "invalid UTF-8");
  ExpectInvalidArgument(error("{\"a\n\": 1}"), "control character");
  ExpectInvalidArgument(error("{\"a\": 1"), "expected ',' or '}'");
  ExpectInvalidArgument(error(""), "v.json:1:1: expected '{'");
}

class Gpt2BpeLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) / absl::StrCat("nf_gpt2_bpe_test_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  // The error of loading the toy vocabulary with `merges_txt`.
  absl::Status MergesError(const std::string& merges_txt) {
    return Gpt2Bpe::FromContents(MakeToy({"l l"}, {}).vocab_json, merges_txt, "v.json", "m.txt")
        .status();
  }

  std::filesystem::path dir_;
};

TEST_F(Gpt2BpeLoadTest, LoadsFiles) {
  const ToyFiles toy = MakeToy(ToyMerges(), {});
  absl::StatusOr<std::unique_ptr<Gpt2Bpe>> bpe =
      Gpt2Bpe::Load(Write("vocab.json", toy.vocab_json), Write("merges.txt", toy.merges_txt));
  NF_ASSERT_OK(bpe);
  EXPECT_EQ((*bpe)->end_of_document(), std::nullopt);  // no "<|endoftext|>" in this one
  absl::StatusOr<Ids> ids = (*bpe)->Encode("hello world");
  NF_ASSERT_OK(ids);
  EXPECT_THAT(*ids, ElementsAre(259, 264));
}

TEST_F(Gpt2BpeLoadTest, MissingFileIsNamed) {
  const std::string merges = Write("merges.txt", "#version: 0.2\n");
  const std::string missing = (dir_ / "no_such_vocab.json").string();
  const absl::Status status = Gpt2Bpe::Load(missing, merges).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(missing));
}

TEST_F(Gpt2BpeLoadTest, BadVocabularies) {
  const std::string merges = Write("merges.txt", "#version: 0.2\n");
  const std::string bad_json = Write("bad.json", "{\"a\": 0,\n\"b\": }");
  ExpectInvalidArgument(Gpt2Bpe::Load(bad_json, merges).status(),
                        absl::StrCat(bad_json, ":2:6: expected an integer id"));
  const auto load = [](const std::string& vocab_json) {
    return Gpt2Bpe::FromContents(vocab_json, "#version: 0.2\n", "v.json", "m.txt").status();
  };
  // Ids must be 0..N-1.
  ExpectInvalidArgument(load(R"({"a": 0, "b": 2})"), "v.json: ids must be 0..1");
  ExpectInvalidArgument(load(R"({"a": 1, "b": 1})"), "v.json: id 1 is used by both");
  // Byte-level vocabularies have all 256 byte symbols: this one lacks "Ā" (byte 0x00).
  ExpectInvalidArgument(load(R"({"a": 0})"), "v.json: no token for byte 0x00");
}

TEST_F(Gpt2BpeLoadTest, BadMerges) {
  ExpectInvalidArgument(MergesError("l l\n"), "m.txt:1: expected the \"#version");
  ExpectInvalidArgument(MergesError(""), "m.txt:1: expected the \"#version");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl l\na b c\n"),
                        "m.txt:3: expected two tokens separated by one space");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl\n"), "m.txt:2: expected two tokens");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl  l\n"), "m.txt:2: expected two tokens");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl l\r\n"), "m.txt:2: expected two tokens");
  ExpectInvalidArgument(MergesError("#version: 0.2\n\nl l\n"), "m.txt:2: expected two tokens");
  ExpectInvalidArgument(MergesError("#version: 0.2\nzz l\n"),
                        "m.txt:2: token \"zz\" is not in v.json");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl l\na b\n"),
                        "m.txt:3: merged token \"ab\" is not in v.json");
  ExpectInvalidArgument(MergesError("#version: 0.2\nl l\nl l\n"),
                        "m.txt:3: duplicate merge \"l l\" (first on line 2)");
  // Without a final newline the last merge still counts.
  NF_EXPECT_OK(MergesError("#version: 0.2\nl l"));
}

}  // namespace
}  // namespace nf::data
