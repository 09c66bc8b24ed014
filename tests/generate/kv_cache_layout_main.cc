// kv_cache_layout: the KV-cache test of nf-generate on a real checkpoint and any layout (run by
// nf_generate_test.py on one process and under mpirun on tp 2 and pp 2). Greedy decoding through
// the cache from a given context; at every step, the logits the cached step returned are compared
// with a full forward of the whole prefix by a model of that prefix's length (the same
// parameters, no cache). Rank 0 prints one JSON line: the generated ids and the largest absolute
// logit difference over all steps and the whole vocabulary.
//
//   kv_cache_layout CHECKPOINT_DIR TP PP STEPS ID [ID...]
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "checkpoint/load.h"
#include "core/status.h"
#include "generate/pipeline_lm.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"

namespace {

absl::Status Check(int argc, char** argv) {
  if (argc < 6) return absl::InvalidArgumentError("usage: kv_cache_layout DIR TP PP STEPS ID...");
  const int tp = std::atoi(argv[2]), pp = std::atoi(argv[3]);
  const int steps = std::atoi(argv[4]);
  std::vector<int32_t> sequence;
  for (int i = 5; i < argc; ++i) sequence.push_back(std::atoi(argv[i]));
  NF_ASSIGN_OR_RETURN(const nf::checkpoint::Manifest manifest,
                      nf::checkpoint::ReadManifest(argv[1]));
  const bool mpi = tp * pp > 1;
  nf::parallel::ProcessGroups single = nf::parallel::SingleProcessGroups();
  absl::StatusOr<nf::parallel::ProcessGroups> created;
  if (mpi) {
    created = nf::parallel::CreateProcessGroups({.tp = tp, .pp = pp, .dp = 1});
    NF_RETURN_IF_ERROR(created.status());
  }
  nf::parallel::ProcessGroups& groups = mpi ? *created : single;
  const nf::eval::EvalRank rank = {
      .groups = &groups, .device_tp = groups.tp.get(), .device_pp = groups.pp.get()};
  const nf::model::ModelConfig& config = manifest.model();
  NF_ASSIGN_OR_RETURN(auto cached,
                      nf::generate::PipelineLm::Create(config, nf::DType::kF32, 1, rank));
  NF_RETURN_IF_ERROR(cached->Load(argv[1], manifest));
  const int64_t prompt = static_cast<int64_t>(sequence.size());
  NF_RETURN_IF_ERROR(cached->StartSequence(prompt + steps));
  const int64_t vocab = config.vocab_size();
  double worst = 0.0;
  std::vector<float> logits;
  for (int64_t t = 0; t < prompt + steps; ++t) {
    if (t >= prompt) {  // greedy: the argmax of the last step's logits
      sequence.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    NF_ASSIGN_OR_RETURN(logits, cached->Cached({&sequence[t], 1}));
    NF_ASSIGN_OR_RETURN(auto full,
                        nf::generate::PipelineLm::Create(config, nf::DType::kF32, t + 1, rank));
    NF_RETURN_IF_ERROR(full->CopyParameters(*cached));
    NF_ASSIGN_OR_RETURN(const std::vector<float> rows,
                        full->Full({sequence.data(), size_t(t + 1)}));
    for (int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::abs(static_cast<double>(logits[v]) - rows[t * vocab + v]));
    }
  }
  if (groups.topology.world_rank() == 0) {
    std::cout << "{\"max_abs_diff\": " << worst << ", \"ids\": ["
              << absl::StrJoin(sequence.begin() + prompt, sequence.end(), ", ") << "]}\n";
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (const absl::Status status = Check(argc, argv); !status.ok()) {
    std::cerr << "kv_cache_layout: " << status.message() << "\n";
    if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) nf::parallel::AbortJob(1);
    return 1;
  }
  return 0;
}
