// What monitoring costs a training step, on one process and the CPU backend. Steps with the
// metrics on (recorded after every step exactly as the training loop does,
// launcher/step_metrics.h, and served to a scraper thread that pulls /metrics every
// --scrape-ms, far more often than deploy/prometheus's 15 s) alternate with steps with them off
// (nothing recorded, scraper paused), adjacent in each round and in ABBA order, so that the
// shared machine's drift falls on both alike. Each round gives one paired ratio on/off; the
// verdict is their median with its 95% confidence interval (distribution-free, from order
// statistics): monitoring costs nothing measurable when the interval contains 1. Each round
// also takes a log step (per-block gradient norms, TrainStep(true)), paired with its on step.
// Two parts are timed on their own as well: one step's recording, and one scrape (render + HTTP
// on loopback).
//
//   NF_NUM_THREADS=2 build/bench/nf-bench-metrics [--config deploy/configs/tiny.pbtxt]
//       [--rounds 40] [--port 9690] [--scrape-ms 100]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/ceilings.h"
#include "bench/statistics.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/step_metrics.h"
#include "launcher/trainer.h"
#include "monitoring/rank_metrics.h"
#include "monitoring/scrape_client.h"

namespace nf::bench {
namespace {

constexpr int kWarmupSteps = 3;

struct Flags {
  std::string config = "deploy/configs/tiny.pbtxt";
  int rounds = 40;
  int port = 9690;
  int scrape_ms = 1000;
};

// Scrapes 127.0.0.1:port/metrics every `interval` while enabled, as Prometheus would.
class Scraper {
 public:
  Scraper(int port, std::chrono::milliseconds interval)
      : thread_([this, port, interval] {
          while (!stop_) {
            if (enabled_) {
              absl::StatusOr<std::string> page =
                  monitoring::FetchPage("127.0.0.1", port, "/metrics");
              if (page.ok()) ++scrapes_;
            }
            std::this_thread::sleep_for(interval);
          }
        }) {}
  ~Scraper() {
    stop_ = true;
    thread_.join();
  }
  void Enable(bool on) { enabled_ = on; }
  int scrapes() const { return scrapes_; }

 private:
  std::atomic<bool> stop_{false}, enabled_{false};
  std::atomic<int> scrapes_{0};
  std::thread thread_;
};

// Step times in seconds, one of each per round.
struct StepTimes {
  std::vector<double> off, on, with_block_norms;
};

absl::Status Run(const Flags& flags) {
  NF_ASSIGN_OR_RETURN(launcher::TrainConfig config, launcher::LoadTrainConfig(flags.config, {}));
  // Enough iterations for every step this benchmark takes (only the LR schedule sees it).
  config.mutable_train()->set_train_iters(
      std::max<int64_t>(config.train().train_iters(), kWarmupSteps + 3 * flags.rounds + 1));
  NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                      launcher::Trainer::Create(config));
  monitoring::MonitoringConfig monitoring;
  monitoring.set_bind_address("127.0.0.1");
  monitoring.set_port_base(flags.port);
  NF_ASSIGN_OR_RETURN(std::unique_ptr<monitoring::RankMetrics> metrics,
                      monitoring::RankMetrics::Serve(monitoring, {.job = "bench"}, 0));

  const Ceilings ceilings = MeasureCeilings();
  const model::ModelConfig& m = config.model();
  const double flops_per_token =
      launcher::ModelFlopsPerToken(trainer->num_global_params(), m, config.train().seq_len());
  auto mfu = [&](const launcher::StepStats& s) {
    return static_cast<double>(s.tokens) / s.seconds * flops_per_token /
           (ceilings.sgemm_gflops * 1e9);
  };

  for (int i = 0; i < kWarmupSteps; ++i) NF_RETURN_IF_ERROR(trainer->TrainStep().status());

  Scraper scraper(flags.port, std::chrono::milliseconds(flags.scrape_ms));
  StepTimes times;
  launcher::StepStats last;
  auto step = [&](bool monitored, bool block_norms) -> absl::Status {
    scraper.Enable(monitored);
    const auto start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(last, trainer->TrainStep(block_norms));
    if (monitored) launcher::RecordStepMetrics(last, *trainer, mfu(last), *metrics);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    (block_norms ? times.with_block_norms : monitored ? times.on : times.off).push_back(seconds);
    return absl::OkStatus();
  };
  for (int round = 0; round < flags.rounds; ++round) {
    const bool on_first = round % 2 == 0;  // ABBA
    NF_RETURN_IF_ERROR(step(on_first, false));
    NF_RETURN_IF_ERROR(step(!on_first, false));
    NF_RETURN_IF_ERROR(step(true, true));
  }
  scraper.Enable(false);

