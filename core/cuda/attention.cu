// Softmax and the project's own attention kernels on the GPU, causal or bidirectional (the
// reference and the fallback for cuDNN's fused attention). The forward is flash-attention style:
// a warp per query row walks the key tiles with an online softmax, so no [seq, seq] matrix is
// ever stored; the backward recomputes the probabilities from the saved log-sum-exp in two
// kernels, one per query row (dQ) and one per key row (dK, dV), so every gradient is a sum in a
// fixed order without atomics.
//
// Within a tile of 32 keys (or queries), lane l owns key (query) l of the tile for the dot
// products, and dimensions d = lane + 32 k of the rows it accumulates. K, V, Q and dO tiles are
// staged in shared memory as fp32 with rows padded to head_dim + 1 floats, so lanes reading
// different rows at the same d hit different banks.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"
#include "core/ops/checks.h"
#include "core/philox.h"

namespace nf::cuda {
namespace {

constexpr int kTile = 32;         // keys (queries) per tile: one per lane
constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kMaxHeadDim = 128;  // 4 dimensions per lane; shared memory stays under 48 KiB

// Softmax over one row per block. A row that is entirely -inf yields zeros.
template <typename T>
__global__ void SoftmaxForwardKernel(const T* x, T* y, int64_t cols) {
  __shared__ float scratch[32];
  const T* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* out = y + static_cast<int64_t>(blockIdx.x) * cols;
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) max = fmaxf(max, ToFloat(in[c]));
  max = BlockMax(max, scratch);
  if (max == -INFINITY) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = FromFloat<T>(0.0f);
    return;
  }
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(ToFloat(in[c]) - max);
  const float inv = 1.0f / BlockSum(sum, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = FromFloat<T>(expf(ToFloat(in[c]) - max) * inv);
  }
}

template <typename T>
__global__ void SoftmaxBackwardKernel(const T* y, const T* dy, T* dx, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dot += ToFloat(y[base + c]) * ToFloat(dy[base + c]);
  }
  dot = BlockSum(dot, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[base + c] = FromFloat<T>(ToFloat(y[base + c]) * (ToFloat(dy[base + c]) - dot));
  }
}

// Shapes and dropout of one attention call; [batch, heads, seq, dim] tensors, pair bh = b *
// heads + h owns the contiguous [seq, dim] block at bh * seq * dim.
struct AttentionShape {
  int64_t heads, seq, dim;
  float scale;
  bool causal;  // query i attends keys 0 .. i; else every key of the sequence
  ops::DropoutSpec dropout;
  uint32_t threshold;  // DropoutThreshold(p)
  float keep_scale;    // 1 / (1 - p)
};

// Whether query i attends key j (both may lie past seq at the edge of a tile).
__device__ bool Visible(const AttentionShape& s, int64_t i, int64_t j) {
  return i < s.seq && j < s.seq && (!s.causal || j <= i);
}

// The keys a block of query rows [first_row, first_row + kRowsPerBlock) attends end here: the
// causal mask stops them after the block's last row.
__device__ int64_t KeyEnd(const AttentionShape& s, int64_t first_row) {
  return s.causal ? min(first_row + kRowsPerBlock, s.seq) : s.seq;
}

// The dropout multiplier of probability (i, j) of pair bh: keep_scale or 0 (1 without dropout).
__device__ float DropoutMultiplier(const AttentionShape& s, int64_t bh, int64_t i, int64_t j) {
  if (s.dropout.p == 0.0f) return 1.0f;
  const uint64_t sample = s.dropout.first_sample + bh / s.heads;
  const uint64_t head = s.dropout.head_offset + bh % s.heads;
  const PhiloxCounter words = DropoutWords(s.dropout.seed, s.dropout.site, sample, head, i, j);
  return words[j & 3] >= s.threshold ? s.keep_scale : 0.0f;
}

// Rows [first, first + count) of a [seq, dim] block into shared memory as fp32, padded rows;
// rows past seq read as zeros. Every thread of the block takes part.
template <typename T>
__device__ void LoadRows(const T* src, int64_t first, int count, const AttentionShape& s,
                         float* dst) {
  const int64_t pitch = s.dim + 1;
  for (int64_t e = threadIdx.x; e < count * s.dim; e += blockDim.x) {
    const int64_t r = e / s.dim, d = e % s.dim;
    dst[r * pitch + d] = first + r < s.seq ? ToFloat(src[(first + r) * s.dim + d]) : 0.0f;
  }
}

