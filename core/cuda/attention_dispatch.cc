#include "core/cuda/attention_dispatch.h"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_backend.h"
#include "core/ops/op_timing.h"
#include "core/philox.h"
#include "core/status.h"
#if NF_WITH_CUDNN
#include "core/cuda/cudnn_attention.h"
#endif

namespace nf::cuda {
namespace {

#if !NF_WITH_CUDNN
// Built without the cuDNN frontend: every call takes the own kernel.
absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "built without cuDNN attention: cudnn_frontend.h was not found at configure time (run "
      "scripts/setup.sh, then reconfigure)");
}
absl::Status CudnnAvailable(CudaContext&) { return NotBuilt(); }
absl::Status CudnnAttentionForward(CudaContext&, const ops::AttentionArgs&) { return NotBuilt(); }
absl::Status CudnnAttentionBackward(CudaContext&, const ops::AttentionBackwardArgs&) {
  return NotBuilt();
}
absl::Status CudnnAttentionBackwardSupported(CudaContext&, const ops::AttentionArgs&) {
  return NotBuilt();
}
#endif

constexpr int64_t kCudnnMaxHeadDim = 128;

constexpr const char* kCudnnEligible =
    "fp16/bf16, head_dim a multiple of 8 up to 128, 16-byte aligned";
constexpr const char* kCudnnWithDropout =
    "fp16/bf16, head_dim a multiple of 8 up to 128, 16-byte aligned; dropout masks drawn by "
    "cuDNN (not the CPU's; NF_ATTENTION=own for those)";

std::atomic<int64_t> cudnn_calls{0};

// Read at every call (a getenv next to a kernel launch), so that a test can switch paths.
absl::StatusOr<AttentionPolicy> PolicyFromEnvironment() {
  return ParseAttentionPolicy(std::getenv("NF_ATTENTION"));
}

uintptr_t AddressBits(std::initializer_list<const Tensor*> tensors) {
  uintptr_t bits = 0;
  for (const Tensor* t : tensors) bits |= reinterpret_cast<uintptr_t>(t->raw_data());
  return bits;
}

constexpr const char* kCudnnCannotRun =
    "cuDNN cannot run this call here (said on stderr at the first one)";

std::atomic<int64_t> forward_cudnn{0}, forward_own{0}, backward_cudnn{0}, backward_own{0};

// Why cuDNN may not take the call before asking it (NF_ATTENTION=own, CudnnAttentionRefusal),
// or nullptr.
absl::StatusOr<const char*> PolicyOrEligibilityRefusal(const Tensor& q, uintptr_t address_bits) {
  NF_ASSIGN_OR_RETURN(const AttentionPolicy policy, PolicyFromEnvironment());
  if (policy == AttentionPolicy::kOwn) return "NF_ATTENTION=own";
  return CudnnAttentionRefusal(q.dtype(), q.dim(3), address_bits);
}

// Notes the path in the per-op timing and the counts.
void NotePath(bool backward, AttentionPath path, const char* why) {
  ops::NoteOpPath(path == AttentionPath::kCudnn ? "cudnn" : "own", why);
  std::atomic<int64_t>& count =
      backward ? (path == AttentionPath::kCudnn ? backward_cudnn : backward_own)
               : (path == AttentionPath::kCudnn ? forward_cudnn : forward_own);
  count.fetch_add(1, std::memory_order_relaxed);
  if (path == AttentionPath::kCudnn) cudnn_calls.fetch_add(1, std::memory_order_relaxed);
}

const char* CudnnWhy(const ops::DropoutSpec& dropout) {
  return dropout.p > 0.0f ? kCudnnWithDropout : kCudnnEligible;
}

}  // namespace

absl::StatusOr<AttentionPolicy> ParseAttentionPolicy(const char* value) {
  if (value == nullptr || std::strcmp(value, "") == 0 || std::strcmp(value, "auto") == 0) {
    return AttentionPolicy::kAuto;
  }
  if (std::strcmp(value, "own") == 0) return AttentionPolicy::kOwn;
  return absl::InvalidArgumentError(absl::StrCat(
      "NF_ATTENTION=", value, " is not a choice: unset it (or set auto) to use cuDNN's fused ",
      "attention where it applies, or set own to force the project's own attention kernel"));
}

