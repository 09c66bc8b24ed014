// Blending several sample streams (datasets) into one by weights, after Megatron-LM's
// BlendedDataset: blended sample i is sample `sample(i)` of dataset `dataset(i)`, each dataset's
// samples taken in order, and the datasets interleaved so that after every prefix of n blended
// samples each dataset k has contributed c_k(n) with |c_k(n) - w_k n| < 1 (w normalised).
//
// Megatron assigns each sample to the dataset lagging its target the most (largest
// w_k n - c_k); with three or more datasets that lets a dataset fall more than one sample
// behind (1.8 samples in random trials). Here sample i goes, among the datasets still below
// their target w_k (i + 1), to the one whose next sample is due first, the smallest
// (c_k + 1) / w_k: earliest-deadline-first scheduling of unit jobs, each dataset's j-th sample
// being due by blended sample j / w_k, which meets every deadline because the weights sum to 1.
// The assignment is deterministic (ties go to the lower dataset index).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::data {

class Blending {
 public:
  // Up to 65,536 datasets; weights finite and >= 0 with a positive sum (normalised here);
  // size >= 0 blended samples. InvalidArgument (one line) otherwise.
  static absl::StatusOr<Blending> Build(std::span<const double> weights, int64_t size);

  int64_t size() const { return static_cast<int64_t>(dataset_.size()); }
  int num_datasets() const { return static_cast<int>(weights_.size()); }
  // The normalised weights: [num_datasets].
  std::span<const double> weights() const { return weights_; }
  // Samples taken from each dataset over all size() blended samples: [num_datasets]. Dataset k
  // must offer at least counts()[k] samples (counts()[k] <= ceil(w_k size())).
  std::span<const int64_t> counts() const { return counts_; }

  // Blended sample i, 0 <= i < size(), is sample(i) of dataset(i).
  int dataset(int64_t i) const { return dataset_[i]; }
  int64_t sample(int64_t i) const { return sample_[i]; }

 private:
  Blending(std::vector<double> weights, std::vector<uint16_t> dataset, std::vector<int64_t> sample,
           std::vector<int64_t> counts);

  std::vector<double> weights_;
  std::vector<uint16_t> dataset_;  // [size]
  std::vector<int64_t> sample_;    // [size]
  std::vector<int64_t> counts_;    // [num_datasets]
};

}  // namespace nf::data
