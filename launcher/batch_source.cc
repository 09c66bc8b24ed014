#include "launcher/batch_source.h"

#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "data/batch_loader.h"
#include "data/indexed_document_source.h"
#include "data/masked_lm.h"
#include "data/splits.h"
#include "data/synthetic_corpus.h"
#include "model/vocab.h"

namespace nf::launcher {
namespace {

class SyntheticBatches final : public BatchSource {
 public:
  // Sample i of the stream is the corpus's walk first_walk + i.
  SyntheticBatches(data::SyntheticCorpus corpus, uint64_t first_walk, Tensor inputs, Tensor targets)
      : corpus_(std::move(corpus)),
        first_walk_(first_walk),
        inputs_(std::move(inputs)),
        targets_(std::move(targets)),
        sample_(inputs_.dim(1) + 1) {}

  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) override {
    const int64_t batch = inputs_.dim(0), seq = inputs_.dim(1);
    const int64_t first = batch_start + micro_batch * batch;
    int32_t* inputs = inputs_.data<int32_t>();
    int32_t* targets = targets_.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      // A sample of seq + 1 tokens: inputs are its first seq, targets its last seq.
      corpus_.Sample(first_walk_ + static_cast<uint64_t>(first + b), seq + 1, sample_.data());
      std::copy(sample_.begin(), sample_.end() - 1, inputs + b * seq);
      std::copy(sample_.begin() + 1, sample_.end(), targets + b * seq);
    }
    return first;
  }
  const Tensor& inputs() const override { return inputs_; }
  const Tensor& targets() const override { return targets_; }
  int64_t stream_size() const override { return std::numeric_limits<int64_t>::max(); }
  std::string Describe() const override { return "the synthetic Markov corpus"; }
  std::vector<int64_t> StreamEpochs() const override { return {}; }

 private:
  data::SyntheticCorpus corpus_;
  uint64_t first_walk_;
  Tensor inputs_, targets_;
  std::vector<int32_t> sample_;
};

class DatasetBatches final : public BatchSource {
 public:
  DatasetBatches(data::BatchLoader loader, std::string names, std::vector<int64_t> epochs)
      : loader_(std::move(loader)), names_(std::move(names)), epochs_(std::move(epochs)) {}

  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) override {
    return loader_.Load(batch_start, micro_batch);
  }
  const Tensor& inputs() const override { return loader_.inputs(); }
  const Tensor& targets() const override { return loader_.targets(); }
  int64_t stream_size() const override { return loader_.stream_size(); }
  std::string Describe() const override { return names_; }
  std::vector<int64_t> StreamEpochs() const override { return epochs_; }

 private:
  data::BatchLoader loader_;
  std::string names_;
  std::vector<int64_t> epochs_;  // [datasets]: the epochs each dataset's samples span
};

// A masked LM's batches: the inner source's samples, corrupted by data::MaskSample. An encoder
// reads the sample itself, so each row's tokens are the inner inputs (the sample's first seq_len
// tokens; the inner targets, the next tokens, go unused); masks are keyed by the sample's stream
// index, so a sample is masked alike in every layout and on resume.
class MaskedLmBatches final : public BatchSource {
 public:
  MaskedLmBatches(std::unique_ptr<BatchSource> inner, data::MaskedLmSpec spec, Tensor inputs,
                  Tensor targets)
      : inner_(std::move(inner)),
        spec_(spec),
        inputs_(std::move(inputs)),
        targets_(std::move(targets)) {}

  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) override {
    NF_ASSIGN_OR_RETURN(const int64_t first, inner_->Load(batch_start, micro_batch));
    const int64_t batch = inputs_.dim(0), seq = inputs_.dim(1);
    const int32_t* tokens = inner_->inputs().data<int32_t>();
    int32_t* inputs = inputs_.data<int32_t>();
    int32_t* targets = targets_.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      const size_t row = static_cast<size_t>(b * seq), length = static_cast<size_t>(seq);
      data::MaskSample(spec_, static_cast<uint64_t>(first + b), {tokens + row, length},
                       {inputs + row, length}, {targets + row, length});
    }
    return first;
  }
  const Tensor& inputs() const override { return inputs_; }
  const Tensor& targets() const override { return targets_; }
  int64_t stream_size() const override { return inner_->stream_size(); }
  int64_t LossTokens(int64_t first, int64_t samples) const override {
    int64_t chosen = 0;
    for (int64_t i = first; i < first + samples; ++i) {
      chosen += data::MaskedCount(spec_.mask_prob, inputs_.dim(1),
                                  data::MaskedCountUniform(spec_.seed, static_cast<uint64_t>(i)));
    }
    return chosen;
  }
  std::string Describe() const override {
    return absl::StrCat(inner_->Describe(), ", masked as RoBERTa's (mask_prob ", spec_.mask_prob,
                        ", <mask> id ", spec_.mask_token, ")");
  }
  std::vector<int64_t> StreamEpochs() const override { return inner_->StreamEpochs(); }

 private:
  std::unique_ptr<BatchSource> inner_;
  data::MaskedLmSpec spec_;
  Tensor inputs_, targets_;  // i32 [micro_batch_size, seq_len]
};

