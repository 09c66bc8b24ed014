// The data pipeline on a corpus made here, deterministically: pseudo-English JSONL (words of a
// fixed generated vocabulary at Zipf-like frequencies, sentences, punctuation, paragraphs,
// documents of widely varied length), a SentencePiece model trained on a sample of it, and a
// GPT-2 byte-level BPE whose merges are learned here from the word list. Measured:
//   1. data::Preprocess (JSONL -> .bin/.idx, as nf-preprocess runs it) with SentencePiece, the
//      GPT-2 BPE and a do-nothing tokenizer (the pipeline without encoding), at 1 and 2
//      workers; and, to see where its time goes, the reader alone (file reading and the JSON
//      scan) and each tokenizer's Encode alone over the documents held in memory, on 1 and 2
//      threads sharing the tokenizer as the workers do (and, for the GPT-2 BPE, whose word
//      cache is shared, on 2 threads with a tokenizer each);
//   2. the batch loader over the SentencePiece dataset (train split of "969,30,1"): the sample
//      index build (cold, and loaded from its cache) and reading the training stream through
//      BatchLoader::Next, against the memcpy ceiling measured at the start of the same run;
//   3. SentencePiece's encoding time on adversarial text (issue 45): one document of n
//      repetitions of a unit without whitespace (a combining sequence, Hangul jamo, CJK, an
//      emoji ZWJ sequence, glued words, one cluster of n combining marks), n = 200k and 400k,
//      encoded as nf-preprocess does (EncodeInChunks); the median time of each and the ratio,
//      which is 2 for linear time (4 for quadratic: 'e' + U+0301 took 2.41 and 7.11 s before).
// Everything lives in a temporary directory, removed at the end. --adversarial-only runs 3
// alone (with a model trained on a 4 MB corpus).
//
//   NF_NUM_THREADS=2 build/bench/nf-bench-data [--corpus-mb N] [--runs N] [--keep]
//                                              [--adversarial-only]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/ceilings.h"
#include "bench/statistics.h"
#include "core/status.h"
#include "data/batch_loader.h"
#include "data/blending.h"
#include "data/chunked_encoding.h"
#include "data/document_reader.h"
#include "data/gpt2_bpe.h"
#include "data/gpt_samples.h"
#include "data/indexed_document_source.h"
#include "data/preprocess.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/splits.h"
#include "data/tokenizer.h"

namespace nf::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kVocabularyWords = 5000;  // distinct words of the corpus
constexpr int kSpmVocabSize = 8000;
constexpr int64_t kSpmSampleBytes = int64_t{4} << 20;  // text SentencePiece trains on
constexpr int kGpt2Merges = 1000;
constexpr char kSplit[] = "969,30,1";
constexpr int64_t kMicroBatch = 4, kGlobalBatch = 8;
constexpr int64_t kSeqLens[] = {2048, 128};
constexpr double kLoaderEpochs = 2.0;  // the training stream covers the train split this often
constexpr int kLoaderPasses = 5;       // timed passes over the stream, after one warm-up

// SplitMix64: a fixed generator, so the corpus is the same on every machine and library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
  bool Chance(double p) { return Uniform() < p; }

 private:
  uint64_t state_;
};

// ---- The corpus ----------------------------------------------------------------------------

// The most frequent words, in rank order, then a few accented ones (UTF-8) further down.
constexpr const char* kCommonWords[] = {
    "the",   "of",     "and",   "to",     "a",       "in",    "is",    "that",    "for",   "it",
    "as",    "was",    "with",  "be",     "by",      "on",    "not",   "he",      "this",  "are",
    "or",    "his",    "from",  "at",     "which",   "but",   "have",  "an",      "had",   "they",
    "you",   "were",   "their", "one",    "all",     "we",    "can",   "her",     "has",   "there",
    "been",  "if",     "more",  "when",   "will",    "would", "who",   "so",      "no",    "she",
    "other", "its",    "may",   "these",  "what",    "them",  "than",  "some",    "him",   "time",
    "into",  "only",   "do",    "could",  "new",     "about", "two",   "first",   "then",  "also",
    "any",   "our",    "my",    "like",   "such",    "made",  "over",  "people",  "years", "most",
    "must",  "should", "after", "before", "through", "where", "many",  "because", "while", "state",
    "world", "house",  "water", "under",  "never",   "again", "place", "small",   "great", "right"};
constexpr const char* kAccentedWords[] = {"café", "naïve", "résumé", "façade", "über", "señor"};

