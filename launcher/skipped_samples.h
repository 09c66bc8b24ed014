// The windows of the training stream a run skips (train.skip_samples and spike rollbacks):
// kept merged and sorted, as the manifest records them.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint_config.pb.h"

namespace nf::launcher {

using checkpoint::SampleWindow;

// `windows` plus `more`, overlapping or touching windows merged, sorted by begin.
std::vector<SampleWindow> MergeWindows(std::vector<SampleWindow> windows,
                                       const std::vector<SampleWindow>& more);

// The first window overlapping samples [begin, end), or null.
const SampleWindow* OverlappingWindow(const std::vector<SampleWindow>& windows, int64_t begin,
                                      int64_t end);

// InvalidArgument naming `field` and the window unless 0 <= begin < end.
absl::Status ValidateWindow(const SampleWindow& window, const char* field);

}  // namespace nf::launcher
