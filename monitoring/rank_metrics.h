// RankMetrics: the Prometheus metrics one rank serves on bind_address:port_base + local rank
// (prometheus-cpp's registry and text format behind metrics_server.h; nothing but /metrics is
// served). Every series carries the
// labels job, rank, tp_rank, pp_rank and dp_rank, so dashboards can compare ranks (stragglers)
// and alerts can name one.
//
// Recording is a handful of atomic updates, done once per step by the training loop; the
// server's thread renders a scrape, away from the step. Names follow Prometheus
// conventions (`_total` counters, `_seconds`, `_bytes`, `_ratio`) and pass
// `promtool check metrics`; deploy/prometheus/ and deploy/grafana/ use exactly these names.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "monitoring/metrics_server.h"
#include "monitoring/monitoring_config.pb.h"
#include "parallel/communicator.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace nf::monitoring {

struct RankIdentity {
  std::string job;
  int rank = 0, tp_rank = 0, pp_rank = 0, dp_rank = 0;
};

// What one optimizer step reports (the loss and norms are the job's, the same on every rank).
struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;
  double learning_rate = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
  bool skipped = false;
  int64_t tokens = 0;         // tokens with a loss in the global batch
  double seconds = 0.0;       // wall time of the step
  double mfu = 0.0;           // model FLOPs utilisation of this step, 0..1
  double unix_seconds = 0.0;  // when it finished
};

class RankMetrics {
 public:
  // Listens on config.bind_address():config.port_base() + local_rank; an error names the
  // address and suggests another port_base when it is taken.
  static absl::StatusOr<std::unique_ptr<RankMetrics>> Serve(const MonitoringConfig& config,
                                                            const RankIdentity& identity,
                                                            int local_rank);
  // The metrics without a server (tests, and the serialisation benchmark).
  static std::unique_ptr<RankMetrics> Unserved(const RankIdentity& identity);

  // The port /metrics is served on (0 when unserved).
  int port() const { return port_; }
  // The text exposition of every metric, as a scrape would return it.
  std::string Text() const;

  // The run's configuration as the labels of normformer_run_info (value 1), set once at start:
  // what a dashboard shows next to the curves (model shape, layout, precision, ...).
  void RecordRunInfo(const std::vector<std::pair<std::string, std::string>>& info);
  void RecordStep(const StepRecord& step);
  // Per-layer gradient norms: `layer` is the global layer index, or "embedding" / "head".
  void RecordLayerGradNorms(const std::vector<std::pair<std::string, double>>& norms);
  void RecordValidation(double loss);
  void RecordCheckpointSave(double seconds, int64_t step);
  void RecordCheckpointLoad(double seconds, int64_t step);
  // A communicator's running totals (Communicator::stats()); the counters advance by the
  // difference from the previous call for the same group.
  void RecordComm(const std::string& group, const parallel::CommStats& totals);
  void RecordMemory(int64_t host_bytes, int64_t device_bytes);
  void RecordDataWait(double seconds);    // added to the running total
  void RecordPipelineIdle(double ratio);  // this step's share of time spent waiting on peers
  // This rank's mean seconds per step over the last log interval: its own work, waiting for
  // communication, waiting for data (launcher/straggler_report.h).
  void RecordStepSplit(double compute, double comm_wait, double data_wait);
  // The flight records this rank has written so far (parallel/flight_dumps.h).
  void RecordFlightRecords(int64_t written);
  // A loss or gradient-norm spike (`metric`: "loss", "grad_norm") and a rollback it caused.
  void RecordSpike(const std::string& metric);
  void RecordRollback();

 private:
  explicit RankMetrics(const RankIdentity& identity);

  prometheus::Labels labels_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;

  prometheus::Counter* steps_;
  prometheus::Counter* tokens_;
  prometheus::Counter* skipped_;
  prometheus::Counter* data_wait_;
  prometheus::Counter* rollbacks_;
  prometheus::Counter* flight_records_;
  prometheus::Family<prometheus::Counter>* spikes_;
  prometheus::Gauge* train_loss_;
  prometheus::Gauge* validation_loss_;
  prometheus::Gauge* learning_rate_;
  prometheus::Gauge* loss_scale_;
  prometheus::Gauge* grad_norm_;
  prometheus::Gauge* tokens_per_second_;
  prometheus::Gauge* mfu_;
  prometheus::Gauge* pipeline_idle_;
  prometheus::Gauge* step_compute_;
  prometheus::Gauge* step_comm_wait_;
  prometheus::Gauge* step_data_wait_;
  prometheus::Gauge* checkpoint_save_;
  prometheus::Gauge* checkpoint_load_;
  prometheus::Gauge* last_checkpoint_step_;
  prometheus::Gauge* last_step_time_;
  prometheus::Gauge* host_memory_;
  prometheus::Gauge* device_memory_;
  prometheus::Histogram* step_duration_;
  prometheus::Family<prometheus::Gauge>* layer_grad_norm_;
  prometheus::Family<prometheus::Gauge>* run_info_;
  prometheus::Family<prometheus::Counter>* comm_bytes_;
  prometheus::Family<prometheus::Counter>* comm_calls_;
  prometheus::Family<prometheus::Counter>* comm_seconds_;
  // The totals last recorded per (group, operation): counters advance by differences.
  std::map<std::string, parallel::CommStats> comm_seen_;
  // Last: stopped (and its thread joined) before the metrics it reads are destroyed.
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace nf::monitoring
