// The memory each pipeline rank of a layout needs: what nf-launch --dry-run prints, and what
// nf-launch compares with the host's (or GPU's) available memory before allocating anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

// One pipeline rank, as its tensor-parallel and data-parallel rank 0 hold it (they also hold
// the replicated parameters and write them into checkpoints). The ops' temporaries and the
// process's own footprint (code, libraries, MPI and its buffers) are not counted;
// docs/memory.md compares the estimate with the allocator's counts and measured peaks.
struct PipelineRankMemory {
  std::string layers;          // the layer ranges of its chunks, e.g. "[0, 6) [12, 18)"
  std::string peak_in_flight;  // micro-batches in flight at the peak, per chunk, e.g. "4+3"
  int64_t parameters = 0;
  // On the training device:
  double parameter_bytes = 0;   // in the model dtype
  double gradient_bytes = 0;    // fp32
  double optimizer_bytes = 0;   // fp32 master weights (not for fp32 models) and two moments
  double activation_bytes = 0;  // kept for the backward pass of the micro-batches in flight
  // Allocated once per model chunk: the layers' scratch, the residual-stream gradients, one
  // layer's activations under full recompute (NormFormerModel::BufferBytes).
  double buffer_bytes = 0;
  // The GPU runtime's own allocations (train.device CUDA only; 0 on the CPU):
  // the cuBLASLt workspace (ops::kGpuGemmWorkspaceBytes, 32 MiB),
  double gemm_workspace_bytes = 0;
  // NCCL's buffers for this rank's communicators of more than one rank (NcclBufferBytes),
  double nccl_buffer_bytes = 0;
  // and, where attention runs on cuDNN, the deterministic backward's dP workspace
  // (CudnnAttentionWorkspaceBytes), taken from the caching allocator at the first backward and
  // kept there.
  double attention_workspace_bytes = 0;
  // In host memory, from the first save on (0 when the run never saves): the snapshot a save
  // copies this rank's share of the checkpoint into, kept for the next save. On a GPU the
  // device buffers are first copied to the host whole, which doubles it during a save.
  double snapshot_bytes = 0;
  // In host memory, for a dataset (not the synthetic corpus): the sample and shuffle indices
  // (data/gpt_samples.h: 24 bytes a sample) of the training stream, train_iters x
  // global_batch_size samples, and of the validation stream when the run evaluates.
  double sample_index_bytes = 0;
  // In host memory, on every rank: the flight recorder's parallel.flight_recorder_entries
  // entries (parallel/flight_recorder.h).
  double flight_recorder_bytes = 0;

  double runtime_bytes() const {
    return gemm_workspace_bytes + nccl_buffer_bytes + attention_workspace_bytes;
  }
  double device_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + buffer_bytes +
           runtime_bytes();
  }
  // All of it, for a run on the CPU, where device and host memory are one.
  double cpu_total_bytes() const { return device_bytes() + host_bytes(); }
  // A GPU run's host memory: the snapshot and, during a save, the host copy of the buffers,
  // the sample index and the flight recorder.
  double gpu_host_bytes() const { return snapshot_bytes + host_bytes(); }

 private:
  double host_bytes() const { return snapshot_bytes + sample_index_bytes + flight_recorder_bytes; }
};

// NCCL's device buffers for one communicator of more than one rank, at NCCL's default sizes:
// per channel, one connection's buffers for each of its three protocols, Simple
// (NCCL_BUFFSIZE, documented default 4 MiB), LL128 (NCCL_LL128_BUFFSIZE, default
// 120 x 640 x 8 steps x 8 bytes = 4.6875 MiB) and LL (NCCL_LL_BUFFSIZE, default
// 8 x 512 x 8 steps x 16 bytes = 512 KiB), 9,633,792 bytes, on 32 channels (NCCL's MAXCHANNELS
// of the CUDA 12 releases, which it opens on NVLink machines): 294 MiB. A communicator of one
// rank is no NCCL communicator (parallel/device_groups.h). NCCL_BUFFSIZE and friends set in the
// environment change the real figure, not this one.
inline constexpr int64_t kNcclChannels = 32;
inline constexpr int64_t kNcclSimpleBufferBytes = int64_t{4} << 20;
inline constexpr int64_t kNcclLl128BufferBytes = int64_t{120} * 640 * 8 * 8;
inline constexpr int64_t kNcclLlBufferBytes = int64_t{8} * 512 * 8 * 16;
int64_t NcclBufferBytes(int communicators);

// The NCCL communicators of more than one rank that pipeline rank `pp_rank` of a layout holds:
// tp, dp and pp when their size is above 1, and the embedding group (the first and last
// pipeline stages, pp > 1).
int NcclCommunicatorCount(int tp, int pp, int dp, int pp_rank);

// The dP workspace of cuDNN's deterministic attention backward (the algorithm the CUDA backend
// asks for, core/cuda/cudnn_attention.cc), on Hopper: fp16 dP for every (query, key) pair of
// one call, batch x local heads x seq^2 x 2 bytes (1.5 GiB for the 125M config's micro-batch 16,
// 512 MiB for the 2.7B at tp 2). Counted on any GPU (the estimate does not know the
// architecture), for calls cuDNN takes (CudnnAttentionCounts), NF_ATTENTION=own aside.
int64_t CudnnAttentionWorkspaceBytes(int64_t batch, int64_t local_heads, int64_t seq_len);

// Whether the CUDA backend runs a layer's attention on cuDNN (core/cuda/attention_dispatch.h's
// CudnnAttentionRefusal, with the model's storage): fp16 or bf16 storage and head_dim a
// multiple of 8 up to 128.
bool CudnnAttentionCounts(const TrainConfig& config);

// One entry per pipeline rank of `config` on `world_size` ranks; InvalidArgument, naming what
// does not fit, for a layout that cannot run.
absl::StatusOr<std::vector<PipelineRankMemory>> EstimateMemory(const TrainConfig& config,
                                                               int world_size);

}  // namespace nf::launcher