// kVocabularyWords distinct words in rank order: the common words, then pseudo-English words of
// consonant-vowel syllables, shorter ones first (frequent words are short).
std::vector<std::string> MakeWords() {
  static constexpr const char* kOnsets[] = {"",   "b",  "c",  "d",  "f",  "g",  "h",  "j",  "k",
                                            "l",  "m",  "n",  "p",  "r",  "s",  "t",  "v",  "w",
                                            "st", "tr", "ch", "sh", "th", "pl", "gr", "br", "cr"};
  static constexpr const char* kVowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "ai", "io", "y"};
  static constexpr const char* kCodas[] = {"",  "",   "",   "n",  "r",  "s",  "t",
                                           "l", "nd", "st", "ng", "rt", "ck", "m"};
  static constexpr const char* kSuffixes[] = {"ing", "ed", "s", "ly", "tion", "er", "ment", "ness"};
  Rng rng(20261130);
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> words;
  for (const char* w : kCommonWords) {
    seen.insert(w);
    words.push_back(w);
  }
  std::vector<std::pair<int, std::string>> generated;  // (syllables, word)
  while (static_cast<int>(words.size() + generated.size()) <
         kVocabularyWords - static_cast<int>(std::size(kAccentedWords))) {
    const int syllables = 1 + rng.Below(3) + (rng.Chance(0.3) ? 1 : 0);
    std::string word;
    for (int s = 0; s < syllables; ++s) {
      absl::StrAppend(&word, kOnsets[rng.Below(std::size(kOnsets))],
                      kVowels[rng.Below(std::size(kVowels))], kCodas[rng.Below(std::size(kCodas))]);
    }
    if (rng.Chance(0.25)) absl::StrAppend(&word, kSuffixes[rng.Below(std::size(kSuffixes))]);
    if (word.size() < 2 || !seen.insert(word).second) continue;
    generated.emplace_back(syllables, std::move(word));
  }
  std::stable_sort(generated.begin(), generated.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [syllables, word] : generated) words.push_back(std::move(word));
  // The accented words at ranks 500, 1000, ...: rare, but present.
  for (size_t i = 0; i < std::size(kAccentedWords); ++i) {
    words.insert(words.begin() + 500 * (i + 1), kAccentedWords[i]);
  }
  return words;
}

// Zipf's law, p(rank r) ~ 1 / (r + 2.7), as word frequencies of English roughly follow
// (Mandelbrot's shift keeps "the" from taking a third of the text).
class ZipfSampler {
 public:
  explicit ZipfSampler(int n) : cumulative_(n) {
    double sum = 0;
    for (int r = 0; r < n; ++r) cumulative_[r] = sum += Weight(r);
    for (double& c : cumulative_) c /= sum;
  }
  static double Weight(int rank) { return 1.0 / (rank + 2.7); }
  int Sample(Rng& rng) const {
    const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), rng.Uniform());
    return std::min(static_cast<int>(it - cumulative_.begin()),
                    static_cast<int>(cumulative_.size()) - 1);
  }

 private:
  std::vector<double> cumulative_;
};

// One document: sentences of 3-26 words (a capital first, commas, now and then a number or a
// quotation, ending in . ? or !), paragraphs split by blank lines; 1-150 sentences, log-uniform,
// so document lengths range from tens of bytes to over 10 KB.
std::string MakeDocument(const std::vector<std::string>& words, const ZipfSampler& zipf, Rng& rng) {
  const int sentences = static_cast<int>(std::exp(rng.Uniform() * std::log(150.0)));
  std::string text;
  for (int s = 0; s < sentences; ++s) {
    const int length = 3 + rng.Below(12) + rng.Below(12);
    const bool quoted = rng.Chance(0.04);
    if (quoted) text += '"';
    for (int w = 0; w < length; ++w) {
      if (w > 0) text += ' ';
      if (rng.Chance(0.02)) {
        absl::StrAppend(&text, rng.Below(rng.Chance(0.5) ? 100 : 10000));
      } else {
        std::string word = words[zipf.Sample(rng)];
        if (w == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = word[0] - 'a' + 'A';
        text += word;
      }
      if (w + 1 < length && rng.Chance(0.08)) text += rng.Chance(0.9) ? ',' : ';';
    }
    const double end = rng.Uniform();
    text += end < 0.88 ? '.' : end < 0.96 ? '?' : '!';
    if (quoted) text += '"';
    if (s + 1 < sentences) text += rng.Chance(0.15) ? "\n\n" : " ";
  }
  return text;
}

void AppendJsonString(absl::string_view text, std::string& out) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  out += '"';
}

struct Corpus {
  std::string jsonl_path;     // {"id": N, "source": "nf-bench-data", "text": "..."} per line
  std::string spm_text_path;  // a sample of the documents, one paragraph per line
  int64_t bytes = 0;          // of the JSONL file
  int64_t text_bytes = 0;     // of the documents' text
  int64_t documents = 0;
  int64_t sample_bytes = 0, sample_lines = 0;
  std::vector<int64_t> document_bytes;
  double seconds = 0;
};

