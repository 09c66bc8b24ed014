// The host copy of a rank's pieces that an async save takes at a step boundary: the only part
// of a save that holds up training, so it runs on every thread of the pool (a first save's
// page faults are spread over them too).
#pragma once

#include <cstdint>
#include <vector>

namespace nf::checkpoint {

// One piece's bytes, copied to `offset` of the destination.
struct CopySpan {
  const char* from;
  int64_t offset;
  int64_t length;
};

// Copies every span to `to` + its offset, on the thread pool in blocks of equal bytes (pieces
// range from a few bytes to the vocabulary table). `spans` lie back to back in offset order.
void CopySpans(const std::vector<CopySpan>& spans, char* to);

}  // namespace nf::checkpoint
