#include "monitoring/rank_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "prometheus/text_serializer.h"

namespace nf::monitoring {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Step durations from 10 ms (a tiny model on a GPU) to 10 minutes (a large step on slow
// hardware), about three buckets per decade.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 600};
}

}  // namespace

RankMetrics::RankMetrics(const RankIdentity& id)
    : labels_{{"job", id.job},
              {"rank", absl::StrCat(id.rank)},
              {"tp_rank", absl::StrCat(id.tp_rank)},
              {"pp_rank", absl::StrCat(id.pp_rank)},
              {"dp_rank", absl::StrCat(id.dp_rank)}},
      registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add(labels_);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add(labels_);
  };
  steps_ = counter("normformer_steps_total", "Optimizer steps finished (skipped ones included).");
  tokens_ = counter("normformer_tokens_total", "Tokens with a loss trained on, whole job.");
  skipped_ = counter("normformer_skipped_steps_total",
                     "Steps that applied no update: non-finite gradients, an update that would "
                     "overflow the model dtype, a spike (train.spike) or skipped data.");
  step_compute_ = gauge("normformer_step_compute_seconds",
                        "Mean seconds per step of this rank's own work (not waiting for "
                        "communication or data) over the last log interval.");
  step_comm_wait_ = gauge("normformer_step_comm_wait_seconds",
                          "Mean seconds per step this rank waited for communication over the "
                          "last log interval.");
  step_data_wait_ = gauge("normformer_step_data_wait_seconds",
                          "Mean seconds per step this rank waited for the data loader over the "
                          "last log interval.");
  rollbacks_ = counter("normformer_rollbacks_total",
                       "Reloads of the newest checkpoint from before a spike (train.spike "
                       "action ROLLBACK), each skipping the data that led to it.");
  flight_records_ = counter("normformer_flight_records_total",
                            "Flight records this rank wrote to RUN/flight/ (on request, a signal "
                            "or the watchdog): nf-flight RUN reads them.");
  spikes_ = &BuildCounter()
                 .Name("normformer_spikes_total")
                 .Help("Loss or gradient-norm spikes detected (train.spike), by metric.")
                 .Register(r);
  // From 0: Prometheus's increase() cannot see a series' first sample as an increase.
  for (const char* metric : {"loss", "grad_norm"}) {
    prometheus::Labels labels = labels_;
    labels["metric"] = metric;
    spikes_->Add(labels);
  }
  data_wait_ =
      counter("normformer_data_wait_seconds_total", "Time this rank waited for the data loader.");
  train_loss_ = gauge("normformer_train_loss", "Mean token loss of the last step (nats).");
  validation_loss_ = gauge("normformer_validation_loss", "Last validation loss (nats).");
  learning_rate_ = gauge("normformer_learning_rate", "Learning rate of the last step.");
  loss_scale_ = gauge("normformer_loss_scale", "fp16 dynamic loss scale (1 otherwise).");
  grad_norm_ = gauge("normformer_grad_norm", "Global gradient norm before clipping.");
  tokens_per_second_ = gauge("normformer_tokens_per_second", "Tokens per second, last step.");
  mfu_ = gauge("normformer_mfu_ratio",
               "Model FLOPs utilisation of the last step against the GEMM ceiling measured at "
               "start (6 x params + 6 x layers x d_model x seq FLOPs per token, 12 x for a "
               "masked LM's bidirectional attention).");
  pipeline_idle_ = gauge("normformer_pipeline_idle_ratio",
                         "Share of the last step this rank spent waiting for pipeline peers.");
  checkpoint_save_ = gauge("normformer_checkpoint_save_seconds",
                           "Time the last checkpoint save blocked training.");
  checkpoint_load_ =
      gauge("normformer_checkpoint_load_seconds", "Time the checkpoint load at start took.");
  last_checkpoint_step_ = gauge("normformer_last_checkpoint_step", "Step of the last checkpoint.");
  last_step_time_ =
      gauge("normformer_last_step_timestamp_seconds", "Unix time at which the last step finished.");
  auto& memory = BuildGauge()
                     .Name("normformer_memory_bytes")
                     .Help("Memory in use: host (resident set) and device (tensors).")
                     .Register(r);
  prometheus::Labels host = labels_, device = labels_;
  host["kind"] = "host";
  device["kind"] = "device";
  host_memory_ = &memory.Add(host);
  device_memory_ = &memory.Add(device);
  step_duration_ = &BuildHistogram()
                        .Name("normformer_step_duration_seconds")
                        .Help("Wall time of each optimizer step.")
                        .Register(r)
                        .Add(labels_, StepBuckets());
  layer_grad_norm_ = &BuildGauge()
                          .Name("normformer_layer_grad_norm")
                          .Help("Gradient norm of each block (layer index, embedding, head).")
                          .Register(r);
  run_info_ = &BuildGauge()
                   .Name("normformer_run_info")
                   .Help(
                       "The run's configuration as labels (value 1): model shape, parameters, "
                       "parallel layout, batch, precision, device.")
                   .Register(r);
  comm_bytes_ = &BuildCounter()
                     .Name("normformer_comm_bytes_total")
                     .Help("Bytes this rank moved, by group and operation.")
                     .Register(r);
  comm_calls_ = &BuildCounter()
                     .Name("normformer_comm_calls_total")
                     .Help("Communication calls this rank made, by group and operation.")
                     .Register(r);
  comm_seconds_ = &BuildCounter()
                       .Name("normformer_comm_seconds_total")
                       .Help(
                           "Time this rank waited for communication to complete (transfer and "
                           "late peers; the exposed part of async calls), by group and "
                           "operation.")
                       .Register(r);
}

