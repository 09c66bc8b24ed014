#include "bench/step_workloads.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "data/synthetic_corpus.h"

namespace nf::bench {

launcher::TrainConfig MakeConfig(const Workload& w, bool normformer) {
  launcher::TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(w.num_layers);
  m.set_d_model(w.d_model);
  m.set_num_heads(w.num_heads);
  m.set_ffn_dim(w.ffn_dim);
  m.set_vocab_size(w.vocab_size);
  m.set_max_seq_len(w.seq_len);
  m.set_dropout(w.dropout);
  m.set_attention_dropout(w.attention_dropout);
  model::NormFormerConfig& switches = *m.mutable_normformer();
  switches.set_scale_attn(normformer);
  switches.set_scale_heads(normformer);
  switches.set_head_scale_placement(model::NormFormerConfig::BEFORE_OUT_PROJ);
  switches.set_scale_fc(normformer);
  switches.set_scale_resids(false);
  launcher::TrainOptions& t = *config.mutable_train();
  t.set_seq_len(w.seq_len);
  t.set_micro_batch_size(w.micro_batch);
  t.set_global_batch_size(w.global_batch);
  t.set_precision(launcher::TrainOptions::FP32);
  t.set_train_iters(1000);  // only the LR schedule sees it
  t.mutable_lr_schedule()->set_warmup_iters(30);
  return config;
}

double StepGflops(const Workload& w, int64_t params) {
  const double flops_per_token =
      6.0 * static_cast<double>(params) + 6.0 * w.num_layers * w.d_model * w.seq_len;
  return flops_per_token * static_cast<double>(int64_t{w.global_batch} * w.seq_len) / 1e9;
}

absl::StatusOr<FixedBatch> MakeFixedBatch(const launcher::TrainConfig& config) {
  const int64_t micro = config.train().micro_batch_size(), seq = config.train().seq_len();
  FixedBatch batch;
  NF_ASSIGN_OR_RETURN(batch.inputs, Tensor::HostZeros(DType::kI32, {micro, seq}));
  NF_ASSIGN_OR_RETURN(batch.targets, Tensor::HostZeros(DType::kI32, {micro, seq}));
  NF_ASSIGN_OR_RETURN(const data::SyntheticCorpus corpus,
                      data::SyntheticCorpus::Create(config.model().vocab_size(),
                                                    config.data().synthetic().branching(),
                                                    config.data().synthetic().seed()));
  std::vector<int32_t> sample(seq + 1);
  for (int64_t b = 0; b < micro; ++b) {
    corpus.Sample(b, seq + 1, sample.data());
    std::copy(sample.begin(), sample.end() - 1, batch.inputs.data<int32_t>() + b * seq);
    std::copy(sample.begin() + 1, sample.end(), batch.targets.data<int32_t>() + b * seq);
  }
  return batch;
}

}  // namespace nf::bench
