// nf-preprocess: text or JSONL -> tokens -> PREFIX.bin + PREFIX.idx (Megatron's MMIDIDX).
//
// Exit codes: 0 done; 1 a runtime error (nothing is left that looks complete); 2 bad usage.
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/output_path.h"
#include "core/files/atomic_file.h"
#include "core/status.h"
#include "data/chunked_encoding.h"
#include "data/document_reader.h"
#include "data/gpt2_bpe.h"
#include "data/preprocess.h"
#include "data/sentencepiece_tokenizer.h"

namespace {

constexpr int kMaxWorkers = 256;

constexpr char kUsage[] =
    R"(usage: nf-preprocess --input FILE [--input FILE]... --output-prefix PREFIX
                     --tokenizer gpt2 --vocab-file vocab.json --merges-file merges.txt
                   | --tokenizer sentencepiece (--spm-model FILE | --spm-train-vocab-size N)
                     [--format jsonl|lines|paragraphs] [--json-key KEY] [--workers N] [--no-eod]
                     [--prepend-begin-of-document] [--parse-special-tokens]
                     [--keep-empty-documents]

Tokenizes documents into PREFIX.bin and PREFIX.idx, byte-compatible with Megatron-LM's and
fairseq's indexed datasets (uint16 tokens under 65,500 vocabulary entries, else int32). Both
files appear only when everything succeeded.

  --input FILE            a document source; repeatable; "-" reads standard input
  --format FORMAT         jsonl (default; one JSON object per line), lines (one document per
                          line) or paragraphs (documents separated by blank lines)
  --json-key KEY          the JSONL string field holding the text (default: text)
  --output-prefix PREFIX  where to write PREFIX.bin and PREFIX.idx
  --tokenizer NAME        gpt2 (byte-level BPE) or sentencepiece
  --vocab-file, --merges-file   GPT-2's vocab.json and merges.txt
  --spm-model FILE        a trained SentencePiece model
  --spm-train-vocab-size N      train a SentencePiece model of N pieces on the inputs first,
                          written to PREFIX.spm.model
  --workers N             tokenizing threads, 1 to 256 (default 1); the output does not depend
                          on it
  --no-eod                do not append the end-of-document token to each document
  --prepend-begin-of-document   also put the begin-of-document token before each document:
                          <s> doc </s>, as RoBERTa's tokenizer wraps a text for a masked LM.
                          sentencepiece: the model's <s> (models --spm-train-vocab-size trains
                          have one); gpt2: "<|endoftext|>", its one special token, so it is
                          both the begin and the end token
  --parse-special-tokens  gpt2: read "<|endoftext|>" in the text as the end-of-document token
                          (the document is not split), as Hugging Face tokenizers does and so
                          Megatron-LM's GPT2BPETokenizer from core 0.15 on; by default it is
                          text, as in that tokenizer up to core 0.14 (and with
                          --legacy-tokenizer in 0.15 and 0.16)
  --keep-empty-documents  keep empty documents (empty JSONL texts, blank lines of --format lines,
                          texts without tokens) as Megatron's preprocess_data.py does: no tokens,
                          no end-of-document token, one entry of the document index; by default
                          they are skipped. An output without any token is refused either way
  --help                  this text

For the PREFIX.bin and PREFIX.idx that Megatron-LM's tools/preprocess_data.py --append-eod
writes (byte for byte where the tokenizers give the same ids): --keep-empty-documents, plus
--parse-special-tokens for its GPT2BPETokenizer from core 0.15 on (unless --legacy-tokenizer);
for a Megatron run without --append-eod, add --no-eod.
)";

int Usage(const std::string& message) {
  std::cerr << "nf-preprocess: " << message << "\n(run nf-preprocess --help for usage)\n";
  return 2;
}

struct Flags {
  std::vector<std::string> inputs;
  std::string format = "jsonl", json_key = "text", output_prefix, tokenizer;
  std::string vocab_file, merges_file, spm_model;
  int spm_train_vocab_size = 0;
  int workers = 1;
  bool eod = true;
  bool prepend_begin_of_document = false;
  bool parse_special_tokens = false;
  bool keep_empty_documents = false;
};

