#include "core/cuda/attention_dispatch.h"

#include <atomic>
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

// Runs `cudnn` when the call may go to cuDNN (eligible, allowed by NF_ATTENTION), and `own`
// when it may not or cuDNN cannot run it here (kUnimplemented); other cuDNN errors fail the call.
// Either way the path and its reason go to the per-op timing (ops::NoteOpPath).
template <typename Cudnn, typename Own>
absl::Status Dispatch(const Tensor& q, const ops::DropoutSpec& dropout, uintptr_t address_bits,
                      Cudnn&& cudnn, Own&& own) {
  if (q.numel() == 0) return absl::OkStatus();
  NF_ASSIGN_OR_RETURN(const AttentionPolicy policy, PolicyFromEnvironment());
  if (policy == AttentionPolicy::kOwn) {
    ops::NoteOpPath("own", "NF_ATTENTION=own");
    return own();
  }
  if (const char* refusal = CudnnAttentionRefusal(q.dtype(), q.dim(3), address_bits)) {
    ops::NoteOpPath("own", refusal);
    return own();
  }
  const absl::Status status = cudnn();
  if (status.ok()) {
    cudnn_calls.fetch_add(1, std::memory_order_relaxed);
    ops::NoteOpPath("cudnn", dropout.p > 0.0f ? kCudnnWithDropout : kCudnnEligible);
    return status;
  }
  if (!absl::IsUnimplemented(status)) return status;
  ops::NoteOpPath("own", "cuDNN cannot run this call here (said on stderr at the first one)");
  return own();
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

absl::Status CudaBackend::AttentionForward(const ops::AttentionArgs& args) {
  return Dispatch(
      args.q, args.dropout, AddressBits({&args.q, &args.k, &args.v, &args.out, &args.lse}),
      [&] { return CudnnAttentionForward(context_, args); },
      [&] { return OwnAttentionForward(args); });
}

absl::Status CudaBackend::AttentionBackward(const ops::AttentionBackwardArgs& args) {
  return Dispatch(
      args.q, args.dropout,
      AddressBits({&args.q, &args.k, &args.v, &args.out, &args.lse, &args.dout, &args.dq, &args.dk,
                   &args.dv}),
      [&] { return CudnnAttentionBackward(context_, args); },
      [&] { return OwnAttentionBackward(args); });
}

}  // namespace nf::cuda
