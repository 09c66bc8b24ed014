#include "launcher/skipped_samples.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace nf::launcher {

std::vector<SampleWindow> MergeWindows(std::vector<SampleWindow> windows,
                                       const std::vector<SampleWindow>& more) {
  windows.insert(windows.end(), more.begin(), more.end());
  std::sort(windows.begin(), windows.end(), [](const SampleWindow& a, const SampleWindow& b) {
    return a.begin() < b.begin() || (a.begin() == b.begin() && a.end() < b.end());
  });
  std::vector<SampleWindow> merged;
  for (const SampleWindow& w : windows) {
    if (!merged.empty() && w.begin() <= merged.back().end()) {
      merged.back().set_end(std::max(merged.back().end(), w.end()));
    } else {
      merged.push_back(w);
    }
  }
  return merged;
}

const SampleWindow* OverlappingWindow(const std::vector<SampleWindow>& windows, int64_t begin,
                                      int64_t end) {
  for (const SampleWindow& w : windows) {
    if (w.begin() < end && begin < w.end()) return &w;
  }
  return nullptr;
}

absl::Status ValidateWindow(const SampleWindow& window, const char* field) {
  if (window.begin() >= 0 && window.begin() < window.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " {begin: ", window.begin(), " end: ", window.end(),
      "} must name samples [begin, end) of the training stream with 0 <= begin < end"));
}

}  // namespace nf::launcher
