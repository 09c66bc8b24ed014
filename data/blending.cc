#include "data/blending.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace nf::data {

absl::StatusOr<Blending> Blending::Build(std::span<const double> weights, int64_t size) {
  const auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("data: blend: ", what));
  };
  if (weights.empty() || weights.size() > 65536) {
    return invalid(absl::StrCat(weights.size(), " datasets; need 1 to 65536"));
  }
  if (size < 0) return invalid(absl::StrCat("size ", size, " must be >= 0"));
  double total = 0.0;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!std::isfinite(weights[k]) || weights[k] < 0.0) {
      return invalid(
          absl::StrCat("weight ", k + 1, " (", weights[k], ") must be a finite number >= 0"));
    }
    total += weights[k];
  }
  if (!(total > 0.0) || !std::isfinite(total)) {
    return invalid("the weights must have a finite, positive sum");
  }
  std::vector<double> normalised(weights.begin(), weights.end());
  for (double& weight : normalised) weight /= total;

  const int num_datasets = static_cast<int>(weights.size());
  std::vector<uint16_t> dataset(size);
  std::vector<int64_t> sample(size);
  std::vector<int64_t> counts(num_datasets, 0);
  for (int64_t i = 0; i < size; ++i) {
    // The lags w_k (i + 1) - c_k sum to 1, so some dataset is below its target (a zero-weight
    // dataset never is). Should rounding hide them all, the largest lag decides.
    const double target = static_cast<double>(i + 1);
    int chosen = -1, most_behind = 0;
    double chosen_due = 0.0, largest_lag = -INFINITY;
    for (int k = 0; k < num_datasets; ++k) {
      const double count = static_cast<double>(counts[k]);
      const double lag = normalised[k] * target - count;
      if (lag > largest_lag) {
        largest_lag = lag;
        most_behind = k;
      }
      if (!(lag > 0.0)) continue;
      const double due = (count + 1.0) / normalised[k];
      if (chosen < 0 || due < chosen_due) {
        chosen = k;
        chosen_due = due;
      }
    }
    if (chosen < 0) chosen = most_behind;
    dataset[i] = static_cast<uint16_t>(chosen);
    sample[i] = counts[chosen]++;
  }
  return Blending(std::move(normalised), std::move(dataset), std::move(sample), std::move(counts));
}

Blending::Blending(std::vector<double> weights, std::vector<uint16_t> dataset,
                   std::vector<int64_t> sample, std::vector<int64_t> counts)
    : weights_(std::move(weights)),
      dataset_(std::move(dataset)),
      sample_(std::move(sample)),
      counts_(std::move(counts)) {}

}  // namespace nf::data
