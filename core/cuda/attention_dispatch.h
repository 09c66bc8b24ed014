// Which kernel computes a causal attention call on the GPU: cuDNN's fused flash attention
// (cudnn_attention.h) when the call is eligible and cuDNN runs on the device, else the project's
// own kernel (attention.cu), which is also the reference the cuDNN path is tested against.
//
// The own kernel always takes attention dropout p > 0: cuDNN draws its dropout masks from its
// own generator, which cannot reproduce the Philox masks keyed by global (sample, head, query,
// key) coordinates that keep results independent of the parallel layout (docs/design.md section 3).
//
// NF_ATTENTION=own forces the own kernel for every call (cross-checks, bisecting a numerical
// difference); unset, empty or "auto" lets eligible calls use cuDNN.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_context.h"
#include "core/dtype.h"

namespace nf::cuda {

enum class AttentionPolicy {
  kAuto,  // cuDNN for eligible calls, the own kernel for the rest
  kOwn,   // the own kernel for every call
};

// The policy named by NF_ATTENTION's value (nullptr when unset); any other value is an error.
absl::StatusOr<AttentionPolicy> ParseAttentionPolicy(const char* value);

// Whether a call may run on cuDNN before asking cuDNN itself: fp16 or bf16 storage, head_dim a
// multiple of 8 up to 128 (what cuDNN's fused attention supports on Ampere and Hopper), no
// dropout (see above), and every tensor address 16-byte aligned (`address_bits` is the OR of
// the addresses; a view at an odd offset is not). Pure host logic.
bool CudnnAttentionEligible(DType dtype, int64_t head_dim, float dropout_p, uintptr_t address_bits);

// OK when cuDNN's fused attention can run on this device, else why not (built without the
// cuDNN frontend, libcudnn not loadable, no handle).
absl::Status CudnnAttentionStatus(CudaContext& context);

// Attention calls (forward and backward each count one) that cuDNN ran in this process, so that
// tests can check which path a call took.
int64_t CudnnAttentionCalls();

}  // namespace nf::cuda