absl::StatusOr<Corpus> WriteCorpus(const fs::path& dir, const std::vector<std::string>& words,
                                   int64_t target_bytes) {
  const auto start = std::chrono::steady_clock::now();
  Corpus corpus;
  corpus.jsonl_path = (dir / "corpus.jsonl").string();
  corpus.spm_text_path = (dir / "spm-sample.txt").string();
  std::ofstream jsonl(corpus.jsonl_path, std::ios::binary | std::ios::trunc);
  std::ofstream sample(corpus.spm_text_path, std::ios::binary | std::ios::trunc);
  // Checked right after each call: a stream keeps no reason, and errno holds the failed call's
  // only until the next call that sets it.
  const auto failed = [&] {
    return absl::UnavailableError(absl::StrCat("cannot write ",
                                               !jsonl ? corpus.jsonl_path : corpus.spm_text_path,
                                               ": ", std::strerror(errno)));
  };
  if (!jsonl || !sample) return failed();
  const ZipfSampler zipf(static_cast<int>(words.size()));
  Rng rng(42);
  std::string line;
  while (corpus.bytes < target_bytes) {
    const std::string text = MakeDocument(words, zipf, rng);
    line =
        absl::StrCat("{\"id\": ", corpus.documents, ", \"source\": \"nf-bench-data\", \"text\": ");
    AppendJsonString(text, line);
    line += "}\n";
    jsonl << line;
    corpus.bytes += static_cast<int64_t>(line.size());
    corpus.text_bytes += static_cast<int64_t>(text.size());
    corpus.document_bytes.push_back(static_cast<int64_t>(text.size()));
    // Every 4th document, until the sample is full: SentencePiece's training text.
    if (corpus.documents % 4 == 0 && corpus.sample_bytes < kSpmSampleBytes) {
      for (absl::string_view paragraph : absl::StrSplit(text, "\n\n")) {
        sample << paragraph << '\n';
        corpus.sample_bytes += static_cast<int64_t>(paragraph.size()) + 1;
        ++corpus.sample_lines;
      }
    }
    ++corpus.documents;
    if (!jsonl || !sample) return failed();
  }
  jsonl.flush();
  if (!jsonl) return failed();
  sample.flush();
  if (!sample) return failed();
  corpus.seconds = Seconds(start);
  return corpus;
}

// ---- Tokenizers ----------------------------------------------------------------------------

// GPT-2's bytes_to_unicode symbol of a byte, as UTF-8.
std::string ByteSymbol(int b) {
  const auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
  };
  int code_point = b;
  if (!printable(b)) {
    code_point = 256;
    for (int x = 0; x < b; ++x) code_point += printable(x) ? 0 : 1;
  }
  std::string utf8;
  if (code_point < 0x80) {
    utf8 += static_cast<char>(code_point);
  } else {
    utf8 += static_cast<char>(0xC0 | (code_point >> 6));
    utf8 += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return utf8;
}

std::string Symbols(absl::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += ByteSymbol(static_cast<unsigned char>(c));
  return out;
}

struct Gpt2Files {
  std::string vocab_json, merges_txt;
  int64_t vocab_size = 0;
  double seconds = 0;
};

// Byte-level BPE learned on the vocabulary: each word as GPT-2's pre-tokenizer sees it inside a
// sentence (" word"), weighted by its Zipf frequency; the most frequent adjacent pair is merged,
// kGpt2Merges times (ties to the lower pair of ids; a pair whose concatenation is already a
// token is passed over, so no merge repeats). vocab.json: the 256 byte symbols, the merged
// tokens in merge order, then <|endoftext|>.
Gpt2Files MakeGpt2Files(const std::vector<std::string>& words) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> tokens;  // id -> bytes
  absl::flat_hash_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string(1, static_cast<char>(b)));
    token_ids[tokens.back()] = b;
  }
  std::vector<std::vector<int32_t>> pieces;
  std::vector<double> weights;
  for (size_t r = 0; r < words.size(); ++r) {
    const std::string piece = absl::StrCat(" ", words[r]);
    pieces.emplace_back();
    for (const char c : piece) pieces.back().push_back(static_cast<unsigned char>(c));
    weights.push_back(ZipfSampler::Weight(static_cast<int>(r)));
  }
  const auto key = [](int32_t l, int32_t r) {
    return static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(r);
  };
  std::string merges = "#version: 0.2\n";
  for (int m = 0; m < kGpt2Merges; ++m) {
    absl::flat_hash_map<uint64_t, double> counts;
    for (size_t w = 0; w < pieces.size(); ++w) {
      for (size_t i = 0; i + 1 < pieces[w].size(); ++i) {
        counts[key(pieces[w][i], pieces[w][i + 1])] += weights[w];
      }
    }
    uint64_t best = 0;
    double best_count = -1;
    for (const auto& [pair, count] : counts) {
      if (count < best_count || (count == best_count && pair > best)) continue;
      const std::string merged = tokens[pair >> 32] + tokens[pair & 0xffffffffu];
      if (token_ids.contains(merged)) continue;
      best = pair;
      best_count = count;
    }
    if (best_count < 0) break;
    const int32_t left = static_cast<int32_t>(best >> 32), right = static_cast<int32_t>(best);
    const int32_t merged = static_cast<int32_t>(tokens.size());
    tokens.push_back(tokens[left] + tokens[right]);
    token_ids[tokens.back()] = merged;
    absl::StrAppend(&merges, Symbols(tokens[left]), " ", Symbols(tokens[right]), "\n");
    for (std::vector<int32_t>& piece : pieces) {
      size_t out = 0;
      for (size_t i = 0; i < piece.size(); ++i) {
        if (i + 1 < piece.size() && piece[i] == left && piece[i + 1] == right) {
          piece[out++] = merged;
          ++i;
        } else {
          piece[out++] = piece[i];
        }
      }
      piece.resize(out);
    }
  }
  std::vector<std::string> members;
  for (size_t id = 0; id < tokens.size(); ++id) {
    std::string member;
    AppendJsonString(Symbols(tokens[id]), member);
    absl::StrAppend(&member, ": ", id);
    members.push_back(std::move(member));
  }
  members.push_back(absl::StrCat("\"<|endoftext|>\": ", tokens.size()));
  return {.vocab_json = absl::StrCat("{", absl::StrJoin(members, ", "), "}\n"),
          .merges_txt = std::move(merges),
          .vocab_size = static_cast<int64_t>(tokens.size()) + 1,
          .seconds = Seconds(start)};
}