// Dot product of a shared row `a` (read by every lane: broadcast) with padded tile row `b`.
__device__ float RowDot(const float* a, const float* b, int64_t dim) {
  float sum = 0.0f;
  for (int64_t d = 0; d < dim; ++d) sum += a[d] * b[d];
  return sum;
}

// acc[k] += sum over the tile's lanes of weight(lane) * tile[lane][lane_dim(k)].
template <int kChunks>
__device__ void AccumulateTile(float weight, const float* tile, int64_t dim, float* acc) {
  const int lane = threadIdx.x & 31;
  const int64_t pitch = dim + 1;
  for (int j = 0; j < kTile; ++j) {
    const float w = __shfl_sync(0xffffffffu, weight, j);
    for (int k = 0; k < kChunks; ++k) {
      const int64_t d = lane + 32 * k;
      if (d < dim) acc[k] += w * tile[j * pitch + d];
    }
  }
}

template <typename T, int kChunks>
__global__ void AttentionForwardKernel(const T* q, const T* k, const T* v, T* out, float* lse,
                                       AttentionShape s) {
  NF_DYNAMIC_SHARED(float, shared);
  const int64_t pitch = s.dim + 1;
  float* k_tile = shared;                  // [kTile, pitch]
  float* v_tile = k_tile + kTile * pitch;  // [kTile, pitch]
  float* q_rows = v_tile + kTile * pitch;  // [kRowsPerBlock, pitch]
  const int64_t bh = blockIdx.y, offset = bh * s.seq * s.dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t i = first_row + warp;  // this warp's query row
  LoadRows(q + offset, first_row, kRowsPerBlock, s, q_rows);

  float running_max = -INFINITY, running_sum = 0.0f, acc[kChunks] = {};
  const int64_t key_end = KeyEnd(s, first_row);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    LoadRows(k + offset, j0, kTile, s, k_tile);
    LoadRows(v + offset, j0, kTile, s, v_tile);
    __syncthreads();
    const int64_t j = j0 + lane;
    const bool visible = Visible(s, i, j);
    const float score =
        visible ? s.scale * RowDot(q_rows + warp * pitch, k_tile + lane * pitch, s.dim) : -INFINITY;
    const float new_max = fmaxf(running_max, WarpMax(score));
    if (new_max == -INFINITY) continue;  // nothing visible yet (rows past seq)
    const float p = visible ? expf(score - new_max) : 0.0f;
    const float correction = expf(running_max - new_max);
    running_sum = running_sum * correction + WarpSum(p);
    running_max = new_max;
    for (int c = 0; c < kChunks; ++c) acc[c] *= correction;
    const float dropped = visible ? p * DropoutMultiplier(s, bh, i, j) : 0.0f;
    AccumulateTile<kChunks>(dropped, v_tile, s.dim, acc);
  }
  if (i >= s.seq) return;
  const float inv_sum = 1.0f / running_sum;
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < s.dim) out[offset + i * s.dim + d] = FromFloat<T>(acc[c] * inv_sum);
  }
  if (lane == 0) lse[bh * s.seq + i] = running_max + logf(running_sum);
}

// row_dot[bh, i] = sum_d dO[i, d] * O[i, d]: the softmax backward's row term.
template <typename T>
__global__ void RowDotKernel(const T* out, const T* dout, float* row_dot, int64_t rows,
                             int64_t dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  float sum = 0.0f;
  for (int64_t d = threadIdx.x & 31; d < dim; d += 32) {
    sum += ToFloat(dout[row * dim + d]) * ToFloat(out[row * dim + d]);
  }
  sum = WarpSum(sum);
  if ((threadIdx.x & 31) == 0) row_dot[row] = sum;
}