// Every file nf-preprocess writes lies outside every checkpoint and is none of its inputs
// (checkpoint/output_path.h): refused before anything is read or written.
absl::Status CheckOutputs(const Flags& flags) {
  std::vector<nf::checkpoint::ToolInput> inputs = {{flags.vocab_file, "--vocab-file"},
                                                   {flags.merges_file, "--merges-file"},
                                                   {flags.spm_model, "--spm-model"}};
  for (const std::string& input : flags.inputs) {
    if (input != "-") inputs.push_back({input, "--input"});
  }
  std::vector<std::string> suffixes = {".bin", ".idx"};
  if (flags.spm_model.empty() && flags.spm_train_vocab_size > 0) {
    suffixes.insert(suffixes.end(), {".spm.model", ".spm.vocab"});
  }
  for (const std::string& suffix : suffixes) {
    NF_RETURN_IF_ERROR(
        nf::checkpoint::CheckOutputPath(flags.output_prefix + suffix, "--output-prefix", inputs));
  }
  return absl::OkStatus();
}

// Writes the documents of the inputs, one per paragraph, to a new file SentencePiece trains on.
absl::Status WriteTrainingText(const Flags& flags, nf::data::InputFormat format,
                               const std::filesystem::path& path) {
  NF_ASSIGN_OR_RETURN(nf::DurableWriter out, nf::DurableWriter::Create(path));
  for (const std::string& input : flags.inputs) {
    auto reader = nf::data::DocumentReader::Open(input, format, flags.json_key);
    if (!reader.ok()) return reader.status();
    while (true) {
      auto document = (*reader)->Next();
      if (!document.ok()) return document.status();
      if (!document->has_value()) break;
      NF_RETURN_IF_ERROR(
          out.Append((*document)->data(), static_cast<int64_t>((*document)->size())));
      NF_RETURN_IF_ERROR(out.Append("\n", 1));
    }
  }
  return absl::OkStatus();  // scratch: closed unsynced, read back at once and removed
}

// Trains PREFIX.spm.model (and .vocab) on the inputs. Everything is written in a staging
// directory of its own beside PREFIX (the training text, SentencePiece's files, which it opens
// as it likes) and the model moved into place at the end, so that a link planted at any name
// reaches nothing; the staging directory goes, whatever happens.
absl::StatusOr<std::unique_ptr<nf::data::Tokenizer>> TrainSentencePiece(
    const Flags& flags, nf::data::InputFormat format) {
  const std::string prefix = flags.output_prefix + ".spm";
  NF_ASSIGN_OR_RETURN(const nf::StagingDirectory staging,
                      nf::StagingDirectory::Create(flags.output_prefix + ".spm-train"));
  const std::filesystem::path text = staging.path() / "train.txt";
  NF_RETURN_IF_ERROR(WriteTrainingText(flags, format, text));
  const std::string staged = (staging.path() / "spm").string();
  const absl::Status trained =
      nf::data::SentencePieceTokenizer::Train({.inputs = {text.string()},
                                               .model_prefix = staged,
                                               .vocab_size = flags.spm_train_vocab_size});
  if (!trained.ok()) {  // named as the model asked for, not as staged
    return absl::Status(trained.code(), absl::StrReplaceAll(trained.message(), {{staged, prefix}}));
  }
  for (const char* extension : {".model", ".vocab"}) {
    NF_RETURN_IF_ERROR(
        nf::MoveIntoPlace(staged + extension, prefix + extension, nf::OnCommit::kReplace));
  }
  std::cerr << "nf-preprocess: trained " << prefix << ".model\n";
  return nf::data::SentencePieceTokenizer::Load(prefix + ".model");
}

