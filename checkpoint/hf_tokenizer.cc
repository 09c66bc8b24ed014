#include "checkpoint/hf_tokenizer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files/atomic_file.h"
#include "core/files/durable_files.h"
#include "core/json_value.h"
#include "core/status.h"
#include "data/sentencepiece_model_options.h"
#include "data/vocab_json.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kEndOfText[] = "<|endoftext|>";
constexpr char kMask[] = "<mask>";

absl::Status Write(const fs::path& file, const std::string& contents) {
  return ReplaceFileAtomically(file, contents);
}

absl::Status TooManyIds(const fs::path& file, int64_t ids, int64_t vocab_size) {
  return absl::InvalidArgumentError(absl::StrCat(
      file.string(), ": the tokenizer has ", ids, " ids, more than the model's vocab_size ",
      vocab_size, " (is this the tokenizer the model was trained with?)"));
}

// "key": "token" members for each special token that exists.
std::vector<std::string> TokenMembers(
    const std::vector<std::pair<std::string, std::optional<std::string>>>& tokens) {
  std::vector<std::string> members;
  for (const auto& [key, token] : tokens) {
    if (token) members.push_back(absl::StrCat("  ", JsonQuoted(key), ": ", JsonQuoted(*token)));
  }
  return members;
}

std::string Object(const std::vector<std::string>& members) {
  return absl::StrCat("{\n", absl::StrJoin(members, ",\n"), "\n}\n");
}

// The text of the mask token for the masked LM's <mask> id `mask`, which is in [0, vocab_size):
// the tokenizer's own token at that id (`token_at_mask`), else "<mask>", which the tokenizer then
// must not have at another id (`mask_text_id`: the tokenizer's id of "<mask>").
absl::StatusOr<std::string> MaskTokenText(const fs::path& file, int32_t mask,
                                          std::optional<int32_t> end_of_document,
                                          const std::optional<std::string>& token_at_mask,
                                          std::optional<int32_t> mask_text_id) {
  const std::string refused =
      absl::StrCat(file.string(), ": the masked LM's <mask> (model.mask_token) is id ", mask);
  if (mask == end_of_document) {
    return absl::InvalidArgumentError(
        absl::StrCat(refused, ", the tokenizer's end-of-document token ", *token_at_mask));
  }
  if (token_at_mask) return *token_at_mask;
  if (mask_text_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(refused, " but the tokenizer's ", kMask, " is id ", *mask_text_id));
  }
  return std::string(kMask);
}

// An entry of tokenizer.json's added_tokens: a special token, `lstrip` taking in the spaces
// before it.
std::string AddedTokenJson(int32_t id, absl::string_view content, bool lstrip) {
  return absl::StrCat("{\"id\": ", id, ", \"content\": ", JsonQuoted(content),
                      ", \"single_word\": false, \"lstrip\": ", lstrip ? "true" : "false",
                      ", \"rstrip\": false, \"normalized\": true, \"special\": true}");
}

// tokenizer.json: GPT-2's byte-level BPE for Hugging Face `tokenizers` (the format of GPT-2's own
// tokenizer.json), the vocabulary embedded as `vocab_json` holds it and the merges as pairs.
absl::StatusOr<std::string> Gpt2TokenizerJson(const std::string& vocab_json,
                                              const std::string& merges_txt,
                                              const fs::path& merges_file,
                                              const std::vector<std::string>& added_tokens) {
  std::vector<std::string> merges;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(merges_txt, '\n')) {
    ++line_number;
    if (line.empty() || (line_number == 1 && absl::StartsWith(line, "#version"))) continue;
    const std::vector<absl::string_view> pair = absl::StrSplit(line, ' ');
    if (pair.size() != 2 || pair[0].empty() || pair[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(merges_file.string(), ":", line_number,
                                                     ": a merge is two tokens and one space"));
    }
    merges.push_back(absl::StrCat("[", JsonQuoted(pair[0]), ", ", JsonQuoted(pair[1]), "]"));
  }
  const std::string byte_level =
      R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
  return absl::StrCat(
      "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n\"added_tokens\": [",
      absl::StrJoin(added_tokens, ", "),
      "],\n\"normalizer\": null,\n\"pre_tokenizer\": ", byte_level,
      ",\n\"post_processor\": ", byte_level, ",\n\"decoder\": ", byte_level,
      ",\n\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
      "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, "
      "\"byte_fallback\": false, \"ignore_merges\": false,\n\"vocab\": ",
      vocab_json, ",\n\"merges\": [", absl::StrJoin(merges, ",\n"), "]}}\n");
}

