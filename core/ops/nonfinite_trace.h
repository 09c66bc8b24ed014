// Where a NaN began (train.nan_origin): while a NonFiniteTrace is open on a thread, every op of
// ops.h that the thread runs on the forward and backward path has its outputs searched for NaN
// and infinity as soon as it returns (a device's outputs are copied to the host first: this is a
// diagnostic re-run of one step, not a training step), and the first op of the current pass
// that wrote one is kept, with the labels open around it (OpLabel: "layer 3", "fc1"). The
// optimizer's ops (AdamW, the unscale and norm checks) are not searched: they run after the
// passes a re-run repeats.
//
// Off (no trace open), an op pays one thread-local load and an OpLabel two stores.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/ops/checks.h"

namespace nf::ops {

// The first non-finite value an op wrote in a pass.
struct NonFiniteOutput {
  int64_t op_index = 0;  // ops the pass ran before this one (the same on every tp rank)
  std::string op;        // "Gemm"
  std::string where;     // the labels open, outermost first: "layer 3 / fc1"; "" when none
  std::string output;    // the op's output that holds it: "C"
  std::string tensor;    // that output: "f32[64, 128] on cpu"
  int64_t element = 0;   // the first non-finite element, in row-major order
  double value = 0.0;    // NaN, +inf or -inf
};

// "nan", "inf" or "-inf".
std::string NonFiniteName(double value);

class NonFiniteTrace {
 public:
  // Opens the trace on this thread (over any already open, which it hides until it closes).
  NonFiniteTrace();
  ~NonFiniteTrace();
  NonFiniteTrace(const NonFiniteTrace&) = delete;
  NonFiniteTrace& operator=(const NonFiniteTrace&) = delete;

  // Starts a pass (one micro-batch's forward or backward on one model chunk): the op count
  // from 0, and no finding yet.
  void BeginPass();
  // The first op of the pass whose output held a non-finite value.
  const std::optional<NonFiniteOutput>& first() const { return first_; }
  // The first error met while searching an output (a device copy that failed); OK otherwise.
  const absl::Status& status() const { return status_; }

  // For ops.cc: searches `outputs` of `op` (the undefined and the integer ones are skipped).
  void CheckOutputs(const char* op, std::initializer_list<Named> outputs);

 private:
  NonFiniteTrace* hidden_;  // the trace open before this one
  int64_t ops_ = 0;
  bool checking_ = false;  // inside CheckOutputs: its own copies are not searched
  std::optional<NonFiniteOutput> first_;
  absl::Status status_;
};

// A label of the ops run while it is alive ("layer" and 3 read "layer 3"); labels nest. `name`
// must outlive the label (a string literal).
class OpLabel {
 public:
  explicit OpLabel(const char* name, int64_t index = -1);
  ~OpLabel();
  // Names the ops from here on (the next part of a block), keeping the label's place; only the
  // innermost label may be renamed.
  void Rename(const char* name);
  OpLabel(const OpLabel&) = delete;
  OpLabel& operator=(const OpLabel&) = delete;

 private:
  int depth_;  // its place: 0 outermost
};

// The labels open on this thread, outermost first, joined by " / ".
std::string CurrentOpLabels();

namespace internal {
extern thread_local NonFiniteTrace* open_trace;  // this thread's, or null
}  // namespace internal

// How ops.cc returns an op's status: searches its outputs first when a trace is open and the op
// succeeded.
inline absl::Status Checked(absl::Status status, const char* op,
                            std::initializer_list<Named> outputs) {
  if (status.ok()) {
    if (NonFiniteTrace* trace = internal::open_trace) trace->CheckOutputs(op, outputs);
  }
  return status;
}

}  // namespace nf::ops
