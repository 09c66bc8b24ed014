#include "core/ops/nonfinite_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/non_finite.h"
#include "core/ops/ops.h"

namespace nf::ops {
namespace {

// This thread's open labels. Deeper nesting than kMaxLabels is counted but not named.
constexpr int kMaxLabels = 8;
struct Labels {
  const char* names[kMaxLabels];
  int64_t indices[kMaxLabels];
  int depth = 0;
};
thread_local Labels labels;

// Element `i` of host tensor `t` (a floating dtype) as a double: NaN and infinities kept.
double ElementAt(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF16:
      return ToFloat(t.data<Half>()[i]);
    case DType::kBF16:
      return ToFloat(t.data<BFloat16>()[i]);
    case DType::kF64:
      return t.data<double>()[i];
    default:
      return t.data<float>()[i];
  }
}

}  // namespace

namespace internal {
thread_local NonFiniteTrace* open_trace = nullptr;
}  // namespace internal

using internal::open_trace;

std::string NonFiniteName(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

NonFiniteTrace::NonFiniteTrace() : hidden_(open_trace) { open_trace = this; }

NonFiniteTrace::~NonFiniteTrace() { open_trace = hidden_; }

void NonFiniteTrace::BeginPass() {
  ops_ = 0;
  first_.reset();
}

void NonFiniteTrace::CheckOutputs(const char* op, std::initializer_list<Named> outputs) {
  if (checking_) return;
  const int64_t index = ops_++;
  if (first_) return;  // the pass's first is all a re-run reports
  checking_ = true;
  for (const Named& out : outputs) {
    if (!out.tensor.defined() || !IsFloating(out.tensor.dtype()) || out.tensor.numel() == 0) {
      continue;
    }
    absl::StatusOr<Tensor> host = OnHost(out.tensor);
    if (!host.ok()) {
      if (status_.ok()) status_ = host.status();
      continue;
    }
    const int64_t element = FindNonFinite(host->raw_data(), host->numel(), host->dtype()).first;
    if (element < 0) continue;
    first_ = NonFiniteOutput{.op_index = index,
                             .op = op,
                             .where = CurrentOpLabels(),
                             .output = std::string(out.name),
                             .tensor = out.tensor.DebugString(),
                             .element = element,
                             .value = ElementAt(*host, element)};
    break;
  }
  checking_ = false;
}

OpLabel::OpLabel(const char* name, int64_t index) : depth_(labels.depth) {
  if (labels.depth < kMaxLabels) {
    labels.names[labels.depth] = name;
    labels.indices[labels.depth] = index;
  }
  ++labels.depth;
}

OpLabel::~OpLabel() { --labels.depth; }

void OpLabel::Rename(const char* name) {
  if (depth_ < kMaxLabels) labels.names[depth_] = name;
}

std::string CurrentOpLabels() {
  std::string text;
  for (int i = 0; i < std::min(labels.depth, kMaxLabels); ++i) {
    absl::StrAppend(&text, i > 0 ? " / " : "", labels.names[i]);
    if (labels.indices[i] >= 0) absl::StrAppend(&text, " ", labels.indices[i]);
  }
  return text;
}

}  // namespace nf::ops