// The pipeline without the encoding: one token per 4 bytes of text (about what the real
// tokenizers give), each a byte of the text, so that batching and writing cost what they cost.
class DoNothingTokenizer final : public data::Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    std::vector<int32_t> ids(text.size() / 4);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<unsigned char>(text[4 * i]);
    return ids;
  }
  // Every 4th byte of the text, as Encode kept them.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return std::string(ids.begin(), ids.end());
  }
  int64_t vocab_size() const override { return kSpmVocabSize; }
  std::optional<int32_t> end_of_document() const override { return 0; }
};

// SentencePiece's trainer logs a page to stderr; while in scope, stderr goes to a file.
class StderrToFile {
 public:
  explicit StderrToFile(const std::string& path) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (saved_ >= 0 && fd >= 0) ::dup2(fd, STDERR_FILENO);
    if (fd >= 0) ::close(fd);
  }
  ~StderrToFile() {
    std::fflush(stderr);
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
  }
  StderrToFile(const StderrToFile&) = delete;
  StderrToFile& operator=(const StderrToFile&) = delete;

 private:
  int saved_;
};

absl::Status TrainSentencePiece(const Corpus& corpus, const std::string& prefix) {
  const std::string log = prefix + ".train.log";
  absl::Status status;
  {
    const StderrToFile quiet(log);
    status = data::SentencePieceTokenizer::Train({.inputs = {corpus.spm_text_path},
                                                  .model_prefix = prefix,
                                                  .vocab_size = kSpmVocabSize,
                                                  .model_type = "unigram",
                                                  .character_coverage = 0.9995,
                                                  .byte_fallback = false,
                                                  .input_sentence_size = 0,
                                                  .num_threads = 2});
  }
  if (!status.ok()) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "%s", text.substr(text.size() > 4000 ? text.size() - 4000 : 0).c_str());
  }
  return status;
}

// ---- Measurements --------------------------------------------------------------------------

struct PreprocessRow {
  std::string tokenizer;
  int workers = 0;  // 0: the reader alone
  double seconds = 0;
  int64_t tokens = 0;
};

// data::Preprocess of the corpus, `runs` times, each run with a tokenizer from make_tokenizer
// (so a tokenizer's caches start cold every run); the median wall time, fsync included.
template <typename MakeTokenizer>
absl::StatusOr<PreprocessRow> TimePreprocess(const Corpus& corpus, const std::string& prefix,
                                             absl::string_view name, int workers, int runs,
                                             MakeTokenizer&& make_tokenizer) {
  std::vector<double> seconds;
  int64_t tokens = 0;
  for (int run = 0; run < runs; ++run) {
    NF_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, make_tokenizer());
    const auto start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(const data::PreprocessProgress done,
                        data::Preprocess({.inputs = {corpus.jsonl_path},
                                          .format = data::InputFormat::kJsonl,
                                          .json_key = "text",
                                          .output_prefix = prefix,
                                          .workers = workers,
                                          .append_end_of_document = true,
                                          .documents_per_batch = 64},
                                         *tokenizer, nullptr));
    seconds.push_back(Seconds(start));
    if (done.bytes != corpus.bytes || done.documents != corpus.documents) {
      return absl::InternalError(absl::StrCat(name, ": preprocessed ", done.documents,
                                              " documents of ", done.bytes, " bytes"));
    }
    tokens = done.tokens;
  }
  return PreprocessRow{.tokenizer = std::string(name),
                       .workers = workers,
                       .seconds = Median(seconds),
                       .tokens = tokens};
}

// The reader alone: DocumentReader over the file (buffered reads, line splitting, the JSON scan
// and unescaping of "text").
absl::StatusOr<PreprocessRow> TimeReader(const Corpus& corpus, int runs) {
  std::vector<double> seconds;
  for (int run = 0; run < runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(
        std::unique_ptr<data::DocumentReader> reader,
        data::DocumentReader::Open(corpus.jsonl_path, data::InputFormat::kJsonl, "text"));
    int64_t documents = 0, bytes = 0;
    while (true) {
      NF_ASSIGN_OR_RETURN(const std::optional<std::string> document, reader->Next());
      if (!document.has_value()) break;
      ++documents;
      bytes += static_cast<int64_t>(document->size());
    }
    seconds.push_back(Seconds(start));
    if (documents != corpus.documents || bytes != corpus.text_bytes) {
      return absl::InternalError(absl::StrCat("reader: ", documents, " documents"));
    }
  }
  return PreprocessRow{.tokenizer = "reader + JSON scan only",
                       .workers = 0,
                       .seconds = Median(seconds),
                       .tokens = 0};
}