// dQ[i] = scale * sum_j dS[i, j] K[j], dS = P * (dropout(dO V^T) - row_dot), a warp per row i.
template <typename T, int kChunks>
__global__ void AttentionGradQKernel(const T* q, const T* k, const T* v, const T* dout,
                                     const float* lse, const float* row_dot, T* dq,
                                     AttentionShape s) {
  NF_DYNAMIC_SHARED(float, shared);
  const int64_t pitch = s.dim + 1;
  float* k_tile = shared;
  float* v_tile = k_tile + kTile * pitch;
  float* q_rows = v_tile + kTile * pitch;
  float* do_rows = q_rows + kRowsPerBlock * pitch;
  const int64_t bh = blockIdx.y, offset = bh * s.seq * s.dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t i = first_row + warp;
  LoadRows(q + offset, first_row, kRowsPerBlock, s, q_rows);
  LoadRows(dout + offset, first_row, kRowsPerBlock, s, do_rows);
  const float row_lse = i < s.seq ? lse[bh * s.seq + i] : 0.0f;
  const float dot_i = i < s.seq ? row_dot[bh * s.seq + i] : 0.0f;

  float acc[kChunks] = {};
  const int64_t key_end = KeyEnd(s, first_row);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    LoadRows(k + offset, j0, kTile, s, k_tile);
    LoadRows(v + offset, j0, kTile, s, v_tile);
    __syncthreads();
    const int64_t j = j0 + lane;
    float ds = 0.0f;
    if (Visible(s, i, j)) {
      const float p =
          expf(s.scale * RowDot(q_rows + warp * pitch, k_tile + lane * pitch, s.dim) - row_lse);
      const float dp = DropoutMultiplier(s, bh, i, j) *
                       RowDot(do_rows + warp * pitch, v_tile + lane * pitch, s.dim);
      ds = p * (dp - dot_i);
    }
    AccumulateTile<kChunks>(ds, k_tile, s.dim, acc);
  }
  if (i >= s.seq) return;
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < s.dim) dq[offset + i * s.dim + d] = FromFloat<T>(s.scale * acc[c]);
  }
}

// dV[j] = sum_i P'[i, j] dO[i] and dK[j] = scale * sum_i dS[i, j] Q[i], a warp per key row j,
// walking the query tiles at and after j (every query tile without the causal mask).
template <typename T, int kChunks>
__global__ void AttentionGradKVKernel(const T* q, const T* k, const T* v, const T* dout,
                                      const float* lse, const float* row_dot, T* dk, T* dv,
                                      AttentionShape s) {
  NF_DYNAMIC_SHARED(float, shared);
  const int64_t pitch = s.dim + 1;
  float* q_tile = shared;
  float* do_tile = q_tile + kTile * pitch;
  float* k_rows = do_tile + kTile * pitch;
  float* v_rows = k_rows + kRowsPerBlock * pitch;
  const int64_t bh = blockIdx.y, offset = bh * s.seq * s.dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t j = first_row + warp;
  LoadRows(k + offset, first_row, kRowsPerBlock, s, k_rows);
  LoadRows(v + offset, first_row, kRowsPerBlock, s, v_rows);

  float dk_acc[kChunks] = {}, dv_acc[kChunks] = {};
  // With the causal mask, queries before the block's first key see none of its keys.
  for (int64_t i0 = s.causal ? first_row / kTile * kTile : 0; i0 < s.seq; i0 += kTile) {
    __syncthreads();
    LoadRows(q + offset, i0, kTile, s, q_tile);
    LoadRows(dout + offset, i0, kTile, s, do_tile);
    __syncthreads();
    const int64_t i = i0 + lane;
    float dropped = 0.0f, ds = 0.0f;
    if (Visible(s, i, j)) {
      const float p = expf(s.scale * RowDot(k_rows + warp * pitch, q_tile + lane * pitch, s.dim) -
                           lse[bh * s.seq + i]);
      const float multiplier = DropoutMultiplier(s, bh, i, j);
      dropped = p * multiplier;
      const float dp = multiplier * RowDot(v_rows + warp * pitch, do_tile + lane * pitch, s.dim);
      ds = p * (dp - row_dot[bh * s.seq + i]);
    }
    AccumulateTile<kChunks>(dropped, do_tile, s.dim, dv_acc);
    AccumulateTile<kChunks>(ds, q_tile, s.dim, dk_acc);
  }
  if (j >= s.seq) return;
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d >= s.dim) continue;
    dv[offset + j * s.dim + d] = FromFloat<T>(dv_acc[c]);
    dk[offset + j * s.dim + d] = FromFloat<T>(s.scale * dk_acc[c]);
  }
}

AttentionShape ShapeOf(const Tensor& q, float scale, bool causal, const ops::DropoutSpec& dropout) {
  return {q.dim(1),
          q.dim(2),
          q.dim(3),
          scale,
          causal,
          dropout,
          DropoutThreshold(dropout.p),
          1.0f / (1.0f - dropout.p)};
}

