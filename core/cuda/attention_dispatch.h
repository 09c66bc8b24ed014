// Which kernel computes an attention call (causal or not) on the GPU: cuDNN's fused flash
// attention (cudnn_attention.h) when the call is eligible and cuDNN runs on the device, else the
// project's own kernel (attention.cu), which is also the reference the cuDNN path is tested
// against.
//
// Attention dropout p > 0 runs on cuDNN too, with masks cuDNN draws (cudnn_attention.h): the
// 2.7B config trains with attention dropout 0.1, and the own kernel is several times slower.
// Those masks are not the Philox masks keyed by global (sample, head, query, key) coordinates
// that the CPU and the own kernel draw, which keep results independent of the parallel layout
// (docs/design.md section 3.3); NF_ATTENTION=own keeps that property on the GPU.
//
// NF_ATTENTION=own forces the own kernel for every call (cross-checks, bisecting a numerical
// difference, layout-independent dropout); unset, empty or "auto" lets eligible calls use cuDNN.
//
// One path for both directions. The forward decides, per call key (device, dtype, shape, causal
// mask, scale, dropout probability: AttentionCallKey), and the backward of that key follows it
// (BackwardAttentionPath): cuDNN's dropout mask is not the own kernel's, so an own backward
// after a cuDNN forward with dropout would compute the gradients of another mask, silently. A
// forward with dropout therefore takes cuDNN only when cuDNN also builds the backward graph of
// its key (else both run the own kernel), and a backward that still cannot follow a cuDNN
// forward with dropout (NF_ATTENTION=own set in between, a tensor of the backward not 16-byte
// aligned, cuDNN failing at run time) is an error, never a switch. Without dropout the two
// kernels agree (the same lse), and a backward refused by cuDNN runs the own kernel.
// Each call notes its path and the reason in the per-op timing (NF_OP_TIMING=1, nf-bench
// --op-times): "AttentionForward (cudnn)", "AttentionForward (own): fp32 storage ...".
#pragma once

#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

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

enum class AttentionPath { kOwn, kCudnn };

// The calls of each direction and path in this process (monotonic), so that a test can assert
// the path a call took (the difference across it), and compare with the path it expected.
struct AttentionPathCounts {
  int64_t forward_cudnn = 0, forward_own = 0, backward_cudnn = 0, backward_own = 0;
};
AttentionPathCounts AttentionPathsTaken();

// What fixes a call's path: one forward decision per key serves the backwards of that key.
struct AttentionCallKey {
  int device = 0;
  DType dtype = DType::kF32;
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  uint32_t scale_bits = 0;    // the scale's float bits
  uint32_t dropout_bits = 0;  // the dropout probability's float bits; 0: no dropout
  // A causal and a bidirectional call of one shape compute different things (and cuDNN builds
  // different graphs for them): they never share a decision or a graph.
  bool causal = true;
  auto operator<=>(const AttentionCallKey&) const = default;
  bool dropout() const { return dropout_bits != 0; }
  float dropout_probability() const { return std::bit_cast<float>(dropout_bits); }
  float scale() const { return std::bit_cast<float>(scale_bits); }
  // "[batch, heads, seq, dim] f16, dropout 0.1 on cuda:0", with ", non-causal" after the dtype
  // for a bidirectional call.
  std::string ToString() const;
};
AttentionCallKey AttentionKeyOf(int device, const Tensor& q, float scale,
                                const ops::DropoutSpec& dropout, bool causal = true);

// The forward's path, before running cuDNN's forward (whose own refusal, kUnimplemented, then
// still sends it to the own kernel): the own kernel when `refusal` says why cuDNN may not take
// the call (NF_ATTENTION=own, CudnnAttentionRefusal), or when the call drops out and cuDNN
// cannot build its backward graph (`backward_graph` not OK: the backward could not redraw
// cuDNN's mask); else cuDNN. Pure host logic.
AttentionPath ForwardAttentionPath(const char* refusal, bool dropout,
                                   const absl::Status& backward_graph);

// The backward's path, given the path the forward of its key took (nullopt: none seen, e.g. a
// backward run alone), and why cuDNN may not or cannot take this backward (`refusal`, nullptr
// when it can): follows the forward; after a cuDNN forward it takes cuDNN, or, refused, the own
// kernel without dropout and FailedPrecondition with dropout, naming the key and the refusal.
// Pure host logic.
absl::StatusOr<AttentionPath> BackwardAttentionPath(const AttentionCallKey& key,
                                                    std::optional<AttentionPath> forward,
                                                    const char* refusal);

// The path each key's latest forward took, which its backwards follow. Thread-safe.
class AttentionPathTable {
 public:
  void NoteForward(const AttentionCallKey& key, AttentionPath path);
  std::optional<AttentionPath> ForwardPath(const AttentionCallKey& key) const;
  void Clear();

 private:
  mutable std::mutex mutex_;
  std::map<AttentionCallKey, AttentionPath> paths_;
};
// The process's table, used by CudaBackend's attention (keys carry the device).
AttentionPathTable& AttentionPaths();

}  // namespace nf::cuda
