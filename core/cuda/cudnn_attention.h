// Attention, causal or bidirectional, through cuDNN's fused scaled-dot-product attention (flash
// attention), built with the cuDNN frontend's graph API: one forward and one backward graph per
// shape, dtype, causal mask, scale, dropout probability and device (AttentionCallKey), built on
// first use and kept for the process. Compiled only with the frontend's headers (NF_WITH_CUDNN);
// attention_dispatch.cc decides when to call it.
//
// Tensors as in ops::AttentionArgs: q, k, v, out, dout, dq, dk, dv contiguous [batch, heads,
// seq, head_dim] in fp16 or bf16; lse fp32 [batch, heads, seq], which is cuDNN's "Stats" tensor
// [batch, heads, seq, 1]: the natural-log log-sum-exp of each row of the scaled scores (causally
// masked when args.causal), as the own kernel and the CPU define it. Arithmetic and statistics are
// fp32; as in every flash attention, the probabilities enter the P V and dS K products rounded to
// the storage type. The backward uses cuDNN's deterministic algorithm, so a run repeats exactly as
// with the own kernel.
//
// Attention dropout (p > 0) is cuDNN's: the probabilities are dropped with a mask cuDNN draws
// from Philox, keyed by a seed made from the call's DropoutSpec (its run seed, site, first
// sample, first head and first token) and indexed by cuDNN's own positions within the call. The
// mask is a pure function of the spec and the shape, so a run repeats exactly and the backward
// redraws the forward's mask; it is not the CPU's (core/philox.h), and it changes with the
// tensor-parallel layout (docs/design.md section 3.3).
#pragma once

#include "absl/status/status.h"
#include "core/cuda/cuda_context.h"
#include "core/ops/ops.h"

namespace nf::cuda {

// Loads libcudnn (once per process) and creates the device's cuDNN handle on its compute
// stream (once per device). OK, or kUnimplemented saying why cuDNN cannot run here.
absl::Status CudnnAvailable(CudaContext& context);

// The calls run on the context's compute stream without host synchronisation (after a
// graph's first build). They expect an eligible call (no CudnnAttentionRefusal) and return
// kUnimplemented when cuDNN cannot run it on this device, so that the caller falls back to
// the own kernel; any other error is a failure of the call.
absl::Status CudnnAttentionForward(CudaContext& context, const ops::AttentionArgs& args);
absl::Status CudnnAttentionBackward(CudaContext& context, const ops::AttentionBackwardArgs& args);

// Builds (or finds) the backward graph of the forward call `args` without running anything: OK
// when cuDNN can run that call's backward, kUnimplemented saying why not. A forward with dropout
// asks first, so that it never runs on cuDNN when its backward could not (attention_dispatch.h).
absl::Status CudnnAttentionBackwardSupported(CudaContext& context, const ops::AttentionArgs& args);

}  // namespace nf::cuda
