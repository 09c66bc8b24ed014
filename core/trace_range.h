// TraceRange: an NVTX range over the enclosing scope in CUDA builds, so that Nsight Systems
// (nsys profile) shows layers, pipeline actions, collectives and ops on its timeline; nothing in
// a build without CUDA. Without a profiler attached NVTX's calls return at once (no injection
// library loaded), so the ranges stay in production builds.
#pragma once

#include <string>

#if NF_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace nf {

class TraceRange {
 public:
#if NF_WITH_CUDA
  explicit TraceRange(const char* name) { nvtxRangePushA(name); }
  explicit TraceRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~TraceRange() { nvtxRangePop(); }
#else
  explicit TraceRange(const char*) {}
  explicit TraceRange(const std::string&) {}
#endif
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace nf