absl::StatusOr<std::unique_ptr<RankMetrics>> RankMetrics::Serve(const MonitoringConfig& config,
                                                                const RankIdentity& identity,
                                                                int local_rank) {
  std::unique_ptr<RankMetrics> metrics(new RankMetrics(identity));
  const int port = config.port_base() + local_rank;
  NF_ASSIGN_OR_RETURN(
      metrics->server_,
      MetricsServer::Start(config.bind_address(), port, [m = metrics.get()] { return m->Text(); }));
  metrics->port_ = port;
  // "Now" until the first step finishes: a rank still starting up is not a stalled one (the
  // no-step alert compares this with the time).
  metrics->last_step_time_->Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return metrics;
}

std::unique_ptr<RankMetrics> RankMetrics::Unserved(const RankIdentity& identity) {
  return std::unique_ptr<RankMetrics>(new RankMetrics(identity));
}

std::string RankMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void RankMetrics::RecordRunInfo(const std::vector<std::pair<std::string, std::string>>& info) {
  prometheus::Labels labels = labels_;
  for (const auto& [name, value] : info) labels[name] = value;
  run_info_->Add(labels).Set(1);
}

void RankMetrics::RecordStep(const StepRecord& s) {
  steps_->Increment();
  tokens_->Increment(static_cast<double>(s.tokens));
  if (s.skipped) skipped_->Increment();
  train_loss_->Set(s.loss);
  learning_rate_->Set(s.learning_rate);
  loss_scale_->Set(s.loss_scale);
  grad_norm_->Set(s.grad_norm);
  tokens_per_second_->Set(s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0);
  mfu_->Set(s.mfu);
  step_duration_->Observe(s.seconds);
  last_step_time_->Set(s.unix_seconds);
}

void RankMetrics::RecordLayerGradNorms(const std::vector<std::pair<std::string, double>>& norms) {
  for (const auto& [layer, norm] : norms) {
    prometheus::Labels labels = labels_;
    labels["layer"] = layer;
    layer_grad_norm_->Add(labels).Set(norm);
  }
}

void RankMetrics::RecordValidation(double loss) { validation_loss_->Set(loss); }

void RankMetrics::RecordCheckpointSave(double seconds, int64_t step) {
  checkpoint_save_->Set(seconds);
  last_checkpoint_step_->Set(static_cast<double>(step));
}

void RankMetrics::RecordCheckpointLoad(double seconds, int64_t step) {
  checkpoint_load_->Set(seconds);
  last_checkpoint_step_->Set(static_cast<double>(step));
}

void RankMetrics::RecordComm(const std::string& group, const parallel::CommStats& totals) {
  parallel::CommStats& seen = comm_seen_[group];
  for (int op = 0; op < static_cast<int>(parallel::CommOp::kCount); ++op) {
    const int64_t bytes = totals.bytes[op] - seen.bytes[op];
    const int64_t calls = totals.calls[op] - seen.calls[op];
    const double seconds = totals.seconds[op] - seen.seconds[op];
    if (calls <= 0 && bytes <= 0) continue;  // unused operations make no series
    prometheus::Labels labels = labels_;
    labels["group"] = group;
    labels["op"] = std::string(parallel::CommOpName(static_cast<parallel::CommOp>(op)));
    comm_bytes_->Add(labels).Increment(static_cast<double>(std::max<int64_t>(bytes, 0)));
    comm_calls_->Add(labels).Increment(static_cast<double>(std::max<int64_t>(calls, 0)));
    comm_seconds_->Add(labels).Increment(std::max(seconds, 0.0));
  }
  seen = totals;
}

void RankMetrics::RecordMemory(int64_t host_bytes, int64_t device_bytes) {
  host_memory_->Set(static_cast<double>(host_bytes));
  device_memory_->Set(static_cast<double>(device_bytes));
}

void RankMetrics::RecordDataWait(double seconds) { data_wait_->Increment(seconds); }

void RankMetrics::RecordPipelineIdle(double ratio) { pipeline_idle_->Set(ratio); }

void RankMetrics::RecordSpike(const std::string& metric) {
  prometheus::Labels labels = labels_;
  labels["metric"] = metric;
  spikes_->Add(labels).Increment();
}

void RankMetrics::RecordRollback() { rollbacks_->Increment(); }

void RankMetrics::RecordFlightRecords(int64_t written) {
  const double seen = flight_records_->Value();
  if (written > seen) flight_records_->Increment(static_cast<double>(written) - seen);
}

void RankMetrics::RecordStepSplit(double compute, double comm_wait, double data_wait) {
  step_compute_->Set(compute);
  step_comm_wait_->Set(comm_wait);
  step_data_wait_->Set(data_wait);
}

}  // namespace nf::monitoring