  // The parts on their own, on the last (log-step) record.
  constexpr int kCalls = 200;
  const double record_s =
      MedianSeconds(15,
                    [&] {
                      for (int i = 0; i < kCalls; ++i) {
                        launcher::RecordStepMetrics(last, *trainer, mfu(last), *metrics);
                      }
                    }) /
      kCalls;
  size_t page_bytes = 0;
  const double scrape_s = MedianSeconds(15, [&] {
    page_bytes = monitoring::FetchPage("127.0.0.1", flags.port, "/metrics").value_or("").size();
  });

  std::vector<double> ratios, block_norm_seconds;
  for (int round = 0; round < flags.rounds; ++round) {
    ratios.push_back(times.on[round] / times.off[round]);
    block_norm_seconds.push_back(times.with_block_norms[round] - times.on[round]);
  }
  const double off = MedianWithInterval(times.off).median;
  const double on = MedianWithInterval(times.on).median;
  const MedianInterval ratio = MedianWithInterval(ratios);
  const MedianInterval block_norms = MedianWithInterval(block_norm_seconds);
  const int log_interval = std::max(1, config.train().log_interval());
  std::printf("Ceiling measured in this run: OpenBLAS sgemm (n=1024, all cores) %.1f GFLOP/s\n",
              ceilings.sgemm_gflops);
  std::printf(
      "%s, 1 rank, CPU, %d kernel threads (NF_NUM_THREADS); %d rounds of [off, on] / [on, off] "
      "steps (ABBA)\nplus one step with per-block norms; %d scrapes of /metrics every %d ms "
      "during the on steps.\n\n",
      flags.config.c_str(), ThreadPool::Global().num_threads(), flags.rounds, scraper.scrapes(),
      flags.scrape_ms);
  std::printf("step, metrics off           median %8.2f ms   MFU %.1f%% of the sgemm ceiling\n",
              1e3 * off,
              100.0 * static_cast<double>(last.tokens) / off * flops_per_token /
                  (ceilings.sgemm_gflops * 1e9));
  std::printf("step, metrics on + scrapes  median %8.2f ms\n", 1e3 * on);
  std::printf("paired ratio on/off         median %.4f   95%% interval [%.4f, %.4f]\n",
              ratio.median, ratio.low, ratio.high);
  std::printf("record one step's metrics   median %8.2f us   %.4f%% of a step\n", 1e6 * record_s,
              100 * record_s / off);
  std::printf(
      "one scrape (%zu bytes)      median %8.2f us   %.6f%% of the time at a 15 s interval\n",
      page_bytes, 1e6 * scrape_s, 100 * scrape_s / 15.0);
  std::printf(
      "per-block gradient norms    median %+8.2f ms [%+.2f, %+.2f] on a log step; every %d "
      "steps: %.3f%%\n",
      1e3 * block_norms.median, 1e3 * block_norms.low, 1e3 * block_norms.high, log_interval,
      100 * block_norms.median / off / log_interval);
  const bool measurable = ratio.low > 1.0 || ratio.high < 1.0;
  std::printf("\nverdict: monitoring costs %s (the ratio's interval %s 1)\n",
              measurable ? absl::StrCat(100 * (ratio.median - 1), "% of a step").c_str()
                         : "nothing measurable",
              measurable ? "excludes" : "contains");
  return absl::OkStatus();
}

bool ParseFlags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const absl::string_view flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--config") {
      flags.config = value;
    } else if (flag == "--rounds") {
      flags.rounds = std::atoi(value);
    } else if (flag == "--port") {
      flags.port = std::atoi(value);
    } else if (flag == "--scrape-ms") {
      flags.scrape_ms = std::atoi(value);
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && flags.rounds >= 2 && flags.port > 0 && flags.scrape_ms > 0;
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  nf::bench::Flags flags;
  if (!nf::bench::ParseFlags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: %s [--config PATH] [--rounds N (>= 2)] [--port P] [--scrape-ms MS]\n",
                 argv[0]);
    return 2;
  }
  const absl::Status status = nf::bench::Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-metrics: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