absl::StatusOr<std::unique_ptr<BatchSource>> MakeDatasetBatches(const TrainConfig& config,
                                                                DataSplit split,
                                                                int64_t total_samples) {
  const TrainOptions& train = config.train();
  const DataConfig& data_config = config.data();
  std::vector<std::string> paths;
  std::vector<double> weights;
  if (!data_config.path().empty()) {
    paths.push_back(data_config.path());
    weights.push_back(1.0);
  }
  for (const WeightedDataset& d : data_config.blend()) {
    paths.push_back(d.path());
    weights.push_back(d.weight());
  }
  const bool validation = split == DataSplit::kValidation;
  NF_ASSIGN_OR_RETURN(data::Blending blending, data::Blending::Build(weights, total_samples));
  std::vector<data::GptSamples> samples;
  std::vector<int64_t> epochs;
  for (size_t k = 0; k < paths.size(); ++k) {
    NF_ASSIGN_OR_RETURN(std::shared_ptr<data::IndexedDocumentSource> source,
                        data::IndexedDocumentSource::Open(paths[k]));
    NF_ASSIGN_OR_RETURN(const std::vector<data::DocumentRange> splits,
                        data::ParseSplit(data_config.split(), source->dataset().num_documents()));
    const data::DocumentRange& documents = splits[validation ? 1 : 0];
    if (documents.begin >= documents.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.split '", data_config.split(), "' leaves no ",
          validation ? "validation" : "training", " documents in ", paths[k],
          validation ? ": give the second share some weight, or set train.eval_interval=0" : ""));
    }
    NF_ASSIGN_OR_RETURN(const data::DocumentRange sequences, source->SequencesOf(documents));
    NF_ASSIGN_OR_RETURN(data::GptSamples built,
                        data::GptSamples::Build(source, {.documents = sequences,
                                                         .seq_len = train.seq_len(),
                                                         .num_samples = blending.counts()[k],
                                                         .seed = train.seed()}));
    epochs.push_back(built.indices().num_epochs);
    samples.push_back(std::move(built));
  }
  NF_ASSIGN_OR_RETURN(data::BatchLoader loader,
                      data::BatchLoader::Create(std::move(samples), std::move(blending),
                                                {.seq_len = train.seq_len(),
                                                 .global_batch_size = train.global_batch_size(),
                                                 .micro_batch_size = train.micro_batch_size(),
                                                 .vocab_size = config.model().vocab_size()}));
  return std::make_unique<DatasetBatches>(std::move(loader), absl::StrJoin(paths, ", "),
                                          std::move(epochs));
}

}  // namespace

