#include "data/batch_loader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::data {

absl::StatusOr<BatchLoader> BatchLoader::Create(std::vector<GptSamples> datasets, Blending blending,
                                                const BatchLoaderConfig& config) {
  const auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("data: batch loader: ", what));
  };
  if (config.seq_len < 1) return invalid(absl::StrCat("seq_len ", config.seq_len, " < 1"));
  if (config.vocab_size < 1) {
    return invalid(absl::StrCat("vocab_size ", config.vocab_size, " < 1"));
  }
  if (config.micro_batch_size < 1 || config.data_parallel_size < 1) {
    return invalid(absl::StrCat("micro-batch size ", config.micro_batch_size,
                                " and data-parallel size ", config.data_parallel_size,
                                " must be >= 1"));
  }
  if (config.data_parallel_rank < 0 || config.data_parallel_rank >= config.data_parallel_size) {
    return invalid(absl::StrCat("data-parallel rank ", config.data_parallel_rank, " is not in [0, ",
                                config.data_parallel_size, ")"));
  }
  const int64_t per_step = config.data_parallel_size * config.micro_batch_size;
  if (config.global_batch_size < 1 || config.global_batch_size % per_step != 0) {
    return invalid(absl::StrCat("global batch size ", config.global_batch_size,
                                " is not a positive multiple of data-parallel size ",
                                config.data_parallel_size, " x micro-batch size ",
                                config.micro_batch_size));
  }
  if (static_cast<int64_t>(datasets.size()) != blending.num_datasets()) {
    return invalid(
        absl::StrCat(datasets.size(), " datasets for a blend of ", blending.num_datasets()));
  }
  for (size_t k = 0; k < datasets.size(); ++k) {
    const GptSamples& dataset = datasets[k];
    if (dataset.seq_len() != config.seq_len || dataset.size() < blending.counts()[k]) {
      return invalid(absl::StrCat("dataset ", dataset.source().name(), " has ", dataset.size(),
                                  " samples of ", dataset.seq_len(), " tokens; the blend needs ",
                                  blending.counts()[k], " of ", config.seq_len));
    }
  }
  const Shape shape{config.micro_batch_size, config.seq_len};
  NF_ASSIGN_OR_RETURN(Tensor inputs, Tensor::HostZeros(DType::kI32, shape));
  NF_ASSIGN_OR_RETURN(Tensor targets, Tensor::HostZeros(DType::kI32, shape));
  return BatchLoader(std::move(datasets), std::move(blending), config, std::move(inputs),
                     std::move(targets));
}

BatchLoader::BatchLoader(std::vector<GptSamples> datasets, Blending blending,
                         const BatchLoaderConfig& config, Tensor inputs, Tensor targets)
    : datasets_(std::move(datasets)),
      blending_(std::move(blending)),
      config_(config),
      micro_batches_per_step_(config.global_batch_size /
                              (config.data_parallel_size * config.micro_batch_size)),
      inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      sample_(config.seq_len + 1) {}

absl::Status BatchLoader::ReadSample(int64_t index) {
  const int k = blending_.dataset(index);
  const int64_t within = blending_.sample(index);
  const GptSamples& dataset = datasets_[k];
  dataset.Sample(within, sample_.data());
  for (int64_t t = 0; t <= config_.seq_len; ++t) {
    const int32_t token = sample_[t];
    if (token >= 0 && token < config_.vocab_size) continue;
    const GptSamples::TokenOrigin origin = dataset.Locate(within, t);
    return absl::InvalidArgumentError(absl::StrCat(
        "data: token ", token, " at offset ", origin.offset, " of document ", origin.document,
        " of dataset ", dataset.source().name(), " is outside the vocabulary [0, ",
        config_.vocab_size, ") (training-stream sample ", index, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BatchLoader::Load(int64_t batch_start, int64_t micro_batch) {
  const int64_t m = config_.micro_batch_size, seq_len = config_.seq_len;
  const int64_t first =
      batch_start +
      config_.data_parallel_rank * (config_.global_batch_size / config_.data_parallel_size) +
      micro_batch * m;
  if (batch_start < 0 || micro_batch < 0 || micro_batch >= micro_batches_per_step_ ||
      first + m > stream_size()) {
    return absl::OutOfRangeError(absl::StrCat(
        "data: micro-batch ", micro_batch, " of the global batch at sample ", batch_start,
        " needs samples [", first, ", ", first + m, ") of a training stream of ", stream_size()));
  }
  int32_t* inputs = inputs_.data<int32_t>();
  int32_t* targets = targets_.data<int32_t>();
  for (int64_t b = 0; b < m; ++b) {
    NF_RETURN_IF_ERROR(ReadSample(first + b));
    std::copy(sample_.begin(), sample_.end() - 1, inputs + b * seq_len);
    std::copy(sample_.begin() + 1, sample_.end(), targets + b * seq_len);
  }
  return first;
}

absl::StatusOr<int64_t> BatchLoader::Next() {
  NF_ASSIGN_OR_RETURN(const int64_t first, Load(consumed_samples_, next_micro_batch_));
  if (++next_micro_batch_ == micro_batches_per_step_) {
    next_micro_batch_ = 0;
    consumed_samples_ += config_.global_batch_size;
  }
  return first;
}

void BatchLoader::ResumeFrom(int64_t consumed_samples) {
  consumed_samples_ = consumed_samples;
  next_micro_batch_ = 0;
}

}  // namespace nf::data
