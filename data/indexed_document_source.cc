#include "data/indexed_document_source.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::data {

absl::StatusOr<std::shared_ptr<IndexedDocumentSource>> IndexedDocumentSource::Open(
    const std::string& prefix) {
  NF_ASSIGN_OR_RETURN(std::unique_ptr<IndexedDataset> dataset, IndexedDataset::Open(prefix));
  return std::make_shared<IndexedDocumentSource>(std::move(dataset));
}

IndexedDocumentSource::IndexedDocumentSource(std::unique_ptr<IndexedDataset> dataset)
    : dataset_(std::move(dataset)) {}

absl::StatusOr<DocumentRange> IndexedDocumentSource::SequencesOf(DocumentRange documents) const {
  const int64_t num_documents = dataset_->num_documents();
  if (documents.begin < 0 || documents.begin > documents.end || documents.end > num_documents) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: document range [", documents.begin, ", ", documents.end,
                     ") is not within the ", num_documents, " documents of ", dataset_->prefix()));
  }
  // Open validated the document index: num_documents + 1 non-decreasing sequence numbers.
  const std::vector<int64_t>& index = dataset_->document_index();
  return DocumentRange{.begin = index[documents.begin], .end = index[documents.end]};
}

}  // namespace nf::data