absl::StatusOr<std::optional<int32_t>> WriteGpt2(const HfTokenizerFiles& files, const fs::path& dir,
                                                 int64_t vocab_size, int64_t max_seq_len,
                                                 std::optional<int32_t> mask) {
  NF_ASSIGN_OR_RETURN(const std::string vocab_json, ReadWholeFile(files.vocab_file));
  NF_ASSIGN_OR_RETURN(const std::string merges_txt, ReadWholeFile(files.merges_file));
  NF_ASSIGN_OR_RETURN(const auto vocab,
                      data::ParseVocabJson(vocab_json, files.vocab_file.string()));
  if (static_cast<int64_t>(vocab.size()) > vocab_size) {
    return TooManyIds(files.vocab_file, static_cast<int64_t>(vocab.size()), vocab_size);
  }
  std::optional<int32_t> end_of_text;
  std::vector<std::string> added_tokens;
  if (const auto it = vocab.find(kEndOfText); it != vocab.end()) {
    end_of_text = it->second;
    added_tokens.push_back(AddedTokenJson(it->second, kEndOfText, /*lstrip=*/false));
  }
  std::string bpe_vocab = vocab_json;
  std::optional<std::string> mask_text;
  if (mask) {
    std::optional<std::string> token_at_mask;
    for (const auto& [token, id] : vocab) {
      if (id == *mask) token_at_mask = token;
    }
    const auto own_mask = vocab.find(kMask);
    NF_ASSIGN_OR_RETURN(
        mask_text,
        MaskTokenText(files.vocab_file, *mask, end_of_text, token_at_mask,
                      own_mask == vocab.end() ? std::nullopt : std::optional(own_mask->second)));
    if (!token_at_mask) {
      // `tokenizers` gives an added token the id its BPE vocabulary has for it, else the next id
      // past the vocabulary, whatever id added_tokens names: "<mask>" joins the vocabulary, so
      // that it keeps its id even past the next one.
      bpe_vocab.insert(bpe_vocab.find('{') + 1,
                       absl::StrCat(JsonQuoted(kMask), ": ", *mask, vocab.empty() ? "" : ", "));
    }
    added_tokens.push_back(AddedTokenJson(*mask, *mask_text, /*lstrip=*/true));
  }
  NF_ASSIGN_OR_RETURN(const std::string tokenizer_json,
                      Gpt2TokenizerJson(bpe_vocab, merges_txt, files.merges_file, added_tokens));
  NF_RETURN_IF_ERROR(Write(dir / "vocab.json", vocab_json));
  NF_RETURN_IF_ERROR(Write(dir / "merges.txt", merges_txt));
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer.json", tokenizer_json));
  const std::optional<std::string> special =
      end_of_text ? std::optional<std::string>(kEndOfText) : std::nullopt;
  const std::vector<std::pair<std::string, std::optional<std::string>>> tokens = {
      {"bos_token", special},
      {"eos_token", special},
      {"unk_token", special},
      {"mask_token", mask_text}};
  std::vector<std::string> config = {
      R"(  "tokenizer_class": "GPT2Tokenizer")", R"(  "add_prefix_space": false)",
      R"(  "add_bos_token": false)", R"(  "clean_up_tokenization_spaces": false)",
      absl::StrCat(R"(  "model_max_length": )", max_seq_len)};
  for (std::string& member : TokenMembers(tokens)) config.push_back(std::move(member));
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer_config.json", Object(config)));
  NF_RETURN_IF_ERROR(Write(dir / "special_tokens_map.json", Object(TokenMembers(tokens))));
  return end_of_text;
}