// Calls f.template operator()<kChunks>() for the head dimension's 32-wide chunks.
template <typename F>
absl::Status DispatchHeadDim(int64_t dim, F&& f) {
  switch ((dim + 31) / 32) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
  }
  return absl::UnimplementedError(absl::StrCat("attention: head_dim ", dim,
                                               " is above the CUDA attention kernel's maximum of ",
                                               kMaxHeadDim));
}

// CUDA's limit on gridDim.y and gridDim.z.
constexpr int64_t kMaxGridY = 65535;

// Blocks of kRowsPerBlock rows by (sample, head) pairs; refuses more pairs than a grid has rows
// rather than letting the launch fail with "invalid configuration argument".
absl::StatusOr<dim3> RowGrid(int64_t rows, int64_t pairs) {
  if (pairs > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: micro-batch x heads per rank = ", pairs, " exceeds CUDA's ", kMaxGridY,
        " grid rows; use a smaller micro-batch or more tensor-parallel ranks"));
  }
  return dim3(static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned int>(pairs));
}

size_t SharedBytes(int64_t dim) {
  return static_cast<size_t>((2 * kTile + 2 * kRowsPerBlock) * (dim + 1)) * sizeof(float);
}

// KV-cache attention (incremental decoding). rows [pairs, fresh, dim] go to rows
// [past, past + fresh) of cache [pairs, capacity, dim].
template <typename T>
__global__ void AppendRowsKernel(const T* rows, T* cache, int64_t fresh, int64_t capacity,
                                 int64_t dim, int64_t past, int64_t total) {
  const int64_t per_pair = fresh * dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bh = e / per_pair;
    cache[(bh * capacity + past) * dim + e % per_pair] = rows[e];
  }
}

// One block per (new token i, pair bh): the query and its past + i + 1 visible scores in shared
// memory ([dim + past + fresh] floats), a block max and sum, then each thread one output
// dimension summed over the keys in order. Decoding reads a handful of new tokens over a cache
// of at most max_seq_len rows, so the simple kernel is not the bottleneck (the GEMMs are).
template <typename T>
__global__ void KvCacheAttentionKernel(const T* q, const T* k_cache, const T* v_cache, T* out,
                                       int64_t fresh, int64_t capacity, int64_t dim, int64_t past,
                                       float scale) {
  NF_DYNAMIC_SHARED(float, shared);
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x, bh = blockIdx.y, visible = past + i + 1;
  float* query = shared;         // [dim]
  float* scores = shared + dim;  // [visible]
  const T* q_row = q + (bh * fresh + i) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) query[d] = ToFloat(q_row[d]);
  __syncthreads();
  const T* keys = k_cache + bh * capacity * dim;
  const T* values = v_cache + bh * capacity * dim;
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    float score = 0.0f;
    for (int64_t d = 0; d < dim; ++d) score += query[d] * ToFloat(keys[j * dim + d]);
    scores[j] = scale * score;
    max = fmaxf(max, scores[j]);
  }
  max = BlockMax(max, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    scores[j] = expf(scores[j] - max);
    sum += scores[j];
  }
  const float inv_sum = 1.0f / BlockSum(sum, scratch);  // its barriers publish every score
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < visible; ++j) acc += scores[j] * ToFloat(values[j * dim + d]);
    out[(bh * fresh + i) * dim + d] = FromFloat<T>(acc * inv_sum);
  }
}

}  // namespace

