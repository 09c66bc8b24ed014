// Communication in flight, per device.
//
// Freeing device memory (cudaFree) or pinned host memory (cudaFreeHost) waits for the whole
// device, NCCL's kernels included, and those may be waiting for a peer: a lost rank, or a
// collective another rank has not issued yet. A clear out-of-memory would become a hang that
// the collective watchdog reports as a peer hung, and the job be requeued again and again. So
// the NCCL communicator counts its operations here, from just before their group is issued
// until seen complete (its watchdog polls them every millisecond), and core/cuda frees nothing
// device-wide while the count is above 0: the caching allocator first waits a bounded time for
// it to fall to 0 (caching_allocator.h), pinned staging sets an outgrown buffer aside
// (pinned_staging.h). core may not know the communicators (parallel/ is above it): the count
// lives here and parallel/ adds to it.
#pragma once

#include <chrono>
#include <cstdint>

namespace nf::cuda {

// Operations of communication libraries issued on `device` and not yet seen complete. Any thread.
void AddOutstandingCommunication(int device, int64_t delta);
int64_t OutstandingCommunication(int device);

// Waits until no communication is outstanding on `device`, at most `limit`: true when none is
// (at once when none was). Any thread.
bool WaitForNoOutstandingCommunication(int device, std::chrono::milliseconds limit);

}  // namespace nf::cuda
