// Train/validation/test splits of a dataset by document ranges, as Megatron-LM's --split:
// "969,30,1" gives weights in any number of parts, normalised to sum 1, and part k takes the
// consecutive documents [round(N c_k), round(N c_{k+1})) of N, c_k the sum of the normalised
// weights before part k (rounding half to even, like Python's round). The ranges are
// consecutive and cover all N documents; a part may be empty.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/document_source.h"

namespace nf::data {

// The normalised weights of a split string. InvalidArgument with a one-line message quoting
// the string and naming what is wrong: no parts, an empty part, a part that is not a number, a
// negative or non-finite part, or weights summing to 0.
absl::StatusOr<std::vector<double>> ParseSplitWeights(absl::string_view split);

// One range per weight over documents [0, num_documents); weights as ParseSplitWeights returns
// them (non-negative, summing to 1).
std::vector<DocumentRange> SplitDocuments(std::span<const double> weights, int64_t num_documents);

// ParseSplitWeights, then SplitDocuments.
absl::StatusOr<std::vector<DocumentRange>> ParseSplit(absl::string_view split,
                                                      int64_t num_documents);

}  // namespace nf::data
