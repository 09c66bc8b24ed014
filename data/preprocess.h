// nf-preprocess's pipeline: documents stream from the inputs, worker threads tokenize them in
// batches, and the writer appends them to the indexed dataset in input order (so the output
// does not depend on the worker count). Memory stays bounded whatever the corpus size: at most
// 2 x workers batches are in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/document_reader.h"
#include "data/tokenizer.h"

namespace nf::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // paths, "-" for standard input
  InputFormat format = InputFormat::kJsonl;
  std::string json_key = "text";
  std::string output_prefix;  // writes PREFIX.bin and PREFIX.idx
  int workers = 1;
  bool append_end_of_document = true;
  // Puts the tokenizer's begin-of-document token (Tokenizer::begin_of_document) before each
  // document, so that it reads [begin] + ids + [end]: RoBERTa's `<s> doc </s>` (each text as
  // its tokenizer wraps it, concatenated into full samples). InvalidArgument, nothing written,
  // for a tokenizer without one.
  bool prepend_begin_of_document = false;
  // Megatron's preprocess_data.py: an empty document (an empty JSONL text, a blank line of the
  // lines format, or any document whose text tokenizes to no ids) is kept as a document without
  // tokens: no sequence and no begin- or end-of-document token, one document index entry
  // (IndexedDatasetWriter::AddEmptyDocument). By default the reader skips empty texts and blank
  // lines (and a document that tokenizes to nothing is written as its begin- and end-of-document
  // tokens, those asked for).
  bool keep_empty_documents = false;
  int documents_per_batch = 64;
};

inline constexpr size_t kNamedInexactlyCutDocuments = 10;

struct PreprocessProgress {
  int64_t documents = 0;
  int64_t empty_documents = 0;  // of them, kept empty (keep_empty_documents)
  // Of them, documents cut somewhere without an exact cut (no whitespace the tokenizer can cut
  // at within a chunk): their ids next to such a cut may differ from encoding them whole.
  int64_t inexactly_cut_documents = 0;
  // The first kNamedInexactlyCutDocuments of them, in input order, as "PATH document N" (the
  // Nth document read from that input, from 1): so the warning can name them.
  std::vector<std::string> inexactly_cut_names;
  int64_t tokens = 0;
  int64_t bytes = 0;  // input bytes consumed
  double seconds = 0.0;
};

// Runs the pipeline; `report` (may be empty) is called about every half second and at the end.
// The output appears (atomically) only when everything succeeded. An output without a single
// token is refused (InvalidArgument, nothing written): an input without documents, or whose
// documents are all empty.
absl::StatusOr<PreprocessProgress> Preprocess(
    const PreprocessOptions& options, const Tokenizer& tokenizer,
    const std::function<void(const PreprocessProgress&)>& report);

}  // namespace nf::data
