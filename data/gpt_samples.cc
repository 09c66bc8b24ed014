#include "data/gpt_samples.h"

#include <algorithm>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/seeded_shuffle.h"

namespace nf::data {
namespace {

// Philox streams (seeded_shuffle.h): the document shuffle of each epoch (block = epoch) and
// the two blocks of the sample shuffle.
constexpr uint32_t kDocumentStream = 0xD0C5;
constexpr uint32_t kSampleStream = 0x5A3F1E;

// Index entries (8 bytes each) beyond which a spec is refused as a mistake rather than
// allocated: 2^36 entries are 512 GiB.
constexpr int64_t kMaxIndexEntries = int64_t{1} << 36;

// What the indices of a spec look like, computed from the token count alone.
struct Plan {
  int64_t tokens_per_epoch = 0;
  uint64_t lengths_hash = 0;  // of the range's document lengths, for the cache description
  GptSampleIndexShape shape;
};

absl::StatusOr<Plan> MakePlan(const DocumentSource& source, const GptSamplesSpec& spec) {
  const auto invalid = [&source](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("data: dataset ", source.name(), ": ", what));
  };
  const DocumentRange range = spec.documents;
  if (range.begin < 0 || range.begin >= range.end || range.end > source.num_documents()) {
    return invalid(absl::StrCat("document range [", range.begin, ", ", range.end,
                                ") is empty or not within its ", source.num_documents(),
                                " documents"));
  }
  if (spec.seq_len < 1) return invalid(absl::StrCat("seq_len ", spec.seq_len, " must be >= 1"));
  if (spec.num_samples < 0) {
    return invalid(absl::StrCat("num_samples ", spec.num_samples, " must be >= 0"));
  }
  Plan plan;
  plan.lengths_hash = kFnv1aBasis;
  for (int64_t d = range.begin; d < range.end; ++d) {
    const int64_t length = source.document_length(d);
    plan.tokens_per_epoch += length;
    plan.lengths_hash = Fnv1a64(&length, sizeof(length), plan.lengths_hash);
  }
  const int64_t tokens = plan.tokens_per_epoch;
  if (tokens == 0) {
    return invalid(absl::StrCat("documents [", range.begin, ", ", range.end, ") hold no tokens"));
  }
  // Reading n samples takes n L + 1 tokens of the stream: the fewest epochs that hold them.
  const int64_t seq_len = spec.seq_len;
  int64_t needed = 0, epochs = 0, documents = 0, stream_tokens = 0;
  const bool overflow = __builtin_mul_overflow(spec.num_samples, seq_len, &needed) ||
                        __builtin_add_overflow(needed, 1, &needed);
  if (!overflow) epochs = std::max<int64_t>(1, needed / tokens + (needed % tokens != 0));
  // Epochs also key the document shuffles by a 32-bit Philox counter word.
  if (overflow || epochs > int64_t{UINT32_MAX} ||
      __builtin_mul_overflow(epochs, range.size(), &documents) ||
      __builtin_mul_overflow(epochs, tokens, &stream_tokens) || documents > kMaxIndexEntries ||
      stream_tokens / seq_len > (kMaxIndexEntries - documents) / 3) {
    return invalid(absl::StrCat(spec.num_samples, " samples of ", seq_len, " tokens from ", tokens,
                                " tokens per epoch need indices of more than ", kMaxIndexEntries,
                                " entries"));
  }
  plan.shape = {
      .num_epochs = epochs,
      // Samples [0, separate_from) end (their extra token included) within the first
      // epochs - 1 epochs: j L + L <= (epochs - 1) T - 1.
      .separate_from = epochs > 1 ? ((epochs - 1) * tokens - 1) / seq_len : 0,
      .document_index_size = documents,
      // Whole samples of the stream: j L + L <= epochs T - 1.
      .num_samples = (stream_tokens - 1) / seq_len,
  };
  return plan;
}

// Everything the samples depend on, spelt out: the cache file's key and its header.
std::string Describe(const DocumentSource& source, const GptSamplesSpec& spec, const Plan& plan) {
  return absl::StrCat("nf gpt samples v1\ndataset: ", source.name(), "\ndocuments: [",
                      spec.documents.begin, ", ", spec.documents.end, ") of ",
                      source.num_documents(), "\ntokens: ", plan.tokens_per_epoch,
                      "\ndocument lengths fnv1a: ", absl::Hex(plan.lengths_hash, absl::kZeroPad16),
                      "\nseq_len: ", spec.seq_len, "\nnum_samples: ", spec.num_samples,
                      "\nseed: ", spec.seed, "\n");
}

GptSampleIndices BuildIndices(const DocumentSource& source, const GptSamplesSpec& spec,
                              const GptSampleIndexShape& shape) {
  GptSampleIndices indices{
      .num_epochs = shape.num_epochs,
      .separate_from = shape.separate_from,
      .document_index = std::vector<int64_t>(shape.document_index_size),
      .sample_index = std::vector<int64_t>(2 * shape.num_samples),
      .shuffle_index = std::vector<int64_t>(shape.num_samples),
  };
  const int64_t documents = spec.documents.size();
  for (int64_t epoch = 0; epoch < shape.num_epochs; ++epoch) {
    const std::span<int64_t> block(indices.document_index.data() + epoch * documents,
                                   static_cast<size_t>(documents));
    std::iota(block.begin(), block.end(), spec.documents.begin);
    SeededShuffle(block, spec.seed, kDocumentStream, static_cast<uint32_t>(epoch));
  }

  // Sample j starts at stream token j L: walk the document index once. Empty documents, and a
  // sample starting exactly where a document ends, move on to the next document, so every
  // entry names a real token (offset < its document's length).
  int64_t position = 0, offset = 0;
  for (int64_t j = 0; j < shape.num_samples; ++j) {
    while (offset >= source.document_length(indices.document_index[position])) {
      offset -= source.document_length(indices.document_index[position]);
      ++position;
    }
    indices.sample_index[2 * j] = position;
    indices.sample_index[2 * j + 1] = offset;
    offset += spec.seq_len;
  }

  std::iota(indices.shuffle_index.begin(), indices.shuffle_index.end(), 0);
  const std::span<int64_t> shuffle(indices.shuffle_index);
  SeededShuffle(shuffle.first(shape.separate_from), spec.seed, kSampleStream, 0);
  SeededShuffle(shuffle.subspan(shape.separate_from), spec.seed, kSampleStream, 1);
  return indices;
}

// Checks indices read from a cache file as far as memory safety needs: every epoch of the
// document index is a permutation of the range, sample starts are real tokens in strictly
// increasing stream order with seq_len + 1 tokens after the last, and the shuffle permutes each
// of its two blocks. A file that passes cannot make Sample read out of bounds.
absl::Status ValidateIndices(const DocumentSource& source, const GptSamplesSpec& spec,
                             const GptSampleIndices& indices) {
  const auto corrupt = [](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("data: sample-index cache ", what));
  };
  const DocumentRange range = spec.documents;
  std::vector<bool> seen(range.size());
  for (int64_t epoch = 0; epoch < indices.num_epochs; ++epoch) {
    std::fill(seen.begin(), seen.end(), false);
    for (int64_t k = 0; k < range.size(); ++k) {
      const int64_t d = indices.document_index[epoch * range.size() + k];
      if (d < range.begin || d >= range.end || seen[d - range.begin]) {
        return corrupt(absl::StrCat("epoch ", epoch, " is not a permutation of the documents"));
      }
      seen[d - range.begin] = true;
    }
  }

