// Where GPT samples read their tokens from: a numbered list of documents of int32 tokens. The
// sample-index logic (gpt_samples.h) sees only this interface, so it is tested on in-memory
// documents and runs on memory-mapped indexed datasets (indexed_document_source.h) alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::data {

// Documents [begin, end) of a source: a split.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  friend bool operator==(const DocumentRange&, const DocumentRange&) = default;
};

class DocumentSource {
 public:
  virtual ~DocumentSource() = default;

  virtual int64_t num_documents() const = 0;
  // Tokens in document d, 0 <= d < num_documents().
  virtual int64_t document_length(int64_t d) const = 0;
  // Tokens [offset, offset + count) of document d into out[0, count). Bounds are the caller's
  // contract: offset + count <= document_length(d).
  virtual void ReadTokens(int64_t d, int64_t offset, int64_t count, int32_t* out) const = 0;
  // Names the source in error messages and in the description of cached sample indices.
  virtual std::string name() const = 0;
  // PREFIX of the sample-index cache files PREFIX_gpt_<key>.samples, stored beside the data;
  // empty (the default) turns caching off, as for sources that are rebuilt every run.
  virtual std::string cache_prefix() const { return ""; }
};

// Documents held in memory (tests, small corpora): never cached.
class InMemoryDocumentSource : public DocumentSource {
 public:
  InMemoryDocumentSource(std::string name, const std::vector<std::vector<int32_t>>& documents);

  int64_t num_documents() const override { return static_cast<int64_t>(starts_.size()) - 1; }
  int64_t document_length(int64_t d) const override { return starts_[d + 1] - starts_[d]; }
  void ReadTokens(int64_t d, int64_t offset, int64_t count, int32_t* out) const override;
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::vector<int32_t> tokens_;  // every document back to back
  std::vector<int64_t>
      starts_;  // [num_documents + 1]: document d is tokens_[starts_[d], starts_[d + 1])
};

}  // namespace nf::data
