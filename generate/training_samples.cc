#include "generate/training_samples.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "eval/tokenizer_client.h"
#include "generate/generation.h"

namespace nf::generate {
namespace {

// nf-tokenize beside this program, or in the build tree's eval/ when this is build/tools/.
absl::StatusOr<std::string> FindTokenizeHelper() {
  if (auto beside = eval::ProgramBesideThisOne("nf-tokenize"); beside.ok()) return beside;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::filesystem::path in_build = self.parent_path().parent_path() / "eval" / "nf-tokenize";
  if (!error && std::filesystem::exists(in_build, error)) return in_build.string();
  return absl::NotFoundError(
      "train.samples needs nf-tokenize (build it: cmake --build build --target nf-tokenize) "
      "beside nf-launch or in ../eval/");
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingSamples>> TrainingSamples::Prepare(
    const launcher::TrainConfig& config, const std::string& run_dir, bool writes) {
  const launcher::SampleOptions& options = config.train().samples();
  if (options.prompts().empty()) return nullptr;
  if (config.train().device() != launcher::TrainOptions::CPU) {
    return absl::InvalidArgumentError("train.samples: CPU training only (train.device: CPU)");
  }
  const eval::TokenizerFlags flags = {.tokenizer = options.tokenizer(),
                                      .vocab_file = options.vocab_file(),
                                      .merges_file = options.merges_file(),
                                      .spm_model = options.spm_model(),
                                      .parse_special_tokens = options.parse_special_tokens()};
  if (absl::Status status = eval::CheckTokenizerFlags(flags); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("train.samples: ", status.message()));
  }
  const SamplingOptions sampling = {.temperature = options.temperature(),
                                    .top_k = options.top_k(),
                                    .top_p = options.top_p(),
                                    .seed = options.seed()};
  if (absl::Status status = CheckSamplingOptions(sampling); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("train.samples: ", status.message()));
  }
  NF_ASSIGN_OR_RETURN(const std::string helper, FindTokenizeHelper());
  const std::vector<std::string> prompts(options.prompts().begin(), options.prompts().end());
  NF_ASSIGN_OR_RETURN(const eval::TokenizedTexts tokenized,
                      eval::TokenizeTexts(helper, flags, prompts));
  std::unique_ptr<TrainingSamples> samples(new TrainingSamples());
  samples->options_ = options;
  samples->end_of_document_ = tokenized.end_of_document;
  samples->run_dir_ = run_dir;
  const int64_t max_seq_len = config.model().max_seq_len();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t>& context = samples->contexts_.emplace_back();
    if (tokenized.end_of_document) context.push_back(*tokenized.end_of_document);
    context.insert(context.end(), tokenized.ids[i].begin(), tokenized.ids[i].end());
    if (context.empty() || static_cast<int64_t>(context.size()) >= max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.samples: prompt ", i + 1, " has ", context.size(),
          " tokens; it needs at least one and fewer than model.max_seq_len ", max_seq_len));
    }
  }
  if (writes) {
    NF_ASSIGN_OR_RETURN(samples->decoder_, TextDecoder::Start(helper, flags));
  }
  return samples;
}

absl::Status TrainingSamples::Write(int64_t step, launcher::Trainer& trainer) {
  const parallel::ProcessGroups& groups = trainer.groups();
  if (groups.topology.dp_rank() != 0) return absl::OkStatus();
  if (trainer.chunks().size() != 1) {
    return absl::InvalidArgumentError("train.samples: not with virtual pipeline stages");
  }
  const model::NormFormerModel& model = *trainer.chunks()[0];
  if (!lm_) {
    const eval::EvalRank rank = {.groups = &groups,
                                 .device_tp = groups.tp.get(),
                                 .device_pp = groups.pp.get(),
                                 .device = trainer.device()};
    NF_ASSIGN_OR_RETURN(lm_, PipelineLm::Create(model.config(), model.options().dtype, 1, rank));
  }
  NF_RETURN_IF_ERROR(lm_->CopyParameters(model.params()));
  if (decoder_ && !log_) {
    NF_ASSIGN_OR_RETURN(
        launcher::JsonlLog log,
        launcher::JsonlLog::Open((std::filesystem::path(run_dir_) / "samples.jsonl").string()));
    log_ = std::make_unique<launcher::JsonlLog>(std::move(log));
  }
  const GenerationOptions generation = {.max_new_tokens = options_.max_new_tokens(),
                                        .end_of_document = end_of_document_,
                                        .sampling = {.temperature = options_.temperature(),
                                                     .top_k = options_.top_k(),
                                                     .top_p = options_.top_p(),
                                                     .seed = options_.seed()}};
  const int64_t max_seq_len = model.config().max_seq_len();
  for (size_t i = 0; i < contexts_.size(); ++i) {
    GenerationOptions options = generation;
    const int64_t room = max_seq_len - static_cast<int64_t>(contexts_[i].size());
    options.max_new_tokens = std::min(options.max_new_tokens, room);
    NF_RETURN_IF_ERROR(
        lm_->StartSequence(static_cast<int64_t>(contexts_[i].size()) + options.max_new_tokens));
    NF_ASSIGN_OR_RETURN(const Generated generated,
                        GenerateTokens(contexts_[i], options, i, [&](int32_t token) {
                          return lm_->Cached({&token, 1});
                        }));
    if (!decoder_) continue;
    const std::span<const int32_t> prompt_ids =
        std::span<const int32_t>(contexts_[i]).subspan(end_of_document_ ? 1 : 0);
    NF_ASSIGN_OR_RETURN(const std::string text, ContinuationText(prompt_ids, generated.ids,
                                                                 [&](std::span<const int32_t> ids) {
                                                                   return decoder_->Decode(ids);
                                                                 }));
    NF_RETURN_IF_ERROR(log_->Write(launcher::JsonObject()
                                       .AddInt("step", step)
                                       .AddString("prompt", ValidUtf8(options_.prompts(i)))
                                       .AddString("text", ValidUtf8(text))
                                       .AddIntArray("ids", generated.ids)));
  }
  return absl::OkStatus();
}

}  // namespace nf::generate
