#include "data/sentencepiece_tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "data/grapheme_cluster.h"
#include "data/sentencepiece_model_options.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

absl::Status ToStatus(const sentencepiece_backend::Result& result, absl::string_view context) {
  if (result.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(result.code),
                      absl::StrCat(context, ": ", result.message));
}

// Fails like open(2) would for a file SentencePiece could not read. A directory opens, but
// SentencePiece's own read of it throws (std::ios_base::failure, naming no file): EISDIR here.
absl::Status CheckReadable(const std::string& path, absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", what, " ", path));
  struct stat info;
  const int error = ::fstat(fd, &info) != 0 ? errno : S_ISDIR(info.st_mode) ? EISDIR : 0;
  ::close(fd);
  if (error != 0) return absl::ErrnoToStatus(error, absl::StrCat("cannot open ", what, " ", path));
  return absl::OkStatus();
}

// See preferred_chunk_bytes() in the header.
constexpr size_t kUnigramChunkBytes = 4096;

// SentencePiece 0.1.97 joins consecutive unknown pieces into one <unk> by copying the text joined
// so far once per character (PopulateSentencePieceText), so one Encode call on a run of n
// characters outside the vocabulary takes time quadratic in n ('é' x 400k: 22 s; byte-fallback
// models, whose byte pieces are not joined, are linear; known pieces are linear in any script,
// with or without whitespace: the lattice's width is bounded by the longest piece). Encode
// therefore cuts such runs: every kUnknownRunProbeBytes it looks for a cut near there, and
// encodes the text on either side apart, splicing their ids (Splice). The side after the cut is
// encoded without the dummy prefix's word start (with whitespace as suffix, the side before it
// without the dummy suffix): that is the model loaded with add_dummy_prefix off (bare_). A
// cut is exact, the ids those of the whole text, between two unknown grapheme clusters: no
// piece holds an unknown character, so the best segmentation of the whole text splits there
// (and no BPE merge spans it), and the <unk>s on either side are the one <unk> the whole text
// has there. Unknown is judged on grapheme clusters, not characters: the normalizer composes
// 'e' + U+0301 into 'é', unknown where 'e' is known, so a run of them (issue 45: 400k in 7.1
// s) was not cut when each character was looked at alone; and a cluster is never split, which
// would change its normal form. Each cut is checked on the kCutCheckCharacters characters on
// either side, encoded whole and cut (the normalizer may still join characters across it); a
// cut that fails is not made, and the next cluster boundaries are tried. Inside one cluster
// longer than kCandidateCharacters ('e' followed by 100k combining marks) the probe cuts
// between two characters that are each unknown, checked the same way. A run that still goes
// kForcedCutBytes without an exact cut is cut at a probe all the same (the text is kept; only
// the normalizer's work across that one cut may differ). A run within one call is thus at most
// ~2 KiB in every known case ('é' x 1.6M: 0.36 s, linear), kForcedCutBytes + 2 KiB in any; text
// outside such runs costs a table lookup per 2 KiB where the probe meets ASCII, one
// one-cluster encode (~15 us) elsewhere.
constexpr size_t kUnknownRunProbeBytes = 2048;
constexpr int kCutCheckCharacters = 8;
// Characters after a probe searched for a cluster boundary, and the longest cluster looked at.
constexpr int kCandidateCharacters = 16;

// Where a text's single space goes when it is cut there (Tokenizer::space_at_cut). With a dummy
// prefix, the next chunk's own implicit space stands for it, whichever side the pieces keep
// whitespace on ("a b" is "▁a▁b", or "a▁b▁" as suffixes: "▁a" + "▁b", "a▁" + "b▁"). Without one,
// the space stays with the chunk whose pieces hold it.
Tokenizer::SpaceAtCut SpaceAtCutOf(const SentencePieceModelOptions& options) {
  if (options.add_dummy_prefix) return Tokenizer::SpaceAtCut::kDropped;
  return options.treat_whitespace_as_suffix ? Tokenizer::SpaceAtCut::kEndsPrevious
                                            : Tokenizer::SpaceAtCut::kStartsNext;
}

