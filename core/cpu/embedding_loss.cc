// Token embedding and (vocab-parallel) cross-entropy on the CPU. fp32 logits run cross-entropy's
// max, exp sums and gradient through the vectorised kernels of core/cpu/isa/softmax_kernels.h;
// fp16 / bf16 keep the scalar loops.
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/softmax_kernels.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The valid local columns [0, count) of a logits slice: padding columns are excluded.
int64_t ValidLocalColumns(const ops::CrossEntropyArgs& args) {
  return std::clamp<int64_t>(args.valid_vocab - args.vocab_offset, 0, args.logits.dim(1));
}

// The local column of row r's target, or -1 when it is ignored or held by another slice.
int64_t LocalTarget(const ops::CrossEntropyArgs& args, int64_t r) {
  const int64_t target = args.targets.data<int32_t>()[r];
  const int64_t local = target - args.vocab_offset;
  return (target >= 0 && local >= 0 && local < ValidLocalColumns(args)) ? local : -1;
}

// Row r of the fp32 cross-entropy gradient, logits and grad [cols] (grad may be logits):
// dloss * (exp(x - max) / sum_exp - onehot(target)) over the valid columns, 0 elsewhere and for
// an ignored row. The target column is redone in double from its exp, so p - 1 does not lose
// the fp32 product's rounding to cancellation.
void CrossEntropyGradRowF32(const ops::CrossEntropyArgs& args, int64_t r, float max, float sum_exp,
                            float dloss, const float* logits, float* grad) {
  const int64_t cols = args.logits.dim(1), valid = ValidLocalColumns(args);
  if (args.targets.data<int32_t>()[r] < 0) {
    std::fill(grad, grad + cols, 0.0f);
    return;
  }
  const SoftmaxKernels& kernels = Softmax();
  const int64_t t = LocalTarget(args, r);
  float target_exp = 0.0f;
  if (t >= 0) kernels.exp_shifted(logits + t, 1, max, &target_exp);  // before grad overwrites it
  const double inv_sum = 1.0 / sum_exp;
  kernels.scaled_exp_shifted(logits, valid, max, static_cast<float>(dloss * inv_sum), grad);
  std::fill(grad + valid, grad + cols, 0.0f);
  if (t >= 0) grad[t] = static_cast<float>(dloss * (target_exp * inv_sum - 1.0));
}

}  // namespace