absl::Status CudaBackend::SoftmaxForward(const Tensor& x, const Tensor& y) {
  const int64_t rows = ops::Rows(x);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<SoftmaxForwardKernel<T>>({static_cast<unsigned int>(rows), kThreads, 0, stream()},
                                    DevicePtr<T>(x), DevicePtr<T>(y), ops::Cols(x));
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t rows = ops::Rows(y);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(y.dtype(), [&]<typename T>() {
    Launch<SoftmaxBackwardKernel<T>>({static_cast<unsigned int>(rows), kThreads, 0, stream()},
                                     DevicePtr<T>(y), DevicePtr<T>(dy), DevicePtr<T>(dx),
                                     ops::Cols(y));
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::OwnAttentionForward(const ops::AttentionArgs& args) {
  const AttentionShape shape = ShapeOf(args.q, args.scale, args.causal, args.dropout);
  NF_ASSIGN_OR_RETURN(const dim3 grid, RowGrid(shape.seq, args.q.dim(0) * shape.heads));
  return DispatchHeadDim(shape.dim, [&]<int kChunks>() {
    DispatchFloat(args.q.dtype(), [&]<typename T>() {
      Launch<AttentionForwardKernel<T, kChunks>>(
          {grid, kRowsPerBlock * 32, SharedBytes(shape.dim), stream()}, DevicePtr<T>(args.q),
          DevicePtr<T>(args.k), DevicePtr<T>(args.v), DevicePtr<T>(args.out),
          args.lse.data<float>(), shape);
    });
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::OwnAttentionBackward(const ops::AttentionBackwardArgs& args) {
  const AttentionShape shape = ShapeOf(args.q, args.scale, args.causal, args.dropout);
  const int64_t pairs = args.q.dim(0) * shape.heads;
  NF_ASSIGN_OR_RETURN(Tensor row_dot,
                      Tensor::Empty(DType::kF32, {pairs * shape.seq}, context_.allocator()));
  NF_ASSIGN_OR_RETURN(const dim3 grid, RowGrid(shape.seq, pairs));
  NF_ASSIGN_OR_RETURN(const dim3 row_dot_grid, RowGrid(pairs * shape.seq, 1));
  return DispatchHeadDim(shape.dim, [&]<int kChunks>() {
    DispatchFloat(args.q.dtype(), [&]<typename T>() {
      Launch<RowDotKernel<T>>({row_dot_grid, kRowsPerBlock * 32, 0, stream()},
                              DevicePtr<T>(args.out), DevicePtr<T>(args.dout),
                              row_dot.data<float>(), pairs * shape.seq, shape.dim);
      Launch<AttentionGradQKernel<T, kChunks>>(
          {grid, kRowsPerBlock * 32, SharedBytes(shape.dim), stream()}, DevicePtr<T>(args.q),
          DevicePtr<T>(args.k), DevicePtr<T>(args.v), DevicePtr<T>(args.dout),
          args.lse.data<float>(), row_dot.data<float>(), DevicePtr<T>(args.dq), shape);
      Launch<AttentionGradKVKernel<T, kChunks>>(
          {grid, kRowsPerBlock * 32, SharedBytes(shape.dim), stream()}, DevicePtr<T>(args.q),
          DevicePtr<T>(args.k), DevicePtr<T>(args.v), DevicePtr<T>(args.dout),
          args.lse.data<float>(), row_dot.data<float>(), DevicePtr<T>(args.dk),
          DevicePtr<T>(args.dv), shape);
    });
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::KvCacheAttention(const ops::KvCacheAttentionArgs& args) {
  const int64_t pairs = args.q.dim(0) * args.q.dim(1), fresh = args.q.dim(2);
  const int64_t dim = args.q.dim(3), capacity = args.k_cache.dim(2);
  if (args.q.numel() == 0) return absl::OkStatus();
  if (pairs > kMaxGridY) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheAttention: batch x heads per rank = ", pairs, " exceeds CUDA's ",
                     kMaxGridY, " grid rows; decode fewer sequences at once"));
  }
  const size_t shared_bytes = static_cast<size_t>(dim + args.past + fresh) * sizeof(float);
  // The kernel's static scratch (32 floats) shares the 48 KiB with the dynamic part.
  constexpr size_t kStaticScratchBytes = 32 * sizeof(float);
  if (shared_bytes + kStaticScratchBytes > 48 * 1024) {
    return absl::UnimplementedError(
        absl::StrCat("KvCacheAttention: ", args.past + fresh, " keys of head_dim ", dim,
                     " exceed the CUDA kernel's 48 KiB of shared memory"));
  }
  DispatchFloat(args.q.dtype(), [&]<typename T>() {
    const int64_t total = args.k.numel();
    for (const auto& [rows, cache] :
         {std::pair{&args.k, &args.k_cache}, std::pair{&args.v, &args.v_cache}}) {
      Launch<AppendRowsKernel<T>>({GridFor(total), kThreads, 0, stream()}, DevicePtr<T>(*rows),
                                  DevicePtr<T>(*cache), fresh, capacity, dim, args.past, total);
    }
    Launch<KvCacheAttentionKernel<T>>(
        {dim3(static_cast<unsigned int>(fresh), static_cast<unsigned int>(pairs)), 128,
         shared_bytes, stream()},
        DevicePtr<T>(args.q), DevicePtr<T>(args.k_cache), DevicePtr<T>(args.v_cache),
        DevicePtr<T>(args.out), fresh, capacity, dim, args.past, args.scale);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
