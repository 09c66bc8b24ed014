// GPT training samples from a range of documents, after Megatron-LM's GPTDataset: the
// documents' tokens are concatenated in a shuffled order, epoch after epoch, and cut into
// samples of seq_len + 1 tokens, consecutive samples sharing one token (the last target of one
// is the first input of the next), which are then read in a shuffled order.
//
// Three indices, built once per (source, documents, seq_len, num_samples, seed):
//   document index [num_epochs * documents]: the documents of every epoch, each epoch
//       independently shuffled from (seed, epoch), so every epoch holds each document once;
//   sample index [samples, 2]: (position in the document index, token offset) of the first
//       token of sample j of that stream, sample j covering stream tokens [j L, (j + 1) L];
//   shuffle index [samples]: the sample read i-th. Samples lying wholly within the first
//       num_epochs - 1 epochs come first, shuffled among themselves, then the rest (which
//       reach into the final epoch) shuffled separately, so any prefix of the reading order
//       covers whole epochs before it repeats a token.
// num_epochs is the fewest epochs that hold num_samples samples; the stream is cut to whole
// samples of them all, so there may be more samples than num_samples, of which the final
// epoch's shuffle picks the ones read. The indices, and so every sample, depend only on the
// source's contents and the spec; they are cached beside the data when the source has a cache
// prefix (gpt_samples_cache.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/document_source.h"
#include "data/gpt_samples_cache.h"

namespace nf::data {

struct GptSamplesSpec {
  DocumentRange documents;  // the split of the source the samples come from
  int64_t seq_len = 0;      // L: each sample has L + 1 tokens
  int64_t num_samples = 0;  // samples that will be read
  uint32_t seed = 0;
};

class GptSamples {
 public:
  // Loads the indices from the cache when a matching, valid file exists, else builds them and
  // (for a cached source) writes the file. InvalidArgument (one line naming the source) for an
  // empty or out-of-range document range, a range without tokens, seq_len < 1, num_samples < 0
  // or indices too large to hold; errors writing the cache name the file.
  static absl::StatusOr<GptSamples> Build(std::shared_ptr<const DocumentSource> source,
                                          const GptSamplesSpec& spec);

  const DocumentSource& source() const { return *source_; }
  const GptSamplesSpec& spec() const { return spec_; }
  int64_t size() const { return spec_.num_samples; }
  int64_t seq_len() const { return spec_.seq_len; }
  // Tokens in the document range: one epoch.
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  const GptSampleIndices& indices() const { return indices_; }
  // The cache file of these samples; empty for a source without a cache prefix.
  const std::string& cache_path() const { return cache_path_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

  // Writes the seq_len + 1 tokens of the i-th sample read, 0 <= i < size(), into out.
  void Sample(int64_t i, int32_t* out) const;

  // The document, and the offset in it, of token k (0 <= k <= seq_len) of the i-th sample: for
  // error messages about a token.
  struct TokenOrigin {
    int64_t document = 0;
    int64_t offset = 0;
  };
  TokenOrigin Locate(int64_t i, int64_t k) const;

 private:
  GptSamples(std::shared_ptr<const DocumentSource> source, const GptSamplesSpec& spec,
             int64_t tokens_per_epoch, GptSampleIndices indices, std::string cache_path,
             bool loaded_from_cache);

  std::shared_ptr<const DocumentSource> source_;
  GptSamplesSpec spec_;
  int64_t tokens_per_epoch_;
  GptSampleIndices indices_;
  std::string cache_path_;
  bool loaded_from_cache_;
};

}  // namespace nf::data