// Encoding alone: tokenizer.Encode over every document, held in memory, on `threads` threads
// (thread t encodes documents t, t + threads, ...) sharing one tokenizer, as Preprocess's
// workers do, or each with its own copy (`shared` false). Each is a new thread, like the
// workers: on the main thread, whose heap holds the documents, the GPT-2 BPE encoded ~20% slower.
template <typename MakeTokenizer>
absl::StatusOr<PreprocessRow> TimeEncodeOnly(const std::vector<std::string>& documents,
                                             absl::string_view name, int threads, bool shared,
                                             int runs, MakeTokenizer&& make_tokenizer) {
  std::vector<double> seconds;
  int64_t tokens = 0;
  for (int run = 0; run < runs; ++run) {
    std::vector<std::unique_ptr<data::Tokenizer>> tokenizers;
    for (int t = 0; t < (shared ? 1 : threads); ++t) {
      NF_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, make_tokenizer());
      tokenizers.push_back(std::move(tokenizer));
    }
    std::vector<int64_t> counts(threads, 0);
    std::vector<absl::Status> statuses(threads);
    const auto encode = [&](int t) {
      const data::Tokenizer& tokenizer = *tokenizers[shared ? 0 : t];
      for (size_t d = t; d < documents.size(); d += threads) {
        absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(documents[d]);
        if (!ids.ok()) {
          statuses[t] = ids.status();
          return;
        }
        counts[t] += static_cast<int64_t>(ids->size()) + 1;  // + end of document, as Preprocess
      }
    };
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) workers.emplace_back(encode, t);
    for (std::thread& w : workers) w.join();
    seconds.push_back(Seconds(start));
    for (const absl::Status& status : statuses) NF_RETURN_IF_ERROR(status);
    tokens = 0;
    for (const int64_t count : counts) tokens += count;
  }
  return PreprocessRow{
      .tokenizer = absl::StrCat(name, shared ? ", Encode only" : ", Encode, copy/thread"),
      .workers = threads,
      .seconds = Median(seconds),
      .tokens = tokens};
}

absl::StatusOr<std::vector<std::string>> ReadDocuments(const Corpus& corpus) {
  NF_ASSIGN_OR_RETURN(
      std::unique_ptr<data::DocumentReader> reader,
      data::DocumentReader::Open(corpus.jsonl_path, data::InputFormat::kJsonl, "text"));
  std::vector<std::string> documents;
  while (true) {
    NF_ASSIGN_OR_RETURN(std::optional<std::string> document, reader->Next());
    if (!document.has_value()) break;
    documents.push_back(*std::move(document));
  }
  return documents;
}

struct LoaderRow {
  int64_t seq_len = 0;
  int64_t samples = 0;           // in the training stream
  int64_t epochs = 0;            // of the sample index
  double build_cold_s = 0;       // blending + sample indices built and written to the cache
  double build_cached_s = 0;     // blending + sample indices loaded from the cache
  int64_t micro_batches = 0;     // per pass
  double pass_s = 0;             // median pass over the stream
  int64_t tokens_per_epoch = 0;  // of the train split
};

struct LoaderInputs {
  std::vector<data::GptSamples> samples;
  data::Blending blending;
};

constexpr double kOneDataset[] = {1.0};

absl::StatusOr<LoaderInputs> BuildLoaderInputs(
    const std::shared_ptr<data::IndexedDocumentSource>& source, data::DocumentRange train,
    int64_t seq_len, int64_t samples) {
  NF_ASSIGN_OR_RETURN(data::Blending blending, data::Blending::Build(kOneDataset, samples));
  NF_ASSIGN_OR_RETURN(data::GptSamples built,
                      data::GptSamples::Build(source, {.documents = train,
                                                       .seq_len = seq_len,
                                                       .num_samples = blending.counts()[0],
                                                       .seed = 1234}));
  std::vector<data::GptSamples> all;
  all.push_back(std::move(built));
  return LoaderInputs{.samples = std::move(all), .blending = std::move(blending)};
}

void RemoveSampleCaches(const fs::path& dir) {
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code ignored;  // a cache left behind shows as "cache not removed"
    if (it->path().extension() == ".samples") fs::remove(it->path(), ignored);
  }
}