absl::StatusOr<std::unique_ptr<nf::data::Tokenizer>> MakeTokenizer(const Flags& flags,
                                                                   nf::data::InputFormat format) {
  if (flags.tokenizer == "gpt2") {
    if (flags.vocab_file.empty() || flags.merges_file.empty()) {
      return absl::InvalidArgumentError("--tokenizer gpt2 needs --vocab-file and --merges-file");
    }
    auto bpe = nf::data::Gpt2Bpe::Load(flags.vocab_file, flags.merges_file);
    if (!bpe.ok()) return bpe.status();
    if (absl::Status s = (*bpe)->ParseSpecialTokens(flags.parse_special_tokens); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--parse-special-tokens: ", s.message()));
    }
    if (flags.prepend_begin_of_document && !(*bpe)->begin_of_document().has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prepend-begin-of-document: the GPT-2 vocabulary ", flags.vocab_file,
                       " has no \"<|endoftext|>\" token to begin documents with"));
    }
    return bpe;
  }
  if (flags.tokenizer != "sentencepiece") {
    return absl::InvalidArgumentError("--tokenizer must be gpt2 or sentencepiece");
  }
  if (flags.parse_special_tokens) {
    return absl::InvalidArgumentError("--parse-special-tokens is for --tokenizer gpt2");
  }
  if (!flags.spm_model.empty()) {
    auto model = nf::data::SentencePieceTokenizer::Load(flags.spm_model);
    if (model.ok() && flags.prepend_begin_of_document &&
        !(*model)->begin_of_document().has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prepend-begin-of-document: the SentencePiece model ", flags.spm_model,
                       " has no begin-of-document piece <s> (its bos_id is -1)"));
    }
    return model;
  }
  if (flags.spm_train_vocab_size <= 0) {
    return absl::InvalidArgumentError(
        "--tokenizer sentencepiece needs --spm-model or --spm-train-vocab-size");
  }
  for (const std::string& input : flags.inputs) {
    if (input == "-") {
      return absl::InvalidArgumentError(
          "--spm-train-vocab-size reads the inputs twice and cannot train from standard input");
    }
  }
  return TrainSentencePiece(flags, format);  // with <s>: SentencePiece's default bos_id 1
}

int64_t TotalInputBytes(const std::vector<std::string>& inputs) {
  int64_t total = 0;
  for (const std::string& input : inputs) {
    std::error_code error;
    const auto size = input == "-" ? 0 : std::filesystem::file_size(input, error);
    if (error || input == "-") return 0;  // unknown: no ETA
    total += static_cast<int64_t>(size);
  }
  return total;
}

