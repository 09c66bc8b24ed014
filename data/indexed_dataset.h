// Megatron-LM / fairseq "MMIDIDX" indexed datasets: PREFIX.bin holds the tokens of every
// sequence back to back; PREFIX.idx describes them (docs/design.md section 6). Byte-compatible with
// Megatron's and fairseq's MMapIndexedDataset, so data preprocessed for them loads here and
// ours loads there.
//
// .idx layout, little-endian:
//   9 bytes  magic "MMIDIDX\0\0"
//   u64      version (1)
//   u8       dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16)
//   u64      sequence count S
//   u64      document count D (entries of the document index, i.e. documents + 1)
//   i32[S]   sequence lengths in tokens
//   i64[S]   byte offsets of the sequences in .bin
//   i64[D]   document index: 0, then the sequence count at the end of each document
// With one sequence per document (what nf-preprocess writes) the document index is 0..S; an empty
// document, as Megatron's preprocess_data.py writes one, is an entry without a sequence (the
// previous entry repeated).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::data {

// The token dtypes we read and write: u16 when the vocabulary is under 65,500, else i32.
// (Other codes of the format are rejected on read with a message naming the code.)
enum class TokenDType : uint8_t { kU16 = 8, kI32 = 4 };

// Writes PREFIX.bin and PREFIX.idx. Everything goes to temporary names that are fsynced and
// renamed only by Finish(), so an interrupted run never leaves a pair that looks complete.
class IndexedDatasetWriter {
 public:
  static absl::StatusOr<IndexedDatasetWriter> Create(const std::string& prefix, TokenDType dtype);
  IndexedDatasetWriter(IndexedDatasetWriter&&) noexcept;
  IndexedDatasetWriter& operator=(IndexedDatasetWriter&&) noexcept;
  ~IndexedDatasetWriter();  // removes the temporary files unless Finish() succeeded

  // Appends one sequence (one document): tokens must fit the dtype.
  absl::Status AddDocument(std::span<const int32_t> tokens);
  // Appends a document without tokens the way Megatron's IndexedDatasetBuilder.add_document
  // records one: no sequence (not a sequence of length 0), and a document index entry equal to
  // the one before it.
  absl::Status AddEmptyDocument();
  // Writes the index, syncs and renames both files into place.
  absl::Status Finish();

 private:
  struct State;
  explicit IndexedDatasetWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A memory-mapped, fully validated dataset: the header, dtype, counts, every pointer and
// length against the .bin size, and the document index are checked at Open, so no later read
// can go out of bounds. Errors are one line naming the file and what is wrong.
class IndexedDataset {
 public:
  // Token values are not scanned here (a multi-terabyte .bin would take hours); the loader
  // checks the tokens it reads against the model's vocabulary.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::string& prefix);
  ~IndexedDataset();

  const std::string& prefix() const;
  TokenDType dtype() const;
  int64_t num_sequences() const;
  // Documents (document index entries minus one).
  int64_t num_documents() const;
  int64_t sequence_length(int64_t i) const;
  // Sequences [document_index[d], document_index[d + 1]) form document d.
  const std::vector<int64_t>& document_index() const;
  // Tokens [offset, offset + count) of sequence i as int32 into out (bounds are the caller's
  // contract: offset + count <= sequence_length(i)).
  void ReadTokens(int64_t i, int64_t offset, int64_t count, int32_t* out) const;
  int64_t total_tokens() const;

 private:
  struct Mapping;
  explicit IndexedDataset(std::unique_ptr<Mapping> mapping);
  std::unique_ptr<Mapping> mapping_;
};

}  // namespace nf::data