absl::StatusOr<LoaderRow> MeasureLoader(const std::string& prefix, int64_t vocab_size,
                                        int64_t seq_len, int runs) {
  NF_ASSIGN_OR_RETURN(std::shared_ptr<data::IndexedDocumentSource> source,
                      data::IndexedDocumentSource::Open(prefix));
  NF_ASSIGN_OR_RETURN(const std::vector<data::DocumentRange> splits,
                      data::ParseSplit(kSplit, source->dataset().num_documents()));
  NF_ASSIGN_OR_RETURN(const data::DocumentRange train, source->SequencesOf(splits.front()));
  int64_t train_tokens = 0;
  for (int64_t d = train.begin; d < train.end; ++d) train_tokens += source->document_length(d);
  // Whole global batches covering the train split kLoaderEpochs times.
  const int64_t steps =
      static_cast<int64_t>(kLoaderEpochs * static_cast<double>(train_tokens) / seq_len) /
      kGlobalBatch;
  const int64_t samples = steps * kGlobalBatch;

  LoaderRow row{.seq_len = seq_len, .samples = samples, .tokens_per_epoch = train_tokens};
  std::vector<double> cold, cached;
  std::optional<LoaderInputs> inputs;
  for (int run = 0; run < runs; ++run) {
    RemoveSampleCaches(fs::path(prefix).parent_path());
    auto start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(LoaderInputs built, BuildLoaderInputs(source, train, seq_len, samples));
    cold.push_back(Seconds(start));
    if (built.samples[0].loaded_from_cache()) return absl::InternalError("cache not removed");
    start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(inputs, BuildLoaderInputs(source, train, seq_len, samples));
    cached.push_back(Seconds(start));
    if (!inputs->samples[0].loaded_from_cache()) return absl::InternalError("cache not used");
  }
  row.build_cold_s = Median(cold);
  row.build_cached_s = Median(cached);
  row.epochs = inputs->samples[0].indices().num_epochs;

  NF_ASSIGN_OR_RETURN(
      data::BatchLoader loader,
      data::BatchLoader::Create(std::move(inputs->samples), std::move(inputs->blending),
                                {.seq_len = seq_len,
                                 .global_batch_size = kGlobalBatch,
                                 .micro_batch_size = kMicroBatch,
                                 .data_parallel_size = 1,
                                 .data_parallel_rank = 0,
                                 .vocab_size = vocab_size}));
  row.micro_batches = steps * loader.micro_batches_per_step();
  std::vector<double> passes;
  int64_t checksum = 0;
  for (int run = 0; run <= kLoaderPasses; ++run) {  // the first pass warms up, untimed
    loader.ResumeFrom(0);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < row.micro_batches; ++i) {
      NF_RETURN_IF_ERROR(loader.Next().status());
      checksum += loader.targets().data<int32_t>()[seq_len - 1];
    }
    if (run > 0) passes.push_back(Seconds(start));
  }
  if (checksum < 0) return absl::InternalError("negative token");
  row.pass_s = Median(passes);
  return row;
}

// SentencePiece's encoding time on adversarial text (3. above): for each unit, the median of
// `runs` EncodeInChunks of the unit repeated 200k and 400k times, and their ratio.
absl::Status MeasureAdversarialEncoding(const data::Tokenizer& spm, int runs) {
  struct Unit {
    const char* name;
    std::string text;  // repeated; empty: 'e' and n combining acute accents
  };
  const Unit units[] = {
      {"e + U+0301 (the issue's)", "e\u0301"},
      {"a + U+0300 U+0316", "a\u0300\u0316"},
      {"Hangul jamo L V T", "\u1100\u1161\u11A8"},
      {"CJK", "\u6F22"},
      {"emoji ZWJ family", "\U0001F468\u200D\U0001F469\u200D\U0001F467"},
      {"glued words", "thebest"},
      {"one cluster: e + n U+0301", ""},
  };
  std::printf(
      "\nSentencePiece on adversarial text: one document of n repetitions of a unit, no "
      "whitespace,\nEncodeInChunks as nf-preprocess runs it; median of %d runs. Linear time: "
      "ratio 2 (<= 2.5 asked).\n",
      runs);
  std::printf("%-28s %9s %10s %9s %10s %9s %7s\n", "unit", "n", "bytes", "seconds", "n", "seconds",
              "ratio");
  for (const Unit& unit : units) {
    std::vector<double> medians;
    std::vector<size_t> sizes;
    for (const int n : {200'000, 400'000}) {
      std::string text = unit.text.empty() ? "e" : "";
      for (int i = 0; i < n; ++i) text += unit.text.empty() ? "\u0301" : unit.text;
      std::vector<double> seconds;
      for (int r = 0; r < runs; ++r) {
        const auto start = std::chrono::steady_clock::now();
        NF_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, data::EncodeInChunks(spm, text));
        seconds.push_back(Seconds(start));
        if (ids.empty()) return absl::InternalError("no ids");
      }
      medians.push_back(Median(seconds));
      sizes.push_back(text.size());
    }
    std::printf("%-28s %9d %10zu %9.3f %10d %9.3f %7.2f\n", unit.name, 200'000, sizes[0],
                medians[0], 400'000, medians[1], medians[1] / medians[0]);
  }
  return absl::OkStatus();
}

// ---- Main ----------------------------------------------------------------------------------

struct Flags {
  int64_t corpus_mb = 32;
  int runs = 3;
  bool keep = false;
  bool adversarial_only = false;
};

bool ParseFlags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--corpus-mb" && i + 1 < argc) {
      flags.corpus_mb = std::atoll(argv[++i]);
      if (flags.corpus_mb < 1) return false;
    } else if (arg == "--runs" && i + 1 < argc) {
      flags.runs = std::atoi(argv[++i]);
      if (flags.runs < 1) return false;
    } else if (arg == "--keep") {
      flags.keep = true;
    } else if (arg == "--adversarial-only") {
      flags.adversarial_only = true;
    } else {
      return false;
    }
  }
  return true;
}