const char* CudnnAttentionRefusal(DType dtype, int64_t head_dim, uintptr_t address_bits) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return "fp32 storage (cuDNN's fused attention takes fp16 and bf16)";
  }
  if (head_dim % 8 != 0 || head_dim <= 0 || head_dim > kCudnnMaxHeadDim) {
    return "head_dim not a multiple of 8 up to 128 (cuDNN's fused attention needs one)";
  }
  if (address_bits % 16 != 0) return "a tensor not 16-byte aligned (a view at an odd offset)";
  return nullptr;
}

absl::Status CudnnAttentionStatus(CudaContext& context) { return CudnnAvailable(context); }

int64_t CudnnDropoutSeed(const ops::DropoutSpec& d) {
  constexpr uint32_t kCudnnTag = 0x6364'6e6e;  // "cdnn": a key no dropout of the CPU's uses
  const PhiloxCounter words =
      Philox4x32_10({d.site, static_cast<uint32_t>(d.head_offset),
                     static_cast<uint32_t>(d.token_offset), static_cast<uint32_t>(d.first_sample)},
                    {d.seed, static_cast<uint32_t>(d.first_sample >> 32) ^ kCudnnTag});
  return static_cast<int64_t>((static_cast<uint64_t>(words[0]) << 32) | words[1]);
}

int64_t CudnnAttentionCalls() { return cudnn_calls.load(std::memory_order_relaxed); }

AttentionPathCounts AttentionPathsTaken() {
  return {.forward_cudnn = forward_cudnn.load(std::memory_order_relaxed),
          .forward_own = forward_own.load(std::memory_order_relaxed),
          .backward_cudnn = backward_cudnn.load(std::memory_order_relaxed),
          .backward_own = backward_own.load(std::memory_order_relaxed)};
}

std::string AttentionCallKey::ToString() const {
  return absl::StrCat(
      "[", batch, ", ", heads, ", ", seq, ", ", dim, "] ", DTypeName(dtype),
      causal ? "" : ", non-causal",
      dropout() ? absl::StrCat(", dropout ", dropout_probability()) : ", no dropout",
      " on cuda:", device);
}

AttentionCallKey AttentionKeyOf(int device, const Tensor& q, float scale,
                                const ops::DropoutSpec& dropout, bool causal) {
  return {.device = device,
          .dtype = q.dtype(),
          .batch = q.dim(0),
          .heads = q.dim(1),
          .seq = q.dim(2),
          .dim = q.dim(3),
          .scale_bits = std::bit_cast<uint32_t>(scale),
          .dropout_bits = std::bit_cast<uint32_t>(dropout.p > 0.0f ? dropout.p : 0.0f),
          .causal = causal};
}

AttentionPath ForwardAttentionPath(const char* refusal, bool dropout,
                                   const absl::Status& backward_graph) {
  if (refusal != nullptr) return AttentionPath::kOwn;
  if (dropout && !backward_graph.ok()) return AttentionPath::kOwn;
  return AttentionPath::kCudnn;
}

absl::StatusOr<AttentionPath> BackwardAttentionPath(const AttentionCallKey& key,
                                                    std::optional<AttentionPath> forward,
                                                    const char* refusal) {
  if (forward == AttentionPath::kOwn) return AttentionPath::kOwn;
  if (refusal == nullptr) return AttentionPath::kCudnn;
  if (forward == AttentionPath::kCudnn && key.dropout()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attention backward ", key.ToString(),
        ": its forward ran on cuDNN, whose dropout mask the own kernel cannot redraw, but the "
        "backward cannot run on cuDNN (",
        refusal,
        "); the own kernel would compute the gradients of another mask. Set NF_ATTENTION=own for "
        "the whole run to use the own kernel in both directions"));
  }
  return AttentionPath::kOwn;
}

