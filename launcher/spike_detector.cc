#include "launcher/spike_detector.h"

#include <algorithm>
#include <cmath>

namespace nf::launcher {
namespace {

// The median of `values` (not empty; reordered).
double Median(std::vector<double>& values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return 0.5 * (lower + upper);
}

// The MAD of normally distributed values times this is their standard deviation.
constexpr double kMadToSigma = 1.4826;

void Push(std::deque<double>& window, double value, size_t size) {
  if (!std::isfinite(value)) return;
  window.push_back(value);
  while (window.size() > size) window.pop_front();
}

}  // namespace

std::optional<Spike> SpikeDetector::CheckOne(const char* metric, const std::deque<double>& window,
                                             float threshold, double value) const {
  if (threshold <= 0 || !std::isfinite(value)) return std::nullopt;
  if (window.empty() || 2 * window.size() < static_cast<size_t>(config_.window())) {
    return std::nullopt;
  }
  std::vector<double> values(window.begin(), window.end());
  const double median = Median(values);
  for (double& v : values) v = std::abs(v - median);
  const double spread =
      std::max(kMadToSigma * Median(values), config_.min_relative_spread() * std::abs(median));
  const double limit = median + threshold * spread;
  if (value <= limit) return std::nullopt;
  return Spike{.metric = metric, .value = value, .median = median, .limit = limit};
}

std::optional<Spike> SpikeDetector::Check(int64_t step, double loss, double grad_norm) const {
  if (step < config_.warmup_steps()) return std::nullopt;
  if (auto spike = CheckOne("loss", losses_, config_.loss_threshold(), loss)) return spike;
  return CheckOne("grad_norm", grad_norms_, config_.grad_norm_threshold(), grad_norm);
}

void SpikeDetector::Record(double loss, double grad_norm) {
  const size_t size = static_cast<size_t>(std::max(1, config_.window()));
  Push(losses_, loss, size);
  Push(grad_norms_, grad_norm, size);
}

void SpikeDetector::Restore(const std::vector<double>& losses,
                            const std::vector<double>& grad_norms) {
  losses_.clear();
  grad_norms_.clear();
  const size_t size = static_cast<size_t>(std::max(1, config_.window()));
  for (double v : losses) Push(losses_, v, size);
  for (double v : grad_norms) Push(grad_norms_, v, size);
}

}  // namespace nf::launcher