// Unicode's White_Space characters, as UTF-8 (what the chunker's whitespace class holds).
constexpr const char* kWhiteSpace[] = {
    "\t",     "\n",     "\v",     "\f",     "\r",     " ",      "\u0085", "\u00A0", "\u1680",
    "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
    "\u2009", "\u200A", "\u2028", "\u2029", "\u202F", "\u205F", "\u3000"};

// The whitespace characters a text may be cut before (Tokenizer::CutsBeforeWhitespace). Only
// where the model removes extra whitespace (a run of it, at a chunk's edge or not, is one word
// boundary) and no piece spans whitespace; then those characters its normalizer makes a word
// boundary of, found by encoding probes both ways: NFKC makes most of them a space, but deletes
// U+000B (joining the words around it) and keeps U+0085 as a character, and a model may carry
// its own normalization rules.
std::vector<std::string> WhitespaceCuts(const sentencepiece_backend::Model& model,
                                        const SentencePieceModelOptions& options) {
  std::vector<std::string> cuts;
  if (!options.remove_extra_whitespaces || !options.split_by_whitespace) return cuts;
  const auto encode = [&model](const std::string& text) {
    std::vector<int> ids;
    return model.Encode(text, &ids).ok() ? ids : std::vector<int>{-1};
  };
  // Words of several scripts and lengths, before and after the whitespace, also in a run.
  static const std::pair<const char*, const char*> kProbes[] = {
      {"a", "b"}, {"the", "cat"}, {"x1", "2y"}, {"\u6f22", "\u5b57"}, {"a.", ",b"}};
  for (const char* c : kWhiteSpace) {
    bool exact = true;
    for (const auto& [before, after] : kProbes) {
      for (const std::string& rest : {std::string(c) + after, std::string(c) + "  " + after}) {
        std::vector<int> chunked = encode(before);
        const std::vector<int> next = encode(rest);
        chunked.insert(chunked.end(), next.begin(), next.end());
        exact = exact && chunked == encode(before + rest);
      }
    }
    if (exact) cuts.emplace_back(c);
  }
  return cuts;
}

// SentencePiece's trainer skips empty lines and lines longer than its max_sentence_length, and
// when that leaves none it fails with "Internal: [!sentences_.empty()]" after some 60 lines of its
// log (issue 45: one line of 200k characters). OK when an input has a line it trains on (found
// at once in any real corpus: the scan stops there), else FailedPrecondition saying why and
// what to do, before SentencePiece runs. An input that cannot be read is left to the caller.
absl::Status CheckTrainableLines(const std::vector<std::string>& inputs, size_t max_line_bytes,
                                 absl::string_view context) {
  int64_t lines = 0;  // not empty, all longer than max_line_bytes
  size_t shortest = SIZE_MAX;
  std::vector<char> buffer(size_t{1} << 16);
  for (const std::string& input : inputs) {
    const int fd = ::open(input.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::OkStatus();
    size_t line = 0;  // bytes of the current line so far
    bool ok = true;
    while (true) {
      const ssize_t got = ::read(fd, buffer.data(), buffer.size());
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ok = got == 0;
        break;
      }
      for (ssize_t i = 0; i < got; ++i) {
        if (buffer[i] != '\n') {
          ++line;
          continue;
        }
        if (line > 0 && line <= max_line_bytes) {
          ::close(fd);
          return absl::OkStatus();
        }
        if (line > 0) ++lines, shortest = std::min(shortest, line);
        line = 0;
      }
    }
    ::close(fd);
    if (!ok) return absl::OkStatus();  // SentencePiece will say what is wrong
    if (line > 0 && line <= max_line_bytes) return absl::OkStatus();
    if (line > 0) ++lines, shortest = std::min(shortest, line);
  }
  if (lines == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": the training text is empty (no line with a character)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      context, ": no line of the training text has 1 to ", max_line_bytes,
      " bytes, and SentencePiece skips longer lines (",
      lines == 1 ? absl::StrCat("its one line has ", shortest, " bytes")
                 : absl::StrCat("its ", lines, " lines have ", shortest, " bytes or more"),
      "): break the text into lines (sentences or paragraphs) of at most ", max_line_bytes,
      " bytes"));
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<sentencepiece_backend::Model> model,
                                               std::unique_ptr<sentencepiece_backend::Model> bare,
                                               const SentencePieceModelOptions& options)
    : model_(std::move(model)),
      bare_(std::move(bare)),
      space_at_cut_(SpaceAtCutOf(options)),
      whitespace_cuts_(WhitespaceCuts(*model_, options)),
      preferred_chunk_bytes_(options.unigram ? kUnigramChunkBytes : SIZE_MAX),
      dummy_as_suffix_(options.treat_whitespace_as_suffix),
      unk_id_(model_->unk_id()) {
  for (size_t c = 0; c < unknown_ascii_.size(); ++c) {
    unknown_ascii_[c] = EncodesAsUnknown(std::string(1, static_cast<char>(c)));
  }
}

