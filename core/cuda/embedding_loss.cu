// Token embedding and (vocab-parallel) cross-entropy on the GPU. Bad ids and targets do not
// stop the stream: the first one is written to the context's fault record and reported at the
// next Synchronize() (cuda_context.h); the kernels treat it as an ignored token meanwhile.
//
// The embedding gradient is deterministic: tokens are stably sorted by id (cub radix sort), and
// each run of equal ids is summed in token order by one thread per column, the order the CPU
// uses. The logits' softmax is never materialised: the backward recomputes each probability
// from the row max and sum and writes the gradient in place.
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"

namespace nf::cuda {
namespace {

__device__ void RecordFault(DeviceFault* fault, int32_t code, int64_t position, int64_t value,
                            int64_t limit) {
  if (atomicCAS(&fault->code, kNoFault, code) == kNoFault) {
    fault->position = static_cast<int32_t>(position);
    fault->value = static_cast<int32_t>(value);
    fault->limit = static_cast<int32_t>(limit);
  }
}

template <typename T>
__global__ void EmbeddingForwardKernel(const int32_t* ids, const T* table, T* out, int64_t tokens,
                                       int64_t width, int64_t vocab_offset, int64_t local_vocab,
                                       int64_t global_vocab, DeviceFault* fault) {
  NF_GRID_STRIDE_LOOP(i, tokens * width) {
    const int64_t t = i / width, c = i % width;
    const int64_t id = ids[t];
    if (id < 0 || id >= global_vocab) {
      if (c == 0) RecordFault(fault, kEmbeddingIdOutOfRange, t, id, global_vocab);
      out[i] = FromFloat<T>(0.0f);
      continue;
    }
    const int64_t row = id - vocab_offset;
    out[i] = (row >= 0 && row < local_vocab) ? table[row * width + c] : FromFloat<T>(0.0f);
  }
}

// sorted_ids/order: token ids sorted stably, with the token each came from. A thread per
// (run start, column) sums its run in token order.
template <typename T>
__global__ void EmbeddingBackwardKernel(const int32_t* sorted_ids, const int32_t* order,
                                        const T* dout, float* dtable, int64_t tokens, int64_t width,
                                        int64_t vocab_offset, int64_t local_vocab) {
  NF_GRID_STRIDE_LOOP(i, tokens * width) {
    const int64_t s = i / width, c = i % width;
    const int32_t id = sorted_ids[s];
    if (s > 0 && sorted_ids[s - 1] == id) continue;  // not the start of a run
    const int64_t row = id - vocab_offset;
    if (row < 0 || row >= local_vocab) continue;  // another rank's slice
    float sum = 0.0f;
    for (int64_t j = s; j < tokens && sorted_ids[j] == id; ++j) {
      sum += ToFloat(dout[static_cast<int64_t>(order[j]) * width + c]);
    }
    dtable[row * width + c] += sum;
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { out[i] = static_cast<int32_t>(i); }
}

struct CrossEntropyShape {
  int64_t cols;          // local columns of a logits row
  int64_t valid;         // local columns that are real vocabulary (the rest is padding)
  int64_t vocab_offset;  // global id of local column 0
};

CrossEntropyShape ShapeOf(const ops::CrossEntropyArgs& args) {
  const int64_t cols = args.logits.dim(1);
  return {cols, std::clamp<int64_t>(args.valid_vocab - args.vocab_offset, 0, cols),
          args.vocab_offset};
}

// The local column of the target, or -1 when it is ignored or held by another slice.
__device__ int64_t LocalTarget(int32_t target, const CrossEntropyShape& shape) {
  const int64_t local = static_cast<int64_t>(target) - shape.vocab_offset;
  return (target >= 0 && local >= 0 && local < shape.valid) ? local : -1;
}

template <typename T>
__global__ void RowMaxKernel(const T* logits, float* row_max, CrossEntropyShape shape) {
  __shared__ float scratch[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * shape.cols;
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < shape.valid; c += blockDim.x) max = fmaxf(max, ToFloat(row[c]));
  max = BlockMax(max, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = max;
}

template <typename T>
__global__ void SumExpKernel(const T* logits, const int32_t* targets, const float* row_max,
                             float* sum_exp, float* target_logit, CrossEntropyShape shape,
                             int64_t valid_vocab, DeviceFault* fault) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * shape.cols;
  const float max = row_max[r];
  float sum = 0.0f;
  // A slice whose valid columns are all -inf (or that has none) contributes nothing.
  if (max != -INFINITY) {
    for (int64_t c = threadIdx.x; c < shape.valid; c += blockDim.x) {
      sum += __expf(ToFloat(row[c]) - max);
    }
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) {
    const int32_t target = targets[r];
    if (target < -1 || target >= valid_vocab) {
      RecordFault(fault, kCrossEntropyTargetOutOfRange, r, target, valid_vocab);
    }
    sum_exp[r] = sum;
    const int64_t t = LocalTarget(target, shape);
    target_logit[r] = t >= 0 ? ToFloat(row[t]) : 0.0f;
  }
}

__global__ void LossKernel(const int32_t* targets, const float* row_max, const float* sum_exp,
                           const float* target_logit, float* loss, int64_t rows) {
  NF_GRID_STRIDE_LOOP(r, rows) {
    loss[r] = targets[r] < 0 ? 0.0f : logf(sum_exp[r]) + row_max[r] - target_logit[r];
  }
}

// One block: each thread sums a strided share of the rows, then one fixed reduction tree, so
// the result does not vary from run to run. A micro-batch has at most a few ten thousand rows.
__global__ void AccumulateLossKernel(const float* loss, const int32_t* targets, int64_t rows,
                                     double* totals) {
  __shared__ double scratch[32];
  double sum = 0.0, count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] < 0) continue;
    sum += loss[r];
    count += 1.0;
  }
  sum = BlockSum(sum, scratch);
  count = BlockSum(count, scratch);
  if (threadIdx.x == 0) {
    totals[0] += sum;
    totals[1] += count;
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits, const int32_t* targets,
                                           const float* row_max, const float* sum_exp,
                                           const float* dloss, T* dlogits,
                                           CrossEntropyShape shape) {
  const int64_t r = blockIdx.x;
  const bool ignored = targets[r] < 0;
  const int64_t t = LocalTarget(targets[r], shape);
  const float max = row_max[r], inv_sum = 1.0f / sum_exp[r], scale = dloss[r];
  for (int64_t c = threadIdx.x; c < shape.cols; c += blockDim.x) {
    const int64_t i = r * shape.cols + c;
    float g = 0.0f;
    if (!ignored && c < shape.valid) {
      const float p = __expf(ToFloat(logits[i]) - max) * inv_sum;
      g = scale * (p - (c == t ? 1.0f : 0.0f));
    }
    dlogits[i] = FromFloat<T>(g);
  }
}

}  // namespace