absl::Status Run(const Flags& flags, const fs::path& dir) {
  const Ceilings ceilings = MeasureCeilings();
  std::printf(
      "Ceiling measured in this run: memcpy (256 MiB, all %u hardware threads) %.1f GB/s "
      "(bytes read + written)\n",
      std::max(1u, std::thread::hardware_concurrency()), ceilings.memcpy_gbytes_per_s);

  const std::vector<std::string> words = MakeWords();
  const int64_t corpus_bytes = flags.adversarial_only ? 4'000'000 : flags.corpus_mb * 1000 * 1000;
  NF_ASSIGN_OR_RETURN(const Corpus corpus, WriteCorpus(dir, words, corpus_bytes));
  std::vector<int64_t> lengths = corpus.document_bytes;
  std::sort(lengths.begin(), lengths.end());
  std::printf(
      "Corpus: %.1f MB JSONL (%.1f MB of text), %lld documents of %lld B median (min %lld, max "
      "%lld),\n        %zu-word vocabulary at Zipf frequencies; written in %.2f s\n",
      corpus.bytes / 1e6, corpus.text_bytes / 1e6, static_cast<long long>(corpus.documents),
      static_cast<long long>(lengths[lengths.size() / 2]), static_cast<long long>(lengths.front()),
      static_cast<long long>(lengths.back()), words.size(), corpus.seconds);

  const std::string spm_prefix = (dir / "spm").string();
  auto start = std::chrono::steady_clock::now();
  NF_RETURN_IF_ERROR(TrainSentencePiece(corpus, spm_prefix));
  const double spm_train_s = Seconds(start);
  const std::string spm_model = spm_prefix + ".model";
  std::printf(
      "SentencePiece unigram, vocabulary %d: trained on a %.1f MB sample (%lld paragraphs), "
      "2 threads, in %.2f s\n",
      kSpmVocabSize, corpus.sample_bytes / 1e6, static_cast<long long>(corpus.sample_lines),
      spm_train_s);
  if (flags.adversarial_only) {
    NF_ASSIGN_OR_RETURN(const std::unique_ptr<data::SentencePieceTokenizer> spm,
                        data::SentencePieceTokenizer::Load(spm_model));
    return MeasureAdversarialEncoding(*spm, flags.runs);
  }
  const Gpt2Files gpt2 = MakeGpt2Files(words);
  std::printf(
      "GPT-2 byte-level BPE: 256 byte symbols + %d merges learned on the word list + "
      "<|endoftext|> = %lld tokens, learned in %.2f s\n\n",
      kGpt2Merges, static_cast<long long>(gpt2.vocab_size), gpt2.seconds);

  // 1. Preprocessing.
  std::vector<PreprocessRow> rows;
  NF_ASSIGN_OR_RETURN(PreprocessRow reader, TimeReader(corpus, flags.runs));
  rows.push_back(std::move(reader));
  const auto make_null = []() -> absl::StatusOr<std::unique_ptr<data::Tokenizer>> {
    return std::make_unique<DoNothingTokenizer>();
  };
  const auto make_spm = [&]() -> absl::StatusOr<std::unique_ptr<data::Tokenizer>> {
    return data::SentencePieceTokenizer::Load(spm_model);
  };
  const auto make_gpt2 = [&]() -> absl::StatusOr<std::unique_ptr<data::Tokenizer>> {
    return data::Gpt2Bpe::FromContents(gpt2.vocab_json, gpt2.merges_txt);
  };
  const std::string spm_data = (dir / "corpus-spm").string();
  for (const int workers : {1, 2}) {
    NF_ASSIGN_OR_RETURN(PreprocessRow row, TimePreprocess(corpus, (dir / "corpus-null").string(),
                                                          "do-nothing (1 token / 4 B)", workers,
                                                          flags.runs, make_null));
    rows.push_back(std::move(row));
  }
  NF_ASSIGN_OR_RETURN(const std::vector<std::string> documents, ReadDocuments(corpus));
  for (const int threads : {1, 2}) {
    NF_ASSIGN_OR_RETURN(PreprocessRow row, TimeEncodeOnly(documents, "SentencePiece 8k", threads,
                                                          /*shared=*/true, flags.runs, make_spm));
    rows.push_back(std::move(row));
  }
  for (const int workers : {1, 2}) {
    NF_ASSIGN_OR_RETURN(PreprocessRow row, TimePreprocess(corpus, spm_data, "SentencePiece 8k",
                                                          workers, flags.runs, make_spm));
    rows.push_back(std::move(row));
  }
  const std::string gpt2_name = absl::StrCat("GPT-2 BPE ", gpt2.vocab_size);
  for (const int threads : {1, 2}) {
    NF_ASSIGN_OR_RETURN(PreprocessRow row, TimeEncodeOnly(documents, gpt2_name, threads,
                                                          /*shared=*/true, flags.runs, make_gpt2));
    rows.push_back(std::move(row));
  }
  // The BPE's word cache is shared by the threads: the same with a tokenizer per thread.
  NF_ASSIGN_OR_RETURN(
      PreprocessRow unshared,
      TimeEncodeOnly(documents, gpt2_name, 2, /*shared=*/false, flags.runs, make_gpt2));
  rows.push_back(std::move(unshared));
  for (const int workers : {1, 2}) {
    NF_ASSIGN_OR_RETURN(PreprocessRow row,
                        TimePreprocess(corpus, (dir / "corpus-gpt2").string(), gpt2_name, workers,
                                       flags.runs, make_gpt2));
    rows.push_back(std::move(row));
  }
  std::printf(
      "Preprocessing: data::Preprocess, JSONL -> .bin/.idx (uint16 tokens, end-of-document "
      "appended), wall time\nincluding the writer's fsync; median of %d runs. MB/s counts the "
      "JSONL input (also for \"Encode\" rows: the\ndocuments' text, read beforehand, encoded by "
      "`workers` threads sharing one tokenizer, or each with its own\ncopy), bytes/tok the "
      "documents' text.\n",
      flags.runs);
  std::printf("%-36s %7s %9s %8s %12s %12s %10s\n", "tokenizer", "workers", "seconds", "MB/s",
              "tokens", "tokens/s", "bytes/tok");
  for (const PreprocessRow& r : rows) {
    const std::string workers = r.workers == 0 ? "-" : absl::StrCat(r.workers);
    const std::string tokens = r.tokens == 0 ? "-" : absl::StrCat(r.tokens);
    const std::string rate =
        r.tokens == 0 ? "-" : absl::StrFormat("%.0f", static_cast<double>(r.tokens) / r.seconds);
    const std::string per_token =
        r.tokens == 0 ? "-"
                      : absl::StrFormat("%.2f", static_cast<double>(corpus.text_bytes) / r.tokens);
    std::printf("%-36s %7s %9.2f %8.2f %12s %12s %10s\n", r.tokenizer.c_str(), workers.c_str(),
                r.seconds, corpus.bytes / 1e6 / r.seconds, tokens.c_str(), rate.c_str(),
                per_token.c_str());
  }

  // 2. The loader, over the SentencePiece dataset.
  std::printf(
      "\nLoader: BatchLoader::Next over the SentencePiece dataset, train split of \"%s\", micro "
      "batch %lld, global batch %lld;\nthe stream covers the split %.0f times (whole global "
      "batches). Index build = blending + GptSamples::Build\n(cold: built and written to the "
      "cache; cached: loaded from it); median of %d. Pass: median of %d passes after a warm-up.\n"
      "GB/s counts the i32 batch written: inputs + targets, 8 bytes per token.\n",
      kSplit, static_cast<long long>(kMicroBatch), static_cast<long long>(kGlobalBatch),
      kLoaderEpochs, flags.runs, kLoaderPasses);
  std::printf("%7s %11s %7s %10s %10s %10s %9s %11s %12s %7s %9s\n", "seq_len", "epoch tok",
              "epochs", "samples", "cold ms", "cached ms", "pass ms", "samples/s", "tokens/s",
              "GB/s", "vs memcpy");
  NF_ASSIGN_OR_RETURN(const std::unique_ptr<data::SentencePieceTokenizer> spm,
                      data::SentencePieceTokenizer::Load(spm_model));
  for (const int64_t seq_len : kSeqLens) {
    NF_ASSIGN_OR_RETURN(const LoaderRow r,
                        MeasureLoader(spm_data, spm->vocab_size(), seq_len, flags.runs));
    const double samples_per_s = r.micro_batches * kMicroBatch / r.pass_s;
    const double tokens_per_s = samples_per_s * seq_len;
    const double gbytes_per_s = tokens_per_s * 8 / 1e9;
    std::printf("%7lld %11lld %7lld %10lld %10.2f %10.2f %9.1f %11.0f %12.0f %7.2f %9.3f\n",
                static_cast<long long>(r.seq_len), static_cast<long long>(r.tokens_per_epoch),
                static_cast<long long>(r.epochs), static_cast<long long>(r.samples),
                1e3 * r.build_cold_s, 1e3 * r.build_cached_s, 1e3 * r.pass_s, samples_per_s,
                tokens_per_s, gbytes_per_s, gbytes_per_s / ceilings.memcpy_gbytes_per_s);
  }
  return MeasureAdversarialEncoding(*spm, flags.runs);
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: %s [--corpus-mb N (default 32)] [--runs N (default 3)] [--keep] "
                 "[--adversarial-only]\n",
                 argv[0]);
    return 2;
  }
  std::error_code error;
  const fs::path temp = fs::temp_directory_path(error);  // $TMPDIR, if it is a directory
  std::string pattern = ((error ? fs::path("/tmp") : temp) / "nf-bench-data.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path dir = pattern;
  const absl::Status status = Run(flags, dir);
  if (flags.keep) {
    std::printf("\nKept %s\n", dir.c_str());
  } else {
    fs::remove_all(dir, error);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-data: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) { return nf::bench::Main(argc, argv); }