absl::StatusOr<std::optional<int32_t>> WriteSentencePiece(const HfTokenizerFiles& files,
                                                          const fs::path& dir, int64_t vocab_size,
                                                          int64_t max_seq_len,
                                                          std::optional<int32_t> mask) {
  NF_ASSIGN_OR_RETURN(const std::string model, ReadWholeFile(files.spm_model));
  absl::StatusOr<data::SentencePieceVocabulary> vocabulary = data::ReadVocabulary(model);
  if (!vocabulary.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.spm_model.string(), ": ", vocabulary.status().message()));
  }
  const int64_t ids = static_cast<int64_t>(vocabulary->pieces.size());
  if (ids == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.spm_model.string(), ": not a SentencePiece model (no pieces)"));
  }
  if (ids > vocab_size) return TooManyIds(files.spm_model, ids, vocab_size);
  const auto piece = [&](std::optional<int32_t> id) -> std::optional<std::string> {
    if (!id) return std::nullopt;
    return vocabulary->pieces[*id];
  };
  const std::vector<std::string>& pieces = vocabulary->pieces;
  std::optional<std::string> mask_text;
  if (mask) {
    const auto own_mask = std::find(pieces.begin(), pieces.end(), kMask);
    NF_ASSIGN_OR_RETURN(
        mask_text,
        MaskTokenText(files.spm_model, *mask, vocabulary->eos_id,
                      *mask < ids ? std::optional(pieces[*mask]) : std::nullopt,
                      own_mask == pieces.end()
                          ? std::nullopt
                          : std::optional(static_cast<int32_t>(own_mask - pieces.begin()))));
  }
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer.model", model));
  const std::vector<std::pair<std::string, std::optional<std::string>>> tokens = {
      // The end-of-document piece, as config.json's bos_token_id: what a context starts after
      // (lm-eval's add_bos_token), never SentencePiece's own <s>, which training never saw.
      {"bos_token", piece(vocabulary->eos_id)},
      {"eos_token", piece(vocabulary->eos_id)},
      {"unk_token", piece(vocabulary->unk_id)},
      {"pad_token", piece(vocabulary->pad_id)},
      {"mask_token", mask_text}};
  std::vector<std::string> config = {R"(  "tokenizer_class": "SentencePieceBackend")",
                                     R"(  "add_bos_token": false)", R"(  "add_eos_token": false)",
                                     R"(  "clean_up_tokenization_spaces": false)",
                                     absl::StrCat(R"(  "model_max_length": )", max_seq_len)};
  for (std::string& member : TokenMembers(tokens)) config.push_back(std::move(member));
  if (mask) {
    // The mask token with its id: SentencePieceBackend would give a token that is not a piece
    // the next id past the pieces.
    config.push_back(absl::StrCat(
        "  \"added_tokens_decoder\": {", JsonQuoted(absl::StrCat(*mask)),
        ": {\"content\": ", JsonQuoted(*mask_text),
        ", \"lstrip\": true, \"normalized\": false, \"rstrip\": false, \"single_word\": false, "
        "\"special\": true}}"));
  }
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer_config.json", Object(config)));
  NF_RETURN_IF_ERROR(Write(dir / "special_tokens_map.json", Object(TokenMembers(tokens))));
  return vocabulary->eos_id;
}

}  // namespace

absl::StatusOr<std::optional<int32_t>> WriteHfTokenizer(const HfTokenizerFiles& files,
                                                        const fs::path& dir, int64_t vocab_size,
                                                        int64_t max_seq_len,
                                                        std::optional<int32_t> mask_token) {
  if (mask_token && (*mask_token < 0 || *mask_token >= vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the masked LM's <mask> (model.mask_token) is id ", *mask_token,
                     ", not an id of the model's vocab_size ", vocab_size));
  }
  return files.kind == HfTokenizerFiles::Kind::kGpt2
             ? WriteGpt2(files, dir, vocab_size, max_seq_len, mask_token)
             : WriteSentencePiece(files, dir, vocab_size, max_seq_len, mask_token);
}

}  // namespace nf::checkpoint