absl::Status CudaBackend::EmbeddingForward(const ops::EmbeddingArgs& args) {
  const int64_t tokens = args.ids.numel(), width = args.table.dim(1);
  if (tokens * width == 0) return absl::OkStatus();
  DispatchFloat(args.table.dtype(), [&]<typename T>() {
    Launch<EmbeddingForwardKernel<T>>(
        {GridFor(tokens * width), kThreads, 0, stream()}, args.ids.data<int32_t>(),
        DevicePtr<T>(args.table), DevicePtr<T>(args.out), tokens, width, args.vocab_offset,
        args.table.dim(0), args.global_vocab, context_.fault_record());
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                                            const Tensor& dtable, int64_t vocab_offset) {
  const int64_t tokens = ids.numel(), width = dtable.dim(1);
  if (tokens * width == 0) return absl::OkStatus();
  CachingAllocator& allocator = context_.allocator();
  // [3, tokens]: token order 0..tokens-1, sorted ids, the token each sorted id came from.
  NF_ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty(DType::kI32, {3, tokens}, allocator));
  int32_t* iota = scratch.data<int32_t>();
  int32_t* sorted_ids = iota + tokens;
  int32_t* order = sorted_ids + tokens;
  Launch<IotaKernel>({GridFor(tokens), kThreads, 0, stream()}, iota, tokens);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  const int n = static_cast<int>(tokens);
  size_t temp_bytes = 0;
  NF_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, ids.data<int32_t>(), sorted_ids, iota, order, n, 0, 32, stream()));
  NF_ASSIGN_OR_RETURN(Tensor temp,
                      Tensor::Empty(DType::kU8, {static_cast<int64_t>(temp_bytes)}, allocator));
  NF_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes,
                                                          ids.data<int32_t>(), sorted_ids, iota,
                                                          order, n, 0, 32, stream()));
  DispatchFloat(dout.dtype(), [&]<typename T>() {
    Launch<EmbeddingBackwardKernel<T>>({GridFor(tokens * width), kThreads, 0, stream()}, sorted_ids,
                                       order, DevicePtr<T>(dout), dtable.data<float>(), tokens,
                                       width, vocab_offset, dtable.dim(0));
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyRowMax(const ops::CrossEntropyArgs& args,
                                             const Tensor& row_max) {
  const int64_t rows = args.logits.dim(0);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    Launch<RowMaxKernel<T>>({static_cast<unsigned int>(rows), kThreads, 0, stream()},
                            DevicePtr<T>(args.logits), row_max.data<float>(), ShapeOf(args));
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropySumExp(const ops::CrossEntropyArgs& args,
                                             const Tensor& row_max, const Tensor& sum_exp,
                                             const Tensor& target_logit) {
  const int64_t rows = args.logits.dim(0);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    Launch<SumExpKernel<T>>(
        {static_cast<unsigned int>(rows), kThreads, 0, stream()}, DevicePtr<T>(args.logits),
        args.targets.data<int32_t>(), row_max.data<float>(), sum_exp.data<float>(),
        target_logit.data<float>(), ShapeOf(args), args.valid_vocab, context_.fault_record());
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyLoss(const Tensor& targets, const Tensor& row_max,
                                           const Tensor& sum_exp, const Tensor& target_logit,
                                           const Tensor& loss) {
  const int64_t rows = targets.numel();
  if (rows == 0) return absl::OkStatus();
  Launch<LossKernel>({GridFor(rows), kThreads, 0, stream()}, targets.data<int32_t>(),
                     row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
                     loss.data<float>(), rows);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::AccumulateLoss(const Tensor& loss, const Tensor& targets,
                                         const Tensor& totals) {
  const int64_t rows = loss.numel();
  if (rows == 0) return absl::OkStatus();
  Launch<AccumulateLossKernel>({1, kThreads, 0, stream()}, loss.data<float>(),
                               targets.data<int32_t>(), rows, totals.data<double>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyBackward(const ops::CrossEntropyArgs& args,
                                               const Tensor& row_max, const Tensor& sum_exp,
                                               const Tensor& dloss, const Tensor& dlogits) {
  const int64_t rows = args.logits.dim(0);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(args.logits.dtype(), [&]<typename T>() {
    Launch<CrossEntropyBackwardKernel<T>>(
        {static_cast<unsigned int>(rows), kThreads, 0, stream()}, DevicePtr<T>(args.logits),
        args.targets.data<int32_t>(), row_max.data<float>(), sum_exp.data<float>(),
        dloss.data<float>(), DevicePtr<T>(dlogits), ShapeOf(args));
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
