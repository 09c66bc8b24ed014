#include "launcher/step_metrics.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/host_memory.h"
#include "core/ops/backend.h"
#include "parallel/flight_dumps.h"

namespace nf::launcher {
namespace {

// The NormFormer operations a model config turns on, e.g. "scale_attn,scale_heads,scale_fc".
std::string NormFormerOperations(const model::NormFormerConfig& n) {
  std::vector<std::string> on;
  if (n.scale_attn()) on.push_back("scale_attn");
  if (n.scale_heads()) on.push_back("scale_heads");
  if (n.scale_fc()) on.push_back("scale_fc");
  if (n.scale_resids()) on.push_back("scale_resids");
  return on.empty() ? "none" : absl::StrJoin(on, ",");
}

}  // namespace

void RecordRunInfo(const TrainConfig& config, const Trainer& trainer,
                   monitoring::RankMetrics& metrics) {
  const model::ModelConfig& m = config.model();
  const TrainOptions& train = config.train();
  const ParallelConfig& parallel = config.parallel();
  const parallel::Topology& t = trainer.groups().topology;
  metrics.RecordRunInfo({
      {"layers", absl::StrCat(m.num_layers())},
      {"d_model", absl::StrCat(m.d_model())},
      {"heads", absl::StrCat(m.num_heads())},
      {"ffn_dim", absl::StrCat(m.ffn_dim())},
      {"vocab_size", absl::StrCat(m.vocab_size())},
      {"parameters", absl::StrCat(trainer.num_global_params())},
      {"normformer", NormFormerOperations(m.normformer())},
      {"tp", absl::StrCat(t.tp())},
      {"pp", absl::StrCat(t.pp())},
      {"dp", absl::StrCat(t.dp())},
      {"schedule", ParallelConfig::Schedule_Name(parallel.pipeline_schedule())},
      {"virtual_stages", absl::StrCat(std::max(1, parallel.virtual_stages()))},
      {"zero1", parallel.distributed_optimizer() ? "true" : "false"},
      {"seq_len", absl::StrCat(train.seq_len())},
      {"micro_batch", absl::StrCat(train.micro_batch_size())},
      {"global_batch", absl::StrCat(train.global_batch_size())},
      {"precision", TrainOptions::Precision_Name(train.precision())},
      {"device", trainer.device().ToString()},
  });
}

void RecordStepMetrics(const StepStats& stats, const Trainer& trainer, double mfu,
                       monitoring::RankMetrics& metrics) {
  metrics.RecordStep({.step = stats.step,
                      .loss = stats.loss,
                      .learning_rate = stats.lr,
                      .loss_scale = stats.loss_scale,
                      .grad_norm = stats.grad_norm,
                      .skipped = stats.skipped,
                      .tokens = stats.tokens,
                      .seconds = stats.seconds,
                      .mfu = mfu,
                      .unix_seconds = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())});
  if (!stats.block_grad_norms.empty()) metrics.RecordLayerGradNorms(stats.block_grad_norms);
  for (const auto& [group, totals] : trainer.CommTotals()) metrics.RecordComm(group, totals);
  metrics.RecordDataWait(stats.data_seconds);
  metrics.RecordPipelineIdle(stats.seconds > 0 ? stats.pipeline_wait_seconds / stats.seconds : 0.0);
  metrics.RecordMemory(ResidentBytes(), ops::BytesInUse(trainer.device()));
  metrics.RecordFlightRecords(parallel::FlightRecordsWritten());
}

}  // namespace nf::launcher