absl::Status CpuBackend::EmbeddingForward(const ops::EmbeddingArgs& args) {
  const int32_t* ids = args.ids.data<int32_t>();
  const int64_t tokens = args.ids.numel(), width = args.table.dim(1);
  const int64_t local_vocab = args.table.dim(0);
  for (int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= args.global_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingForward: token id ", ids[t], " at position ", t,
                       " is outside the vocabulary [0, ", args.global_vocab, ")"));
    }
  }
  DispatchFloat(args.table.dtype(), [&]<typename T>() {
    const T* table = args.table.data<T>();
    T* out = args.out.data<T>();
    ParallelFor(tokens, width, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t row = ids[t] - args.vocab_offset;
        T* dst = out + t * width;
        if (row >= 0 && row < local_vocab) {
          std::copy(table + row * width, table + (row + 1) * width, dst);
        } else {
          std::fill(dst, dst + width, FromFloat<T>(0.0f));
        }
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                                           const Tensor& dtable, int64_t vocab_offset) {
  const int32_t* pids = ids.data<int32_t>();
  const int64_t tokens = ids.numel(), width = dtable.dim(1), local_vocab = dtable.dim(0);
  float* table = dtable.data<float>();
  DispatchFloat(dout.dtype(), [&]<typename T>() {
    const T* g = dout.data<T>();
    // Parallel over blocks of table rows; each scans the tokens in order, so a row that
    // several tokens hit accumulates them in the same order for any thread count.
    ParallelFor(local_vocab, tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t row = pids[t] - vocab_offset;
        if (row < begin || row >= end) continue;
        for (int64_t c = 0; c < width; ++c) table[row * width + c] += ToFloat(g[t * width + c]);
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyRowMax(const ops::CrossEntropyArgs& args,
                                            const Tensor& row_max) {
  const int64_t cols = args.logits.dim(1), valid = ValidLocalColumns(args);
  float* out = row_max.data<float>();
  if (args.logits.dtype() == DType::kF32) {
    ParallelFor(args.logits.dim(0), valid, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        out[r] = Softmax().max(args.logits.data<float>() + r * cols, valid);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    const T* logits = args.logits.data<T>();
    ParallelFor(args.logits.dim(0), valid, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float max = kNegInf;
        for (int64_t c = 0; c < valid; ++c) max = std::max(max, ToFloat(logits[r * cols + c]));
        out[r] = max;
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropySumExp(const ops::CrossEntropyArgs& args,
                                            const Tensor& row_max, const Tensor& sum_exp,
                                            const Tensor& target_logit) {
  const int32_t* targets = args.targets.data<int32_t>();
  for (int64_t r = 0; r < args.targets.numel(); ++r) {
    if (targets[r] < -1 || targets[r] >= args.valid_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CrossEntropySumExp: target ", targets[r], " of row ", r,
          " is outside the vocabulary [0, ", args.valid_vocab, ") and is not -1 (ignored)"));
    }
  }
  const int64_t cols = args.logits.dim(1), valid = ValidLocalColumns(args);
  const float* max = row_max.data<float>();
  float* sums = sum_exp.data<float>();
  float* target = target_logit.data<float>();
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    const T* logits = args.logits.data<T>();
    ParallelFor(args.logits.dim(0), 20 * valid, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        double sum = 0.0;
        // A slice whose valid columns are all -inf (or that has none) contributes nothing.
        if (max[r] != kNegInf) {
          if constexpr (std::is_same_v<T, float>) {
            sum = Softmax().sum_exp_shifted(logits + r * cols, valid, max[r]);
          } else {
            for (int64_t c = 0; c < valid; ++c) {
              sum += std::exp(static_cast<double>(ToFloat(logits[r * cols + c])) - max[r]);
            }
          }
        }
        sums[r] = static_cast<float>(sum);
        const int64_t t = LocalTarget(args, r);
        target[r] = t >= 0 ? ToFloat(logits[r * cols + t]) : 0.0f;
      }
    });
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyLoss(const Tensor& targets, const Tensor& row_max,
                                          const Tensor& sum_exp, const Tensor& target_logit,
                                          const Tensor& loss) {
  const int32_t* t = targets.data<int32_t>();
  const float* max = row_max.data<float>();
  const float* sums = sum_exp.data<float>();
  const float* target = target_logit.data<float>();
  float* out = loss.data<float>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    out[r] = t[r] < 0
                 ? 0.0f
                 : static_cast<float>(std::log(static_cast<double>(sums[r])) + max[r] - target[r]);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AccumulateLoss(const Tensor& loss, const Tensor& targets,
                                        const Tensor& totals) {
  const float* per_row = loss.data<float>();
  const int32_t* t = targets.data<int32_t>();
  double sum = 0.0;
  int64_t rows = 0;
  for (int64_t r = 0; r < loss.numel(); ++r) {
    if (t[r] < 0) continue;
    sum += per_row[r];
    ++rows;
  }
  totals.data<double>()[0] += sum;
  totals.data<double>()[1] += static_cast<double>(rows);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyBackward(const ops::CrossEntropyArgs& args,
                                              const Tensor& row_max, const Tensor& sum_exp,
                                              const Tensor& dloss, const Tensor& dlogits) {
  const int64_t cols = args.logits.dim(1), valid = ValidLocalColumns(args);
  const int32_t* targets = args.targets.data<int32_t>();
  const float* max = row_max.data<float>();
  const float* sums = sum_exp.data<float>();
  const float* dl = dloss.data<float>();
  if (args.logits.dtype() == DType::kF32) {
    ParallelFor(args.logits.dim(0), 20 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        CrossEntropyGradRowF32(args, r, max[r], sums[r], dl[r],
                               args.logits.data<float>() + r * cols,
                               dlogits.data<float>() + r * cols);
      }
    });
    return absl::OkStatus();
  }
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    const T* logits = args.logits.data<T>();
    T* grad = dlogits.data<T>();
    ParallelFor(args.logits.dim(0), 20 * cols, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const bool ignored = targets[r] < 0;
        const int64_t t = LocalTarget(args, r);
        const double inv_sum = 1.0 / sums[r];
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          double g = 0.0;
          if (!ignored && c < valid) {
            const double p = std::exp(static_cast<double>(ToFloat(logits[i])) - max[r]) * inv_sum;
            g = dl[r] * (p - (c == t ? 1.0 : 0.0));
          }
          grad[i] = FromFloat<T>(static_cast<float>(g));
        }
      }
    });
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