absl::Status CheckDataFilesExist(const TrainConfig& config) {
  std::vector<std::pair<std::string, std::string>> datasets;  // (field, prefix)
  if (!config.data().path().empty()) datasets.emplace_back("data.path", config.data().path());
  for (int k = 0; k < config.data().blend_size(); ++k) {
    datasets.emplace_back(absl::StrCat("data.blend[", k, "].path"), config.data().blend(k).path());
  }
  for (const auto& [field, prefix] : datasets) {
    for (const char* suffix : {".idx", ".bin"}) {
      std::error_code error;
      const std::filesystem::file_status status = std::filesystem::status(prefix + suffix, error);
      if (std::filesystem::is_regular_file(status)) continue;
      if (std::filesystem::exists(status)) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, " '", prefix, "': ", prefix, suffix,
            " is not a regular file (a directory?): give the prefix of an nf-preprocess output"));
      }
      // Not "does not exist" when the OS says something else.
      if (error && error != std::errc::no_such_file_or_directory) {
        return absl::FailedPreconditionError(absl::StrCat(field, " '", prefix, "': cannot read ",
                                                          prefix, suffix, ": ", error.message()));
      }
      return absl::NotFoundError(absl::StrCat(field, " '", prefix, "': ", prefix, suffix,
                                              " does not exist (nf-preprocess --output-prefix ",
                                              prefix, " writes it)"));
    }
  }
  return absl::OkStatus();
}

int64_t DefaultStreamSize(const TrainConfig& config, DataSplit split) {
  const TrainOptions& train = config.train();
  const int64_t batches =
      split == DataSplit::kValidation ? train.eval_iters() : train.train_iters();
  return batches * train.global_batch_size();
}

namespace {

// The source of a causal LM: samples as they are, targets the next tokens.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeTokenBatches(const TrainConfig& config,
                                                              DataSplit split,
                                                              int64_t stream_size) {
  if (!config.data().path().empty() || config.data().blend_size() > 0) {
    return MakeDatasetBatches(config, split,
                              stream_size > 0 ? stream_size : DefaultStreamSize(config, split));
  }
  const TrainOptions& train = config.train();
  const SyntheticDataConfig& synthetic = config.data().synthetic();
  NF_ASSIGN_OR_RETURN(data::SyntheticCorpus corpus,
                      data::SyntheticCorpus::Create(config.model().vocab_size(),
                                                    synthetic.branching(), synthetic.seed()));
  const Shape batch{train.micro_batch_size(), train.seq_len()};
  NF_ASSIGN_OR_RETURN(Tensor inputs, Tensor::HostZeros(DType::kI32, batch));
  NF_ASSIGN_OR_RETURN(Tensor targets, Tensor::HostZeros(DType::kI32, batch));
  // Validation walks start past 2^48 samples, far beyond any run's training samples.
  const uint64_t first_walk = split == DataSplit::kValidation ? uint64_t{1} << 48 : 0;
  return std::make_unique<SyntheticBatches>(std::move(corpus), first_walk, std::move(inputs),
                                            std::move(targets));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> MakeBatchSource(const TrainConfig& config,
                                                             DataSplit split, int64_t stream_size) {
  NF_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source,
                      MakeTokenBatches(config, split, stream_size));
  const nf::model::ModelConfig& model = config.model();
  if (model.objective() != nf::model::ModelConfig::MASKED_LM) return source;
  const MaskedLmConfig& masked_lm = config.data().masked_lm();
  const data::MaskedLmSpec spec{.mask_prob = masked_lm.mask_prob(),
                                .random_token_prob = masked_lm.random_token_prob(),
                                .leave_unmasked_prob = masked_lm.leave_unmasked_prob(),
                                .mask_token = model::MaskTokenId(model),
                                .vocab_size = model.vocab_size(),
                                .seed = config.train().seed()};
  const Shape batch{config.train().micro_batch_size(), config.train().seq_len()};
  NF_ASSIGN_OR_RETURN(Tensor inputs, Tensor::HostZeros(DType::kI32, batch));
  NF_ASSIGN_OR_RETURN(Tensor targets, Tensor::HostZeros(DType::kI32, batch));
  return std::make_unique<MaskedLmBatches>(std::move(source), spec, std::move(inputs),
                                           std::move(targets));
}

}  // namespace nf::launcher
