#include "checkpoint/hf_tokenizer.h"

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

// tokenizer.json: GPT-2's byte-level BPE for Hugging Face `tokenizers` (the format of GPT-2's own
// tokenizer.json), the vocabulary embedded as vocab.json holds it and the merges as pairs.
absl::StatusOr<std::string> Gpt2TokenizerJson(const std::string& vocab_json,
                                              const std::string& merges_txt,
                                              const fs::path& merges_file,
                                              std::optional<int32_t> end_of_text) {
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
  std::string added = "[]";
  if (end_of_text) {
    added = absl::StrCat("[{\"id\": ", *end_of_text, ", \"content\": ", JsonQuoted(kEndOfText),
                         ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                         "\"normalized\": true, \"special\": true}]");
  }
  return absl::StrCat(
      "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n\"added_tokens\": ", added,
      ",\n\"normalizer\": null,\n\"pre_tokenizer\": ", byte_level,
      ",\n\"post_processor\": ", byte_level, ",\n\"decoder\": ", byte_level,
      ",\n\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
      "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, "
      "\"byte_fallback\": false, \"ignore_merges\": false,\n\"vocab\": ",
      vocab_json, ",\n\"merges\": [", absl::StrJoin(merges, ",\n"), "]}}\n");
}

absl::StatusOr<std::optional<int32_t>> WriteGpt2(const HfTokenizerFiles& files, const fs::path& dir,
                                                 int64_t vocab_size, int64_t max_seq_len) {
  NF_ASSIGN_OR_RETURN(const std::string vocab_json, ReadWholeFile(files.vocab_file));
  NF_ASSIGN_OR_RETURN(const std::string merges_txt, ReadWholeFile(files.merges_file));
  NF_ASSIGN_OR_RETURN(const auto vocab,
                      data::ParseVocabJson(vocab_json, files.vocab_file.string()));
  if (static_cast<int64_t>(vocab.size()) > vocab_size) {
    return TooManyIds(files.vocab_file, static_cast<int64_t>(vocab.size()), vocab_size);
  }
  std::optional<int32_t> end_of_text;
  if (const auto it = vocab.find(kEndOfText); it != vocab.end()) end_of_text = it->second;
  NF_ASSIGN_OR_RETURN(const std::string tokenizer_json,
                      Gpt2TokenizerJson(vocab_json, merges_txt, files.merges_file, end_of_text));
  NF_RETURN_IF_ERROR(Write(dir / "vocab.json", vocab_json));
  NF_RETURN_IF_ERROR(Write(dir / "merges.txt", merges_txt));
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer.json", tokenizer_json));
  const std::optional<std::string> special =
      end_of_text ? std::optional<std::string>(kEndOfText) : std::nullopt;
  const std::vector<std::pair<std::string, std::optional<std::string>>> tokens = {
      {"bos_token", special}, {"eos_token", special}, {"unk_token", special}};
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
                                                          int64_t max_seq_len) {
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
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer.model", model));
  const std::vector<std::pair<std::string, std::optional<std::string>>> tokens = {
      // The end-of-document piece, as config.json's bos_token_id: what a context starts after
      // (lm-eval's add_bos_token), never SentencePiece's own <s>, which training never saw.
      {"bos_token", piece(vocabulary->eos_id)},
      {"eos_token", piece(vocabulary->eos_id)},
      {"unk_token", piece(vocabulary->unk_id)},
      {"pad_token", piece(vocabulary->pad_id)}};
  std::vector<std::string> config = {R"(  "tokenizer_class": "SentencePieceBackend")",
                                     R"(  "add_bos_token": false)", R"(  "add_eos_token": false)",
                                     R"(  "clean_up_tokenization_spaces": false)",
                                     absl::StrCat(R"(  "model_max_length": )", max_seq_len)};
  for (std::string& member : TokenMembers(tokens)) config.push_back(std::move(member));
  NF_RETURN_IF_ERROR(Write(dir / "tokenizer_config.json", Object(config)));
  NF_RETURN_IF_ERROR(Write(dir / "special_tokens_map.json", Object(TokenMembers(tokens))));
  return vocabulary->eos_id;
}

}  // namespace

absl::StatusOr<std::optional<int32_t>> WriteHfTokenizer(const HfTokenizerFiles& files,
                                                        const fs::path& dir, int64_t vocab_size,
                                                        int64_t max_seq_len) {
  return files.kind == HfTokenizerFiles::Kind::kGpt2
             ? WriteGpt2(files, dir, vocab_size, max_seq_len)
             : WriteSentencePiece(files, dir, vocab_size, max_seq_len);
}

}  // namespace nf::checkpoint