void AttentionPathTable::NoteForward(const AttentionCallKey& key, AttentionPath path) {
  std::lock_guard<std::mutex> lock(mutex_);
  paths_[key] = path;
}

std::optional<AttentionPath> AttentionPathTable::ForwardPath(const AttentionCallKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = paths_.find(key);
  if (it == paths_.end()) return std::nullopt;
  return it->second;
}

void AttentionPathTable::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  paths_.clear();
}

AttentionPathTable& AttentionPaths() {
  static AttentionPathTable* const table = new AttentionPathTable;  // lives for the process
  return *table;
}

absl::Status CudaBackend::AttentionForward(const ops::AttentionArgs& args) {
  if (args.q.numel() == 0) return absl::OkStatus();
  const AttentionCallKey key =
      AttentionKeyOf(context_.device(), args.q, args.scale, args.dropout, args.causal);
  NF_ASSIGN_OR_RETURN(const char* refusal,
                      PolicyOrEligibilityRefusal(
                          args.q, AddressBits({&args.q, &args.k, &args.v, &args.out, &args.lse})));
  // With dropout, only when cuDNN can also run the backward, which must redraw cuDNN's mask.
  absl::Status backward_graph;
  if (refusal == nullptr && key.dropout()) {
    backward_graph = CudnnAttentionBackwardSupported(context_, args);
    if (!backward_graph.ok() && !absl::IsUnimplemented(backward_graph)) return backward_graph;
  }
  AttentionPath path = ForwardAttentionPath(refusal, key.dropout(), backward_graph);
  const char* why = refusal != nullptr ? refusal
                    : !backward_graph.ok()
                        ? "cuDNN cannot run this call's backward with dropout (said on stderr): "
                          "both directions use the own kernel"
                        : CudnnWhy(args.dropout);
  if (path == AttentionPath::kCudnn) {
    const absl::Status status = CudnnAttentionForward(context_, args);
    if (!status.ok() && !absl::IsUnimplemented(status)) return status;
    if (!status.ok()) {
      path = AttentionPath::kOwn;
      why = kCudnnCannotRun;
    }
  }
  AttentionPaths().NoteForward(key, path);
  NotePath(/*backward=*/false, path, why);
  return path == AttentionPath::kCudnn ? absl::OkStatus() : OwnAttentionForward(args);
}

absl::Status CudaBackend::AttentionBackward(const ops::AttentionBackwardArgs& args) {
  if (args.q.numel() == 0) return absl::OkStatus();
  const AttentionCallKey key =
      AttentionKeyOf(context_.device(), args.q, args.scale, args.dropout, args.causal);
  const std::optional<AttentionPath> forward = AttentionPaths().ForwardPath(key);
  NF_ASSIGN_OR_RETURN(const char* refusal,
                      PolicyOrEligibilityRefusal(
                          args.q, AddressBits({&args.q, &args.k, &args.v, &args.out, &args.lse,
                                               &args.dout, &args.dq, &args.dk, &args.dv})));
  NF_ASSIGN_OR_RETURN(AttentionPath path, BackwardAttentionPath(key, forward, refusal));
  const char* why = forward == AttentionPath::kOwn ? "its forward ran on the own kernel"
                    : refusal != nullptr           ? refusal
                                                   : CudnnWhy(args.dropout);
  if (path == AttentionPath::kCudnn) {
    const absl::Status status = CudnnAttentionBackward(context_, args);
    if (!status.ok() && !absl::IsUnimplemented(status)) return status;
    if (!status.ok()) {
      // cuDNN refused at run time: the same rule decides whether the own kernel may take it.
      NF_ASSIGN_OR_RETURN(path, BackwardAttentionPath(key, forward, kCudnnCannotRun));
      why = kCudnnCannotRun;
    }
  }
  NotePath(/*backward=*/true, path, why);
  return path == AttentionPath::kCudnn ? absl::OkStatus() : OwnAttentionBackward(args);
}

}  // namespace nf::cuda
