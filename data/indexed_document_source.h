// An MMIDIDX indexed dataset (indexed_dataset.h) as a DocumentSource: each sequence is one
// document of the source, which is what nf-preprocess writes. A document index that groups
// several sequences into one document (Megatron's sentence-split BERT data) matters only for
// splits, which must not cut a document: split over the dataset's documents, then map each range
// onto its sequences with SequencesOf.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/document_source.h"
#include "data/indexed_dataset.h"

namespace nf::data {

class IndexedDocumentSource : public DocumentSource {
 public:
  static absl::StatusOr<std::shared_ptr<IndexedDocumentSource>> Open(const std::string& prefix);
  explicit IndexedDocumentSource(std::unique_ptr<IndexedDataset> dataset);

  int64_t num_documents() const override { return dataset_->num_sequences(); }
  int64_t document_length(int64_t d) const override { return dataset_->sequence_length(d); }
  void ReadTokens(int64_t d, int64_t offset, int64_t count, int32_t* out) const override {
    dataset_->ReadTokens(d, offset, count, out);
  }
  // The dataset's PREFIX: sample-index caches live beside PREFIX.bin and PREFIX.idx.
  std::string name() const override { return dataset_->prefix(); }
  std::string cache_prefix() const override { return dataset_->prefix(); }

  // The sequences [document_index[begin], document_index[end]) of the dataset's documents
  // [begin, end), i.e. the source documents a split of real documents covers. InvalidArgument
  // unless 0 <= begin <= end <= dataset().num_documents().
  absl::StatusOr<DocumentRange> SequencesOf(DocumentRange documents) const;

  const IndexedDataset& dataset() const { return *dataset_; }

 private:
  std::unique_ptr<IndexedDataset> dataset_;
};

}  // namespace nf::data
