// Which kernel computes a causal attention call on the GPU: cuDNN's fused flash attention
// (cudnn_attention.h) when the call is eligible and cuDNN runs on the device, else the project's
// own kernel (attention.cu), which is also the reference the cuDNN path is tested against.
//
// Attention dropout p > 0 runs on cuDNN too, with masks cuDNN draws (cudnn_attention.h): the
// 2.7B config trains with attention dropout 0.1, and the own kernel is several times slower.
// Those masks are not the Philox masks keyed by global (sample, head, query, key) coordinates
// that the CPU and the own kernel draw, which keep results independent of the parallel layout
// (docs/design.md section 3.3); NF_ATTENTION=own keeps that property on the GPU.
//
// NF_ATTENTION=own forces the own kernel for every call (cross-checks, bisecting a numerical
// difference, layout-independent dropout); unset, empty or "auto" lets eligible calls use cuDNN.
// Each call notes its path and the reason in the per-op timing (NF_OP_TIMING=1, nf-bench
// --op-times): "AttentionForward (cudnn)", "AttentionForward (own): fp32 storage ...".
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_context.h"
#include "core/dtype.h"
#include "core/ops/ops.h"

namespace nf::cuda {

enum class AttentionPolicy {
  kAuto,  // cuDNN for eligible calls, the own kernel for the rest
  kOwn,   // the own kernel for every call
};

// The policy named by NF_ATTENTION's value (nullptr when unset); any other value is an error.
absl::StatusOr<AttentionPolicy> ParseAttentionPolicy(const char* value);

// Why a call may not run on cuDNN, before asking cuDNN itself (a string literal), or nullptr
// when it may: fp16 or bf16 storage, head_dim a multiple of 8 up to 128 (what cuDNN's fused
// attention supports on Ampere and Hopper), and every tensor address 16-byte aligned
// (`address_bits` is the OR of the addresses; a view at an odd offset is not). Dropout is no
// reason. Pure host logic.
const char* CudnnAttentionRefusal(DType dtype, int64_t head_dim, uintptr_t address_bits);

// OK when cuDNN's fused attention can run on this device, else why not (built without the
// cuDNN frontend, libcudnn not loadable, no handle).
absl::Status CudnnAttentionStatus(CudaContext& context);

// The Philox seed of one call's cuDNN dropout: a function of the run's seed and of where the
// call sits in the network and the data (site, first sample, this shard's first head, first
// token), so that no two calls of a run draw the same mask and the backward redraws the
// forward's. It is Philox itself applied to those coordinates: a bijection of the counter for
// a fixed key, so distinct calls get distinct seeds but for the truncation to 64 bits. cuDNN
// then draws from its own (batch, head, query, key) positions within the call, so its masks
// are not the CPU's (docs/design.md section 3.3). Pure host logic.
int64_t CudnnDropoutSeed(const ops::DropoutSpec& dropout);

// Attention calls (forward and backward each count one) that cuDNN ran in this process, so that
// tests can check which path a call took.
int64_t CudnnAttentionCalls();

}  // namespace nf::cuda