  const int64_t positions = static_cast<int64_t>(indices.document_index.size());
  const int64_t samples = indices.num_samples();
  int64_t last_position = -1, last_offset = 0;
  for (int64_t j = 0; j < samples; ++j) {
    const int64_t position = indices.sample_index[2 * j];
    const int64_t offset = indices.sample_index[2 * j + 1];
    if (position < 0 || position >= positions || offset < 0 ||
        offset >= source.document_length(indices.document_index[position]) ||
        position < last_position || (position == last_position && offset <= last_offset)) {
      return corrupt(absl::StrCat("sample ", j, " does not start at a later token"));
    }
    last_position = position;
    last_offset = offset;
  }
  if (samples > 0) {
    int64_t available = -last_offset;
    for (int64_t p = last_position; p < positions && available <= spec.seq_len; ++p) {
      available += source.document_length(indices.document_index[p]);
    }
    if (available <= spec.seq_len) return corrupt("last sample runs past the end");
  }

  seen.assign(samples, false);
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t j = indices.shuffle_index[i];
    const bool in_block = i < indices.separate_from ? (j >= 0 && j < indices.separate_from)
                                                    : (j >= indices.separate_from && j < samples);
    if (!in_block || seen[j]) return corrupt("shuffle is not a permutation of its blocks");
    seen[j] = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GptSamples> GptSamples::Build(std::shared_ptr<const DocumentSource> source,
                                             const GptSamplesSpec& spec) {
  NF_ASSIGN_OR_RETURN(const Plan plan, MakePlan(*source, spec));
  const std::string prefix = source->cache_prefix();
  std::string path;
  if (!prefix.empty()) {
    const std::string description = Describe(*source, spec, plan);
    path = SampleIndexCachePath(prefix, description);
    // Any failure to load (no file, another description under a colliding key, another shape,
    // truncation, corrupt values) falls through to a rebuild that replaces the file.
    absl::StatusOr<GptSampleIndices> cached = ReadSampleIndexCache(path, description, plan.shape);
    if (cached.ok() && ValidateIndices(*source, spec, *cached).ok()) {
      return GptSamples(std::move(source), spec, plan.tokens_per_epoch, *std::move(cached), path,
                        /*loaded_from_cache=*/true);
    }
    GptSampleIndices indices = BuildIndices(*source, spec, plan.shape);
    NF_RETURN_IF_ERROR(WriteSampleIndexCache(path, description, indices));
    return GptSamples(std::move(source), spec, plan.tokens_per_epoch, std::move(indices), path,
                      /*loaded_from_cache=*/false);
  }
  GptSampleIndices indices = BuildIndices(*source, spec, plan.shape);
  return GptSamples(std::move(source), spec, plan.tokens_per_epoch, std::move(indices), path,
                    /*loaded_from_cache=*/false);
}

GptSamples::GptSamples(std::shared_ptr<const DocumentSource> source, const GptSamplesSpec& spec,
                       int64_t tokens_per_epoch, GptSampleIndices indices, std::string cache_path,
                       bool loaded_from_cache)
    : source_(std::move(source)),
      spec_(spec),
      tokens_per_epoch_(tokens_per_epoch),
      indices_(std::move(indices)),
      cache_path_(std::move(cache_path)),
      loaded_from_cache_(loaded_from_cache) {}

void GptSamples::Sample(int64_t i, int32_t* out) const {
  const int64_t j = indices_.shuffle_index[i];
  int64_t position = indices_.sample_index[2 * j];
  int64_t offset = indices_.sample_index[2 * j + 1];
  for (int64_t remaining = spec_.seq_len + 1; remaining > 0; ++position, offset = 0) {
    const int64_t document = indices_.document_index[position];
    const int64_t count = std::min(source_->document_length(document) - offset, remaining);
    if (count > 0) source_->ReadTokens(document, offset, count, out);
    out += count;
    remaining -= count;
  }
}

GptSamples::TokenOrigin GptSamples::Locate(int64_t i, int64_t k) const {
  const int64_t j = indices_.shuffle_index[i];
  int64_t position = indices_.sample_index[2 * j];
  int64_t offset = indices_.sample_index[2 * j + 1] + k;
  // Token k lies k tokens after the sample's start, possibly several documents on.
  while (offset >= source_->document_length(indices_.document_index[position])) {
    offset -= source_->document_length(indices_.document_index[position]);
    ++position;
  }
  return {.document = indices_.document_index[position], .offset = offset};
}

}  // namespace nf::data