int Run(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--no-eod") {
      flags.eod = false;
      continue;
    }
    if (arg == "--prepend-begin-of-document") {
      flags.prepend_begin_of_document = true;
      continue;
    }
    if (arg == "--parse-special-tokens") {
      flags.parse_special_tokens = true;
      continue;
    }
    if (arg == "--keep-empty-documents") {
      flags.keep_empty_documents = true;
      continue;
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value (or is unknown)");
    const std::string value = argv[++i];
    if (arg == "--input") {
      flags.inputs.push_back(value);
    } else if (arg == "--format") {
      flags.format = value;
    } else if (arg == "--json-key") {
      flags.json_key = value;
    } else if (arg == "--output-prefix") {
      flags.output_prefix = value;
    } else if (arg == "--tokenizer") {
      flags.tokenizer = value;
    } else if (arg == "--vocab-file") {
      flags.vocab_file = value;
    } else if (arg == "--merges-file") {
      flags.merges_file = value;
    } else if (arg == "--spm-model") {
      flags.spm_model = value;
    } else if (arg == "--spm-train-vocab-size") {
      if (!absl::SimpleAtoi(value, &flags.spm_train_vocab_size)) {
        return Usage("--spm-train-vocab-size needs a number, got '" + value + "'");
      }
    } else if (arg == "--workers") {
      // Threads beyond a few per core only cost memory; a typo of 100000 must not try them.
      if (!absl::SimpleAtoi(value, &flags.workers) || flags.workers < 1 ||
          flags.workers > kMaxWorkers) {
        return Usage("--workers needs a number in [1, " + std::to_string(kMaxWorkers) + "], got '" +
                     value + "'");
      }
    } else {
      return Usage("unknown argument '" + arg + "'");
    }
  }
  if (flags.inputs.empty()) return Usage("at least one --input is required");
  if (flags.output_prefix.empty()) return Usage("--output-prefix is required");
  const auto format = nf::data::ParseInputFormat(flags.format);
  if (!format.ok()) return Usage(std::string(format.status().message()));
  if (const absl::Status outputs = CheckOutputs(flags); !outputs.ok()) {
    std::cerr << "nf-preprocess: " << outputs.message() << "\n";
    return 2;
  }

  auto tokenizer = MakeTokenizer(flags, *format);
  if (!tokenizer.ok()) {
    std::cerr << "nf-preprocess: " << tokenizer.status().message() << "\n";
    return tokenizer.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const int64_t total_bytes = TotalInputBytes(flags.inputs);
  const bool terminal = isatty(fileno(stderr));
  auto report = [&](const nf::data::PreprocessProgress& p) {
    if (!terminal || p.seconds <= 0) return;
    const double mb_per_s = p.bytes / 1e6 / p.seconds;
    std::string eta = "?";
    if (total_bytes > 0 && p.bytes > 0) {
      eta = absl::StrFormat("%.0fs", p.seconds * (total_bytes - p.bytes) / p.bytes);
    }
    std::cerr << absl::StrFormat("\r%d docs | %.0f docs/s | %.2f MB/s | %.0f tokens/s | ETA %s   ",
                                 p.documents, p.documents / p.seconds, mb_per_s,
                                 p.tokens / p.seconds, eta);
  };
  const auto done =
      nf::data::Preprocess({.inputs = flags.inputs,
                            .format = *format,
                            .json_key = flags.json_key,
                            .output_prefix = flags.output_prefix,
                            .workers = flags.workers,
                            .append_end_of_document = flags.eod,
                            .prepend_begin_of_document = flags.prepend_begin_of_document,
                            .keep_empty_documents = flags.keep_empty_documents},
                           **tokenizer, report);
  if (terminal) std::cerr << "\n";
  if (!done.ok()) {
    std::cerr << "nf-preprocess: " << done.status().message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "nf-preprocess: %d documents%s, %d tokens, %.2f MB in %.2f s (%.2f MB/s, %.0f tokens/s, "
      "%d workers) -> %s.bin/.idx (%s tokens, vocabulary %d)\n",
      done->documents,
      flags.keep_empty_documents ? absl::StrFormat(" (%d empty)", done->empty_documents) : "",
      done->tokens, done->bytes / 1e6, done->seconds,
      done->bytes / 1e6 / std::max(done->seconds, 1e-9),
      done->tokens / std::max(done->seconds, 1e-9), flags.workers, flags.output_prefix,
      (*tokenizer)->vocab_size() < 65500 ? "uint16" : "int32", (*tokenizer)->vocab_size());
  // A masked LM's <mask> is one id past the tokenizer's, where fairseq's dictionary adds it: the
  // data needs no other change (docs/guide.md "Masked language models").
  std::cout << absl::StrFormat(
      "nf-preprocess: train on it with model.vocab_size %d, or %d for a masked LM (<mask> id %d, "
      "model.mask_token -1)\n",
      (*tokenizer)->vocab_size(), (*tokenizer)->vocab_size() + 1, (*tokenizer)->vocab_size());
  if (done->inexactly_cut_documents > 0) {
    const int64_t unnamed =
        done->inexactly_cut_documents - static_cast<int64_t>(done->inexactly_cut_names.size());
    std::cerr << absl::StrFormat(
        "nf-preprocess: warning: %d documents had a stretch of %d bytes without whitespace the "
        "tokenizer can be cut at (%s%s); each was cut there between two characters, keeping its "
        "text, where its ids may differ from encoding it whole (docs/design.md, section 6.1)\n",
        done->inexactly_cut_documents, nf::data::kDefaultMaxChunkBytes,
        absl::StrJoin(done->inexactly_cut_names, ", "),
        unnamed > 0 ? absl::StrFormat(" and %d more", unnamed) : "");
  }
  return 0;
}

}  // namespace

// The last line of defence: an exception a library throws where no status was expected ends
// the program with a message and exit 1 (the output writer's destructor removes its
// temporaries as the stack unwinds), never with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "nf-preprocess: internal error: " << e.what() << "; nothing written\n";
    return 1;
  }
}
