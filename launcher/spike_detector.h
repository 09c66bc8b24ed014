// Loss and gradient-norm spikes (train.spike): a step's values, taken before its update, are
// held against the median and the median absolute deviation (MAD) of the last `window` applied
// steps. Median and MAD, unlike llm.c's mean and standard deviation, are moved by neither the
// spikes the window still holds nor the loss's fast early fall, and the detector only looks up:
// a loss falling faster than usual is good news.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "launcher/train_config.pb.h"

namespace nf::launcher {

struct Spike {
  std::string metric;  // "loss" or "grad_norm"
  double value = 0.0;
  double median = 0.0;  // of the window
  double limit = 0.0;   // median + threshold x spread; value > limit
};

class SpikeDetector {
 public:
  explicit SpikeDetector(const SpikeConfig& config) : config_(config) {}

  // The spike step `step`'s loss or gradient norm make (the loss is looked at first); none
  // before spike.warmup_steps, before the window holds window / 2 values, or for a non-finite
  // value (a non-finite step is skipped anyway).
  std::optional<Spike> Check(int64_t step, double loss, double grad_norm) const;

  // Adds an applied step's values (the oldest leave a full window). Non-finite values are not
  // added.
  void Record(double loss, double grad_norm);

  // The windows, oldest first (what a checkpoint saves), and back: a resumed run then decides as
  // the uninterrupted one. Restore keeps the newest `window` of each.
  std::vector<double> losses() const { return {losses_.begin(), losses_.end()}; }
  std::vector<double> grad_norms() const { return {grad_norms_.begin(), grad_norms_.end()}; }
  void Restore(const std::vector<double>& losses, const std::vector<double>& grad_norms);

 private:
  std::optional<Spike> CheckOne(const char* metric, const std::deque<double>& window,
                                float threshold, double value) const;

  SpikeConfig config_;
  std::deque<double> losses_, grad_norms_;
};

}  // namespace nf::launcher
