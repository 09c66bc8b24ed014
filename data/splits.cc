#include "data/splits.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status.h"

namespace nf::data {

absl::StatusOr<std::vector<double>> ParseSplitWeights(absl::string_view split) {
  const auto invalid = [split](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("data: split \"", split, "\": ", what));
  };
  if (absl::StripAsciiWhitespace(split).empty()) return invalid("no weights");
  std::vector<double> weights;
  double total = 0.0;
  for (const absl::string_view raw : absl::StrSplit(split, ',')) {
    const absl::string_view part = absl::StripAsciiWhitespace(raw);
    const std::string which = absl::StrCat("part ", weights.size() + 1);
    double weight = 0.0;
    if (part.empty()) return invalid(absl::StrCat(which, " is empty"));
    if (!absl::SimpleAtod(part, &weight)) {
      return invalid(absl::StrCat(which, " (\"", part, "\") is not a number"));
    }
    if (!std::isfinite(weight) || weight < 0.0) {
      return invalid(absl::StrCat(which, " (\"", part, "\") must be a finite number >= 0"));
    }
    weights.push_back(weight);
    total += weight;
  }
  if (!(total > 0.0) || !std::isfinite(total)) {
    return invalid("the weights must have a finite, positive sum");
  }
  for (double& weight : weights) weight /= total;
  return weights;
}

std::vector<DocumentRange> SplitDocuments(std::span<const double> weights, int64_t num_documents) {
  std::vector<DocumentRange> ranges;
  ranges.reserve(weights.size());
  const double n = static_cast<double>(num_documents);
  double before = 0.0;  // normalised weight of the parts before this one
  int64_t begin = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    before += weights[k];
    // The last part ends at num_documents whatever the rounding of the sum; std::nearbyint
    // rounds half to even in the default rounding mode, as Python's round() does.
    int64_t end =
        k + 1 == weights.size() ? num_documents : static_cast<int64_t>(std::nearbyint(before * n));
    end = std::clamp(end, begin, num_documents);
    ranges.push_back({.begin = begin, .end = end});
    begin = end;
  }
  return ranges;
}

absl::StatusOr<std::vector<DocumentRange>> ParseSplit(absl::string_view split,
                                                      int64_t num_documents) {
  NF_ASSIGN_OR_RETURN(const std::vector<double> weights, ParseSplitWeights(split));
  return SplitDocuments(weights, num_documents);
}

}  // namespace nf::data
