// nf-tokenize: nf-eval's tokenizing helper. It turns texts into token ids with nf-preprocess's
// tokenizers (GPT-2 BPE or SentencePiece) in a process of its own, because SentencePiece's
// library carries a protobuf of its own that clashes with the one nf-eval reads checkpoints with
// (data/CMakeLists.txt). The protocol is in eval/tokenizer_protocol.h.
//
//   nf-tokenize --tokenizer gpt2 --vocab-file vocab.json --merges-file merges.txt
//               [--parse-special-tokens] --texts FILE
//   nf-tokenize --tokenizer sentencepiece --spm-model FILE --texts FILE
//   nf-tokenize [tokenizer flags] --decode
//
// --decode serves nf-generate (generate/text_decoder.h) for as long as it runs: each line of ids
// (separated by single spaces) read from standard input is answered on standard output, at once,
// with its text as one record "<bytes>\n<text>\n" (Tokenizer::Decode).
//
// Exit codes: 0 done, 1 a tokenizer or texts file that cannot be read, 2 bad command line.
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/chunked_encoding.h"
#include "data/gpt2_bpe.h"
#include "data/sentencepiece_tokenizer.h"
#include "eval/tokenizer_protocol.h"

namespace {

constexpr char kUsage[] =
    R"(usage: nf-tokenize --tokenizer gpt2 --vocab-file vocab.json --merges-file merges.txt
                   [--parse-special-tokens] --texts FILE
       nf-tokenize --tokenizer sentencepiece --spm-model FILE --texts FILE

       nf-tokenize [tokenizer flags] --decode

nf-eval's helper: writes the token ids of every text of FILE (records "<bytes>\n<text>\n") to
standard output, one line per text after a line "vocab_size V end_of_document E".
With --decode (nf-generate's helper): answers each line of ids on standard input with the
record of its text.
)";

int Usage(const std::string& message) {
  std::cerr << "nf-tokenize: " << message << "\n(run nf-tokenize --help for usage)\n";
  return 2;
}

int Fail(const absl::Status& status) {
  std::cerr << "nf-tokenize: " << status.message() << "\n";
  return 1;
}

// The tokenizer the (checked) flags name.
absl::StatusOr<std::unique_ptr<nf::data::Tokenizer>> MakeTokenizer(
    const nf::eval::TokenizerFlags& flags) {
  if (flags.tokenizer == "sentencepiece") {
    return nf::data::SentencePieceTokenizer::Load(flags.spm_model);
  }
  auto bpe = nf::data::Gpt2Bpe::Load(flags.vocab_file, flags.merges_file);
  if (!bpe.ok()) return bpe.status();
  if (absl::Status s = (*bpe)->ParseSpecialTokens(flags.parse_special_tokens); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--parse-special-tokens: ", s.message()));
  }
  return bpe;
}

// Encodes every record of `texts` onto standard output.
absl::Status EncodeTexts(const nf::data::Tokenizer& tokenizer, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int32_t eod = tokenizer.end_of_document().value_or(-1);
  std::string out =
      absl::StrCat("vocab_size ", tokenizer.vocab_size(), " end_of_document ", eod, "\n");
  for (size_t pos = 0; pos < file.size();) {
    const size_t newline = file.find('\n', pos);
    size_t length = 0;
    if (newline == std::string::npos ||
        !absl::SimpleAtoi(file.substr(pos, newline - pos), &length) ||
        file.size() - newline - 1 < length + 1 || file[newline + 1 + length] != '\n') {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a malformed record at byte ", pos, " (eval/tokenizer_protocol.h)"));
    }
    // As nf-preprocess encodes a document: the same ids for the same text, in bounded memory.
    auto ids =
        nf::data::EncodeInChunks(tokenizer, absl::string_view(file).substr(newline + 1, length));
    if (!ids.ok()) return ids.status();
    absl::StrAppend(&out, absl::StrJoin(*ids, " "), "\n");
    pos = newline + 1 + length + 1;
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return absl::UnavailableError("cannot write the ids to standard output");
  }
  return absl::OkStatus();
}

// Answers each line of ids on standard input with its text's record, until end of input.
absl::Status DecodeLines(const nf::data::Tokenizer& tokenizer) {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<int32_t> ids;
    for (const absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(field, &id)) {
        return absl::InvalidArgumentError(absl::StrCat("--decode: '", field, "' is not an id"));
      }
      ids.push_back(id);
    }
    auto text = tokenizer.Decode(ids);
    if (!text.ok()) return text.status();
    std::string record;
    nf::eval::AppendTextRecord(*text, record);
    if (std::fwrite(record.data(), 1, record.size(), stdout) != record.size() ||
        std::fflush(stdout) != 0) {
      return absl::UnavailableError("cannot write a decoded text to standard output");
    }
  }
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  nf::eval::TokenizerFlags flags;
  std::string texts;
  bool decode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--parse-special-tokens") {
      flags.parse_special_tokens = true;
      continue;
    }
    if (arg == "--decode") {
      decode = true;
      continue;
    }
    std::string* value = nullptr;
    if (arg == "--tokenizer") value = &flags.tokenizer;
    if (arg == "--vocab-file") value = &flags.vocab_file;
    if (arg == "--merges-file") value = &flags.merges_file;
    if (arg == "--spm-model") value = &flags.spm_model;
    if (arg == "--texts") value = &texts;
    if (value == nullptr) return Usage("unknown argument '" + arg + "'");
    if (i + 1 >= argc) return Usage(arg + " needs a value");
    *value = argv[++i];
  }
  if (texts.empty() == !decode) return Usage("give one of --texts and --decode");
  if (const absl::Status s = nf::eval::CheckTokenizerFlags(flags); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  const auto tokenizer = MakeTokenizer(flags);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  if (const absl::Status s = decode ? DecodeLines(**tokenizer) : EncodeTexts(**tokenizer, texts);
      !s.ok()) {
    return Fail(s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "nf-tokenize: " << e.what() << "\n";
    return 1;
  }
}
