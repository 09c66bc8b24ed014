// The on-disk cache of GPT sample indices (gpt_samples.h), so that every run and rank with the
// same description loads them instead of rebuilding: PREFIX_gpt_<key>.samples beside the data,
// key = 16 hex digits of a 64-bit FNV-1a hash of the description.
//
// File layout, native (little-endian) byte order:
//   8 bytes  magic "NFGPTSMP"
//   u64      version (1)
//   u64      description length B, then B bytes of description
//   i64      num_epochs, separate_from, document index size D, sample count S
//   i64[D]   document index
//   i64[2S]  sample index: (position in the document index, token offset) per sample
//   i64[S]   shuffle index
// Files are written under a temporary name, synced and renamed, so a reader never sees a partial
// file under the final name; concurrent writers of one description write identical bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::data {

// The three indices of a sample stream and the sizes that shape them.
struct GptSampleIndices {
  int64_t num_epochs = 0;
  // Shuffled positions [0, separate_from) hold exactly the samples [0, separate_from) (all
  // within the first num_epochs - 1 epochs), shuffled apart from the final epoch's.
  int64_t separate_from = 0;
  std::vector<int64_t> document_index;  // [num_epochs * documents]: document ids
  std::vector<int64_t> sample_index;    // [samples, 2]: where sample j starts
  std::vector<int64_t> shuffle_index;   // [samples]: the j read as the i-th sample

  int64_t num_samples() const { return static_cast<int64_t>(shuffle_index.size()); }
};

// What a cache file must hold to be used: anything else is rebuilt.
struct GptSampleIndexShape {
  int64_t num_epochs = 0;
  int64_t separate_from = 0;
  int64_t document_index_size = 0;
  int64_t num_samples = 0;
};

// 64-bit FNV-1a of bytes, continuing from `hash` (the offset basis starts a fresh hash): stable
// across runs and platforms, unlike absl::Hash, so it can name files.
inline constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
uint64_t Fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnv1aBasis);

// "PREFIX_gpt_<16 hex digits>.samples" for the description.
std::string SampleIndexCachePath(absl::string_view prefix, absl::string_view description);

// Writes the cache file at `path` (temporary name, fsync, rename). Errors name the file.
absl::Status WriteSampleIndexCache(const std::string& path, absl::string_view description,
                                   const GptSampleIndices& indices);

// The indices stored at `path` when its magic, version, description and shape all match and its
// size is exactly theirs. NotFound when there is no file; FailedPrecondition (a one-line reason)
// when it does not match. The values inside are the caller's to validate.
absl::StatusOr<GptSampleIndices> ReadSampleIndexCache(const std::string& path,
                                                      absl::string_view description,
                                                      const GptSampleIndexShape& shape);

}  // namespace nf::data
