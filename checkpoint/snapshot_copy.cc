#include "checkpoint/snapshot_copy.h"

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"

namespace nf::checkpoint {

void CopySpans(const std::vector<CopySpan>& spans, char* to) {
  if (spans.empty()) return;
  const int64_t total = spans.back().offset + spans.back().length;
  constexpr int64_t kBlockBytes = int64_t{8} << 20;
  const int64_t blocks = (total + kBlockBytes - 1) / kBlockBytes;
  ThreadPool::Global().ParallelFor(blocks, 1, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kBlockBytes;
    const int64_t end = std::min(total, last * kBlockBytes);
    // The first span that ends after `begin`.
    auto span =
        std::upper_bound(spans.begin(), spans.end(), begin,
                         [](int64_t at, const CopySpan& s) { return at < s.offset + s.length; });
    for (; span != spans.end() && span->offset < end; ++span) {
      const int64_t from = std::max(begin, span->offset);
      const int64_t until = std::min(end, span->offset + span->length);
      std::memcpy(to + from, span->from + (from - span->offset), static_cast<size_t>(until - from));
    }
  });
}

}  // namespace nf::checkpoint
