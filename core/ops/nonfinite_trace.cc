#include "core/ops/nonfinite_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/half.h"
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

// The index of the first non-finite element of host tensor `t`, and its value; -1 when none.
template <typename T>
std::pair<int64_t, double> FirstNonFinite(const Tensor& t) {
  const T* data = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    const double v = static_cast<double>(ToFloat(data[i]));
    if (!std::isfinite(v)) return {i, v};
  }
  return {-1, 0.0};
}

std::pair<int64_t, double> FirstNonFiniteOnHost(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kF32:
      return FirstNonFinite<float>(t);
    case DType::kF16:
      return FirstNonFinite<Half>(t);
    case DType::kBF16:
      return FirstNonFinite<BFloat16>(t);
    case DType::kF64: {
      const double* data = t.data<double>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i) {
        if (!std::isfinite(data[i])) return {i, data[i]};
      }
      return {-1, 0.0};
    }
    default:
      return {-1, 0.0};  // integers hold no NaN
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
    const auto [element, value] = FirstNonFiniteOnHost(*host);
    if (element < 0) continue;
    first_ = NonFiniteOutput{.op_index = index,
                             .op = op,
                             .where = CurrentOpLabels(),
                             .output = std::string(out.name),
                             .tensor = out.tensor.DebugString(),
                             .element = element,
                             .value = value};
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
