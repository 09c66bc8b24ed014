// train.samples: text from the model being trained at each validation, appended to
// RUN/samples.jsonl as {"step", "prompt", "text", "ids"} (llm.c prints such samples while it
// trains). The prompts are tokenized and (on world rank 0) the decoder started before MPI starts,
// as nf-generate does: nf-launch reads configs with protobuf, so the tokenizers run in the helper
// nf-tokenize (generate/text_decoder.h).
//
// At a validation every rank of the first data-parallel replica copies its stage's parameters
// into a PipelineLm of one token (the layout's tp x pp grid: its collectives stay within the
// replica; the other replicas hold the same parameters and skip) and generates each prompt as
// nf-generate does, with the same seed at every validation, so successive samples show the model
// changing rather than the draws.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "generate/pipeline_lm.h"
#include "generate/text_decoder.h"
#include "launcher/jsonl_log.h"
#include "launcher/train_config.pb.h"
#include "launcher/trainer.h"

namespace nf::generate {

class TrainingSamples {
 public:
  // Null when config.train().samples has no prompts. Before MPI starts: tokenizes the prompts
  // with nf-tokenize (beside this program, or in ../eval/ as in a build tree) and, when `writes`
  // (world rank 0), starts the decoder and opens RUN/samples.jsonl for appending.
  static absl::StatusOr<std::unique_ptr<TrainingSamples>> Prepare(
      const launcher::TrainConfig& config, const std::string& run_dir, bool writes);

  // Collective over the layout, on every rank: the samples after `step`.
  absl::Status Write(int64_t step, launcher::Trainer& trainer);

 private:
  TrainingSamples() = default;

  launcher::SampleOptions options_;
  std::vector<std::vector<int32_t>> contexts_;  // per prompt: end-of-document token + its ids
  std::optional<int32_t> end_of_document_;
  std::unique_ptr<TextDecoder> decoder_;  // world rank 0
  std::unique_ptr<launcher::JsonlLog> log_;
  std::string run_dir_;
  std::unique_ptr<PipelineLm> lm_;  // made at the first Write
};

}  // namespace nf::generate
