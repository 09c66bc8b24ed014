#include "data/document_source.h"

#include <algorithm>
#include <utility>

namespace nf::data {

InMemoryDocumentSource::InMemoryDocumentSource(std::string name,
                                               const std::vector<std::vector<int32_t>>& documents)
    : name_(std::move(name)) {
  starts_.reserve(documents.size() + 1);
  starts_.push_back(0);
  for (const std::vector<int32_t>& document : documents) {
    tokens_.insert(tokens_.end(), document.begin(), document.end());
    starts_.push_back(static_cast<int64_t>(tokens_.size()));
  }
}

void InMemoryDocumentSource::ReadTokens(int64_t d, int64_t offset, int64_t count,
                                        int32_t* out) const {
  const int32_t* first = tokens_.data() + starts_[d] + offset;
  std::copy(first, first + count, out);
}

}  // namespace nf::data
