#include "launcher/step_metrics.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ops/backend.h"

namespace nf::launcher {
namespace {

// This process's resident set (/proc/self/statm), 0 where it cannot be read.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

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
}

}  // namespace nf::launcher