bool SentencePieceTokenizer::CutsBeforeWhitespace(absl::string_view whitespace) const {
  return std::find(whitespace_cuts_.begin(), whitespace_cuts_.end(), whitespace) !=
         whitespace_cuts_.end();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  // SentencePiece's own message for a missing file does not say which one.
  if (absl::Status readable = CheckReadable(path, "SentencePiece model"); !readable.ok()) {
    return readable;
  }
  std::unique_ptr<sentencepiece_backend::Model> model;
  const sentencepiece_backend::Result result = sentencepiece_backend::Model::Load(path, &model);
  if (!result.ok()) {
    // A file that does not parse as a model comes back as kInternal; it is the input's fault.
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load SentencePiece model ", path, ": ", result.message));
  }
  const absl::StatusOr<SentencePieceModelOptions> options =
      ReadModelOptions(model->serialized_proto());
  if (!options.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load SentencePiece model ", path, ": ", options.status().message()));
  }
  std::unique_ptr<sentencepiece_backend::Model> bare;
  if (options->add_dummy_prefix) {
    const sentencepiece_backend::Result loaded =
        sentencepiece_backend::Model::LoadFromSerializedProto(
            WithoutDummyPrefix(model->serialized_proto()), &bare);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load SentencePiece model ", path, " without its dummy prefix: ", loaded.message));
    }
  }
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(model), std::move(bare), *options));
}

