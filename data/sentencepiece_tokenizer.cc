#include "data/sentencepiece_tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/sentencepiece_model_options.h"

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

// Where a text's single space goes when it is cut there (Tokenizer::space_at_cut). With a dummy
// prefix, the next chunk's own implicit space stands for it, whichever side the pieces keep
// whitespace on ("a b" is "▁a▁b", or "a▁b▁" as suffixes: "▁a" + "▁b", "a▁" + "b▁"). Without one,
// the space stays with the chunk whose pieces hold it.
Tokenizer::SpaceAtCut SpaceAtCutOf(const SentencePieceWhitespaceOptions& options) {
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
                                        const SentencePieceWhitespaceOptions& options) {
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
                                               SpaceAtCut space_at_cut,
                                               std::vector<std::string> whitespace_cuts)
    : model_(std::move(model)),
      space_at_cut_(space_at_cut),
      whitespace_cuts_(std::move(whitespace_cuts)) {}

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
  const absl::StatusOr<SentencePieceWhitespaceOptions> options =
      ReadWhitespaceOptions(model->serialized_proto());
  if (!options.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load SentencePiece model ", path, ": ", options.status().message()));
  }
  std::vector<std::string> whitespace_cuts = WhitespaceCuts(*model, *options);
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(
      std::move(model), SpaceAtCutOf(*options), std::move(whitespace_cuts)));
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

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text) const {
  std::vector<int> ids;
  if (absl::Status s = ToStatus(model_->Encode(std::string_view(text.data(), text.size()), &ids),
                                "SentencePiece Encode");
      !s.ok()) {
    return s;
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
