// Per-op time, to find what limits a step: with NF_OP_TIMING=1 in the environment (or
// SetOpTimingEnabled), every op of ops.h is timed on its backend's timeline and the times are
// summed per op. On the GPU a span is a pair of CUDA events around the op's launches, read only
// when the report is taken (no synchronisation per op); on the CPU, whose ops return when done,
// it is the wall clock. Off (the default) an op pays one branch. Times are inclusive: an op that
// calls another through ops.h counts both (none does on the training path).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace nf::ops {

class Backend;

// One op's execution on a backend's timeline.
class TimedSpan {
 public:
  virtual ~TimedSpan() = default;
  // Marks the end; called once, right after the op returns.
  virtual void End() = 0;
  // The span's length in seconds; may wait for the device to reach End().
  virtual double Seconds() = 0;
};

// The wall-clock span: right for a backend whose ops complete before they return.
std::unique_ptr<TimedSpan> StartWallClockSpan();

bool OpTimingEnabled();  // NF_OP_TIMING=1 at the first call, unless set since
void SetOpTimingEnabled(bool enabled);

// OK unless NF_OP_TIMING holds something other than 0 or 1 (a misspelt request would otherwise
// time nothing without a word); programs check it at start-up.
absl::Status CheckOpTimingEnvironment();

struct OpTime {
  std::string op;
  // For an op with more than one implementation, the one that ran and why (NoteOpPath), e.g.
  // "cudnn" and "fp16/bf16, head_dim a multiple of 8 up to 128"; empty otherwise. Calls that
  // took different paths, or one path for different reasons, are separate rows.
  std::string path;
  std::string reason;
  int64_t calls = 0;
  double seconds = 0.0;
};

// The times since the last call, one row per op, longest first; waits for spans still on a
// device's timeline.
std::vector<OpTime> TakeOpTimes();

// Called by a backend inside an op that chooses between implementations: files the op's time
// under `path`, with `reason` (both string literals). Cheap (two thread-local stores), so it
// is called whether or not timing is on.
void NoteOpPath(const char* path, const char* reason);

// A table of `times`: op (with its path), calls, total ms, mean us and share of the total;
// then, for the ops with a path, why each path was taken.
std::string FormatOpTimes(const std::vector<OpTime>& times);

// Times the enclosing op when timing is on: a span from construction to destruction, filed under
// `op` (a string literal: ops.cc passes __func__).
class ScopedOpTiming {
 public:
  ScopedOpTiming(const char* op, Backend& backend);
  ~ScopedOpTiming();
  ScopedOpTiming(const ScopedOpTiming&) = delete;
  ScopedOpTiming& operator=(const ScopedOpTiming&) = delete;

 private:
  const char* op_;
  std::unique_ptr<TimedSpan> span_;
  // The NoteOpPath of the enclosing op's scope, restored at its end (ops do not nest on the
  // training path, but a backend may call one op from another).
  const char* outer_path_;
  const char* outer_reason_;
};

}  // namespace nf::ops