absl::Status SentencePieceTokenizer::Train(const SentencePieceTrainOptions& options) {
  const auto invalid = [](const auto&... what) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece training: ", what...));
  };
  if (options.inputs.empty()) return invalid("no input files");
  if (options.model_prefix.empty()) return invalid("empty model prefix");
  if (options.vocab_size <= 0)
    return invalid("vocab_size must be positive, not ", options.vocab_size);
  if (options.num_threads <= 0) return invalid("num_threads must be positive");
  if (!(options.character_coverage > 0 && options.character_coverage <= 1)) {
    return invalid("character_coverage must be in (0, 1], not ", options.character_coverage);
  }
  if (options.input_sentence_size < 0) return invalid("input_sentence_size must be >= 0");
  for (const std::string& input : options.inputs) {
    // SentencePiece takes the inputs as one comma-separated flag.
    if (absl::StrContains(input, ',')) return invalid("input path has a comma: ", input);
    if (absl::Status s = CheckReadable(input, "training input"); !s.ok()) return s;
  }
  const std::string context = absl::StrCat("SentencePiece training of ", options.model_prefix);
  NF_RETURN_IF_ERROR(CheckTrainableLines(options.inputs, kMaxTrainingLineBytes, context));
  const std::unordered_map<std::string, std::string> flags = {
      {"input", absl::StrJoin(options.inputs, ",")},
      {"model_prefix", options.model_prefix},
      {"vocab_size", absl::StrCat(options.vocab_size)},
      {"model_type", options.model_type},
      {"character_coverage", absl::StrCat(options.character_coverage)},
      {"byte_fallback", options.byte_fallback ? "true" : "false"},
      {"input_sentence_size", absl::StrCat(options.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", absl::StrCat(options.num_threads)},
  };
  return ToStatus(sentencepiece_backend::Train(flags), context);
}

sentencepiece_backend::Result SentencePieceTokenizer::EncodeOnce(absl::string_view text,
                                                                 bool starts_word, bool ends_word,
                                                                 std::vector<int>* ids) const {
  const bool dummy = dummy_as_suffix_ ? ends_word : starts_word;
  const sentencepiece_backend::Model& model = dummy || bare_ == nullptr ? *model_ : *bare_;
  return model.Encode(std::string_view(text.data(), text.size()), ids);
}

std::optional<std::vector<int>> SentencePieceTokenizer::TryEncode(absl::string_view text,
                                                                  bool starts_word,
                                                                  bool ends_word) const {
  std::vector<int> ids;
  if (!EncodeOnce(text, starts_word, ends_word, &ids).ok()) return std::nullopt;
  return ids;
}

bool SentencePieceTokenizer::IsUnknown(absl::string_view text) const {
  const auto first_byte = static_cast<unsigned char>(text.front());
  if (text.size() == 1 && first_byte < unknown_ascii_.size()) return unknown_ascii_[first_byte];
  return EncodesAsUnknown(text);
}

bool SentencePieceTokenizer::EncodesAsUnknown(absl::string_view text) const {
  const std::optional<std::vector<int>> ids = TryEncode(text, false, false);
  return ids && !ids->empty() &&
         std::all_of(ids->begin(), ids->end(), [&](int id) { return model_->IsUnknownOrByte(id); });
}

void SentencePieceTokenizer::Splice(std::vector<int>& ids, std::span<const int> next) const {
  const bool joined = !ids.empty() && !next.empty() && ids.back() == unk_id_ && next[0] == unk_id_;
  ids.insert(ids.end(), next.begin() + (joined ? 1 : 0), next.end());
}

void SentencePieceTokenizer::AppendIds(std::vector<int32_t>& ids,
                                       std::span<const int32_t> next) const {
  static_assert(std::is_same_v<int, int32_t>, "SentencePiece's ids are int");
  Splice(ids, next);
}

namespace {

// The kCutCheckCharacters characters on either side of `at`: [from, to).
std::pair<size_t, size_t> CheckWindow(absl::string_view text, size_t at) {
  size_t from = at, to = at;
  for (int i = 0; i < kCutCheckCharacters && from > 0; ++i) {
    from = PreviousUtf8CharStart(text, from);
  }
  for (int i = 0; i < kCutCheckCharacters && to < text.size(); ++i) {
    to += NextUtf8Char(text, to).length;
  }
  return {from, to};
}

}  // namespace

std::optional<SentencePieceTokenizer::CutIds> SentencePieceTokenizer::IdsAroundCut(
    absl::string_view text, size_t at) const {
  const auto [from, to] = CheckWindow(text, at);
  std::optional<std::vector<int>> whole = TryEncode(text.substr(from, to - from));
  std::optional<std::vector<int>> spliced = TryEncode(text.substr(from, at - from), true, false);
  const std::optional<std::vector<int>> right = TryEncode(text.substr(at, to - at), false, true);
  if (!whole || !spliced || !right) return std::nullopt;
  Splice(*spliced, *right);
  return CutIds{.whole = *std::move(whole), .spliced = *std::move(spliced)};
}

bool SentencePieceTokenizer::KeepsTextAcrossCut(absl::string_view text, size_t at) const {
  const std::optional<CutIds> ids = IdsAroundCut(text, at);
  if (!ids) return false;
  if (ids->spliced == ids->whole) return true;
  std::string whole_text, spliced_text;
  return model_->Decode(ids->whole, &whole_text).ok() &&
         model_->Decode(ids->spliced, &spliced_text).ok() && whole_text == spliced_text;
}

bool SentencePieceTokenizer::CutKeepsIds(absl::string_view text, size_t at) const {
  const std::optional<CutIds> ids = IdsAroundCut(text, at);
  return ids && ids->spliced == ids->whole;
}

SentencePieceTokenizer::Probe SentencePieceTokenizer::ProbeUnknownRun(absl::string_view text,
                                                                      size_t at) const {
  // The grapheme cluster that ends at, or starts at, a cluster boundary (at most
  // kCandidateCharacters characters of it).
  const auto cluster_before = [&](size_t end) {
    size_t start = PreviousUtf8CharStart(text, end);
    for (int i = 1; i < kCandidateCharacters && !IsGraphemeClusterBoundary(text, start); ++i) {
      start = PreviousUtf8CharStart(text, start);
    }
    return text.substr(start, end - start);
  };
  const auto cluster_after = [&](size_t start) {
    size_t end = start + NextUtf8Char(text, start).length;
    for (int i = 1; i < kCandidateCharacters && !IsGraphemeClusterBoundary(text, end); ++i) {
      end += NextUtf8Char(text, end).length;
    }
    return text.substr(start, end - start);
  };
  Probe probe;
  bool boundary_seen = false;
  size_t pos = at;
  for (int i = 0; i < kCandidateCharacters && pos < text.size();
       ++i, pos += NextUtf8Char(text, pos).length) {
    if (!IsGraphemeClusterBoundary(text, pos)) continue;
    boundary_seen = true;
    // Known text on either side: not in a run (or at its end, which the next probe is past).
    if (!IsUnknown(cluster_before(pos)) || !IsUnknown(cluster_after(pos))) return probe;
    probe.unknown = true;
    if (CutKeepsIds(text, pos)) {
      probe.cut = pos;
      return probe;
    }
  }
  if (!boundary_seen) {
    // Inside a cluster of more than kCandidateCharacters characters: between two characters
    // that are unknown on their own.
    const size_t before = PreviousUtf8CharStart(text, at);
    if (IsUnknown(text.substr(before, at - before)) &&
        IsUnknown(text.substr(at, NextUtf8Char(text, at).length))) {
      probe.unknown = true;
      if (CutKeepsIds(text, at)) probe.cut = at;
    }
  }
  return probe;
}

std::vector<size_t> SentencePieceTokenizer::UnknownRunCuts(absl::string_view text) const {
  std::vector<size_t> cuts;
  size_t last = 0;
  for (size_t probe = kUnknownRunProbeBytes; probe < text.size(); probe += kUnknownRunProbeBytes) {
    size_t at = probe;
    while (at < text.size() && at < probe + 3 && IsUtf8Continuation(text[at])) ++at;
    if (at >= text.size() || at <= last) continue;
    const Probe found = ProbeUnknownRun(text, at);
    if (found.cut) {
      last = *found.cut;
      cuts.push_back(last);
    } else if (found.unknown && at - last >= kForcedCutBytes) {
      last = at;
      cuts.push_back(last);
    }
  }
  return cuts;
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::EncodeWords(absl::string_view text,
                                                                         bool starts_word,
                                                                         bool ends_word) const {
  std::vector<size_t> ends = UnknownRunCuts(text);
  ends.push_back(text.size());
  std::vector<int> ids;
  size_t begin = 0;
  for (const size_t end : ends) {
    std::vector<int> next;
    NF_RETURN_IF_ERROR(
        ToStatus(EncodeOnce(text.substr(begin, end - begin), begin == 0 && starts_word,
                            end == text.size() && ends_word, &next),
                 "SentencePiece Encode"));
    Splice(ids, next);
    begin = end;
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text) const {
  return EncodeWords(text, true, true);
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::EncodeInsideWord(
    absl::string_view chunk, bool starts_inside_word, bool ends_inside_word) const {
  return EncodeWords(chunk, !starts_inside_word, !ends_inside_word);
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SentencePiece Decode: id ", ids[i], " at position ", i,
                       " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
  }
  std::string text;
  if (absl::Status s = ToStatus(model_->Decode(std::vector<int>(ids.begin(), ids.end()), &text),
                                "SentencePiece Decode");
      !s.ok()) {
    return s;
  }
  return text;
}

std::optional<int32_t> SentencePieceTokenizer::end_of_document() const {
  const int eos = model_->eos_id();
  if (eos < 0) return std::nullopt;
  return eos;
}

std::optional<int32_t> SentencePieceTokenizer::begin_of_document() const {
  const int bos = model_->bos_id();
  if (bos < 0) return std::nullopt;
  return bos;
}

}  // namespace nf::data
