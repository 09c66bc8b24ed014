#include "data/sentencepiece_tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
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
// models, whose byte pieces are not joined, are linear). Encode therefore cuts such runs: every
// kUnknownRunProbeBytes it looks at the character boundary there, and where the characters on
// both sides are unknown it encodes the two sides apart and splices their ids. That is exact, as
// no piece holds an unknown character: the best segmentation of the whole text splits there (and
// no BPE merge spans it), the splice drops the second side's dummy-prefix word start and makes
// the two sides' <unk>s the one <unk> the whole text has. Each cut is checked on the
// kCutCheckCharacters characters on either side, encoded whole and cut (the normalizer may join
// characters across it, and the splice does not cover every option, e.g. whitespace as a
// suffix); a cut that fails the check is not made. A run of unknown characters within one call
// is thus at most ~2 KiB ('é' x 1.6M: 0.36 s, linear), and text without one costs a table
// lookup per 2 KiB where the probe meets ASCII, one one-character encode (~15 us) elsewhere.
constexpr size_t kUnknownRunProbeBytes = 2048;
constexpr int kCutCheckCharacters = 8;

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

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<sentencepiece_backend::Model> model,
                                               const SentencePieceModelOptions& options)
    : model_(std::move(model)),
      space_at_cut_(SpaceAtCutOf(options)),
      whitespace_cuts_(WhitespaceCuts(*model_, options)),
      preferred_chunk_bytes_(options.unigram ? kUnigramChunkBytes : SIZE_MAX),
      add_dummy_prefix_(options.add_dummy_prefix),
      unk_id_(model_->unk_id()),
      word_start_id_(model_->PieceToId("\u2581")) {
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
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(model), *options));
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
  return ToStatus(sentencepiece_backend::Train(flags),
                  absl::StrCat("SentencePiece training of ", options.model_prefix));
}

std::optional<std::vector<int>> SentencePieceTokenizer::TryEncode(absl::string_view text) const {
  std::vector<int> ids;
  if (!model_->Encode(std::string_view(text.data(), text.size()), &ids).ok()) return std::nullopt;
  return ids;
}

bool SentencePieceTokenizer::IsUnknownCharacter(absl::string_view character) const {
  const auto first_byte = static_cast<unsigned char>(character.front());
  if (character.size() == 1 && first_byte < unknown_ascii_.size()) {
    return unknown_ascii_[first_byte];
  }
  return EncodesAsUnknown(character);
}

bool SentencePieceTokenizer::EncodesAsUnknown(absl::string_view character) const {
  const std::optional<std::vector<int>> ids = TryEncode(character);
  if (!ids || ids->empty()) return false;
  const size_t first = add_dummy_prefix_ && ids->front() == word_start_id_ ? 1 : 0;
  return first < ids->size() && std::all_of(ids->begin() + first, ids->end(),
                                            [&](int id) { return model_->IsUnknownOrByte(id); });
}

void SentencePieceTokenizer::AppendSpliced(std::vector<int>& ids,
                                           const std::vector<int>& next) const {
  size_t from = 0;
  if (add_dummy_prefix_ && next.size() > 1 && next[0] == word_start_id_ &&
      model_->IsUnknownOrByte(next[1])) {
    from = 1;
  }
  if (!ids.empty() && from < next.size() && ids.back() == unk_id_ && next[from] == unk_id_) {
    ++from;
  }
  ids.insert(ids.end(), next.begin() + static_cast<std::ptrdiff_t>(from), next.end());
}

bool SentencePieceTokenizer::IsCutInUnknownRun(absl::string_view text, size_t at) const {
  const size_t before = PreviousUtf8CharStart(text, at);
  if (!IsUnknownCharacter(text.substr(at, NextUtf8Char(text, at).length)) ||
      !IsUnknownCharacter(text.substr(before, at - before))) {
    return false;
  }
  size_t from = at, to = at;
  for (int i = 0; i < kCutCheckCharacters && from > 0; ++i)
    from = PreviousUtf8CharStart(text, from);
  for (int i = 0; i < kCutCheckCharacters && to < text.size(); ++i) {
    to += NextUtf8Char(text, to).length;
  }
  const std::optional<std::vector<int>> whole = TryEncode(text.substr(from, to - from));
  std::optional<std::vector<int>> spliced = TryEncode(text.substr(from, at - from));
  const std::optional<std::vector<int>> right = TryEncode(text.substr(at, to - at));
  if (!whole || !spliced || !right) return false;
  AppendSpliced(*spliced, *right);
  return *spliced == *whole;
}

std::vector<size_t> SentencePieceTokenizer::UnknownRunCuts(absl::string_view text) const {
  std::vector<size_t> cuts;
  for (size_t probe = kUnknownRunProbeBytes; probe < text.size(); probe += kUnknownRunProbeBytes) {
    size_t at = probe;
    while (at < text.size() && at < probe + 3 && IsUtf8Continuation(text[at])) ++at;
    if (at < text.size() && IsCutInUnknownRun(text, at)) cuts.push_back(at);
  }
  return cuts;
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text) const {
  std::vector<size_t> ends = UnknownRunCuts(text);
  ends.push_back(text.size());
  std::vector<int> ids;
  size_t begin = 0;
  for (const size_t end : ends) {
    std::vector<int> next;
    NF_RETURN_IF_ERROR(
        ToStatus(model_->Encode(std::string_view(text.data() + begin, end - begin), &next),
                 "SentencePiece Encode"));
    if (begin == 0) {
      ids = std::move(next);
    } else {
      AppendSpliced(ids, next);
    }
    begin = end;
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
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

}  // namespace nf::data
