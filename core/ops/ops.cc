// Validation and dispatch for every op of ops.h. Backends receive only consistent arguments.
#include "core/ops/ops.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/ops/backend.h"
#include "core/ops/checks.h"
#include "core/ops/composed_ops.h"
#include "core/ops/nonfinite_trace.h"
#include "core/status.h"
#include "core/trace_range.h"

namespace nf::ops {
namespace {

absl::Status CheckFloatingSameDType(absl::string_view op, Named reference, Named t) {
  NF_RETURN_IF_ERROR(CheckFloating(op, t));
  return CheckDType(op, t, reference.tensor.dtype());
}

absl::Status CheckDropout(absl::string_view op, const DropoutSpec& spec) {
  if (spec.p >= 0.0f && spec.p < 1.0f && spec.seq_len > 0 && spec.token_offset >= 0 &&
      spec.col_offset >= 0 && spec.head_offset >= 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": invalid dropout (p=", spec.p, ", seq_len=", spec.seq_len, ", token_offset=",
      spec.token_offset, ", col_offset=", spec.col_offset, ", head_offset=", spec.head_offset,
      "); p must be in [0, 1), seq_len positive and offsets non-negative"));
}

// Tensors that must not share memory (each is read after another is written).
absl::Status CheckDistinct(absl::string_view op, std::initializer_list<Named> tensors) {
  for (auto a = tensors.begin(); a != tensors.end(); ++a) {
    for (auto b = a + 1; b != tensors.end(); ++b) {
      if (a->tensor.numel() > 0 && a->tensor.raw_data() == b->tensor.raw_data()) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": ", a->name, " and ", b->name,
                                                       " share memory; give each its own tensor"));
      }
    }
  }
  return absl::OkStatus();
}

// The matrix dimensions of one GEMM operand: [rows, cols] of its last two dims, and its batch.
struct MatrixDims {
  int64_t batch, rows, cols;
};
MatrixDims DimsOf(const Tensor& t) { return {t.rank() == 3 ? t.dim(0) : 1, t.dim(-2), t.dim(-1)}; }

}  // namespace

// The backend of `tensor`'s device, and the op's scope: an NVTX range named after the op in CUDA
// builds (trace_range.h) and, with NF_OP_TIMING=1, its time (op_timing.h).
#define NF_BACKEND(tensor)                                              \
  NF_ASSIGN_OR_RETURN(Backend* backend, BackendFor((tensor).device())); \
  const TraceRange op_trace_range(__func__);                            \
  const ScopedOpTiming op_timing(__func__, *backend)

absl::Status Gemm(const GemmArgs& args) {
  constexpr absl::string_view op = "Gemm";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"A", args.a}, {"B", args.b}, {"C", args.c}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"A", args.a}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"A", args.a}, {"B", args.b}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"C", args.c}));
  for (Named t : {Named{"A", args.a}, Named{"B", args.b}, Named{"C", args.c}}) {
    if (t.tensor.rank() != 2 && t.tensor.rank() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", t.name, " is ", t.tensor.DebugString(), ", expected 2 or 3 dimensions"));
    }
  }
  const MatrixDims a = DimsOf(args.a), b = DimsOf(args.b), c = DimsOf(args.c);
  const int64_t m = args.trans_a ? a.cols : a.rows;
  const int64_t k = args.trans_a ? a.rows : a.cols;
  const int64_t kb = args.trans_b ? b.cols : b.rows;
  const int64_t n = args.trans_b ? b.rows : b.cols;
  // The batch count comes from the 3-D operands (a 2-D one is shared by every batch, even
  // when there are none).
  const int64_t batch = args.a.rank() == 3 ? a.batch : b.batch;
  const bool batches_agree = (args.a.rank() == 2 || a.batch == batch) &&
                             (args.b.rank() == 2 || b.batch == batch) &&
                             (batch == 1 || args.c.rank() == 3) && c.batch == batch;
  if (k != kb || c.rows != m || c.cols != n || !batches_agree) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": shapes do not multiply: op(A) of ", args.a.DebugString(),
                     args.trans_a ? " (transposed)" : "", " times op(B) of ", args.b.DebugString(),
                     args.trans_b ? " (transposed)" : "", " into C ", args.c.DebugString()));
  }
  if (args.bias.defined()) {
    NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"C", args.c}, {"bias", args.bias}}));
    NF_RETURN_IF_ERROR(CheckDType(op, {"bias", args.bias}, args.c.dtype()));
    NF_RETURN_IF_ERROR(CheckShape(op, {"bias", args.bias}, {n}));
    if (args.c.rank() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": a bias needs a 2-D product, not C ", args.c.DebugString()));
    }
  }
  NF_BACKEND(args.c);
  return Checked(backend->Gemm(args), __func__, {{"C", args.c}});
}

absl::Status AddBias(const Tensor& x, const Tensor& bias) {
  constexpr absl::string_view op = "AddBias";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"bias", bias}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"bias", bias}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"bias", bias}, {Cols(x)}));
  NF_BACKEND(x);
  return Checked(backend->AddBias(x, bias), __func__, {{"x", x}});
}

absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias) {
  constexpr absl::string_view op = "BiasBackward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"dy", dy}, {"dbias", dbias}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"dy", dy}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"dbias", dbias}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dbias", dbias}, {Cols(dy)}));
  NF_BACKEND(dy);
  return Checked(backend->BiasBackward(dy, dbias), __func__, {{"dbias", dbias}});
}

absl::Status ActivationForward(Activation act, const Tensor& x, const Tensor& y) {
  constexpr absl::string_view op = "ActivationForward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"y", y}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"y", y}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"y", y}, x.shape()));
  NF_BACKEND(x);
  return Checked(backend->ActivationForward(act, x, y), __func__, {{"y", y}});
}

absl::Status ActivationBackward(Activation act, const Tensor& x, const Tensor& dy,
                                const Tensor& dx) {
  constexpr absl::string_view op = "ActivationBackward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"dy", dy}, {"dx", dx}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"dy", dy}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"dx", dx}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dy", dy}, x.shape()));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dx", dx}, x.shape()));
  NF_BACKEND(x);
  return Checked(backend->ActivationBackward(act, x, dy, dx), __func__, {{"dx", dx}});
}

absl::Status Dropout(const Tensor& x, const Tensor& y, const DropoutSpec& spec) {
  constexpr absl::string_view op = "Dropout";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"y", y}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"y", y}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"y", y}, x.shape()));
  NF_RETURN_IF_ERROR(CheckDropout(op, spec));
  NF_BACKEND(x);
  return Checked(backend->Dropout(x, y, spec), __func__, {{"y", y}});
}

namespace {

absl::Status CheckChannels(absl::string_view op, const Tensor& x, const Tensor& scale,
                           int64_t inner) {
  NF_RETURN_IF_ERROR(CheckFloating(op, {"scale", scale}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"scale", scale}, {scale.numel()}));
  const int64_t group = scale.numel() * inner;
  if (inner < 1 || group == 0 || x.numel() % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x ", x.DebugString(), " is not [outer, ", scale.numel(), " channels, ", inner,
        " inner]; inner must be positive and divide the elements per channel group"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner, const Tensor& y) {
  constexpr absl::string_view op = "ScaleChannels";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"scale", scale}, {"y", y}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"y", y}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"y", y}, x.shape()));
  NF_RETURN_IF_ERROR(CheckChannels(op, x, scale, inner));
  NF_BACKEND(x);
  return Checked(backend->ScaleChannels(x, scale, inner, y), __func__, {{"y", y}});
}

absl::Status ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                   const Tensor& dy, const Tensor& dx, const Tensor& dscale) {
  constexpr absl::string_view op = "ScaleChannelsBackward";
  NF_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"x", x}, {"scale", scale}, {"dy", dy}, {"dx", dx}, {"dscale", dscale}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"dy", dy}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"dx", dx}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dy", dy}, x.shape()));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dx", dx}, x.shape()));
  NF_RETURN_IF_ERROR(CheckChannels(op, x, scale, inner));
  NF_RETURN_IF_ERROR(CheckDType(op, {"dscale", dscale}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dscale", dscale}, scale.shape()));
  NF_BACKEND(x);
  return Checked(backend->ScaleChannelsBackward(x, scale, inner, dy, dx, dscale), __func__,
                 {{"dx", dx}, {"dscale", dscale}});
}

namespace {

// The 4-D side [batch, heads, seq, head_dim] and the token side [batch * seq, heads * head_dim].
absl::Status CheckHeadLayout(absl::string_view op, Named tokens, Named heads,
                             bool groups_allowed = false) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {tokens, heads}));
  NF_RETURN_IF_ERROR(CheckFloating(op, heads));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, heads, tokens));
  const int rank = heads.tensor.rank();
  if (rank != 4 && !(groups_allowed && rank == 5)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", heads.name, " is ", heads.tensor.DebugString(), ", expected ",
                     groups_allowed ? "[groups, batch, heads, seq, head_dim] or " : "",
                     "[batch, heads, seq, head_dim]"));
  }
  // [groups, batch, heads, seq, head_dim], one group when 4-D.
  const Shape& s = heads.tensor.shape();
  const int64_t groups = rank == 5 ? s[0] : 1;
  const int64_t batch = s[rank - 4], count = s[rank - 3], seq = s[rank - 2], dim = s[rank - 1];
  return CheckShape(op, tokens, {batch * seq, groups * count * dim});
}

}  // namespace

absl::Status SplitHeads(const Tensor& tokens, const Tensor& heads) {
  NF_RETURN_IF_ERROR(CheckHeadLayout("SplitHeads", {"tokens", tokens}, {"heads", heads},
                                     /*groups_allowed=*/true));
  NF_BACKEND(tokens);
  return Checked(backend->SplitHeads(tokens, heads), __func__, {{"heads", heads}});
}

absl::Status MergeHeads(const Tensor& heads, const Tensor& tokens) {
  NF_RETURN_IF_ERROR(CheckHeadLayout("MergeHeads", {"tokens", tokens}, {"heads", heads},
                                     /*groups_allowed=*/true));
  NF_BACKEND(heads);
  return Checked(backend->MergeHeads(heads, tokens), __func__, {{"tokens", tokens}});
}

namespace {

// A per-head scale of heads [batch, heads, seq, head_dim]: [heads], floating.
absl::Status CheckHeadScale(absl::string_view op, const Tensor& heads, const Tensor& scale) {
  NF_RETURN_IF_ERROR(CheckFloating(op, {"scale", scale}));
  return CheckShape(op, {"scale", scale}, {heads.dim(1)});
}

}  // namespace

absl::Status MergeScaledHeads(const Tensor& heads, const Tensor& scale, const Tensor& tokens) {
  constexpr absl::string_view op = "MergeScaledHeads";
  NF_RETURN_IF_ERROR(CheckHeadLayout(op, {"tokens", tokens}, {"heads", heads}));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"heads", heads}, {"scale", scale}}));
  NF_RETURN_IF_ERROR(CheckHeadScale(op, heads, scale));
  NF_BACKEND(heads);
  return Checked(backend->MergeScaledHeads(heads, scale, tokens), __func__, {{"tokens", tokens}});
}

absl::Status MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                      const Tensor& scale, const Tensor& d_heads,
                                      const Tensor& dscale) {
  constexpr absl::string_view op = "MergeScaledHeadsBackward";
  NF_RETURN_IF_ERROR(CheckHeadLayout(op, {"d_tokens", d_tokens}, {"heads", heads}));
  NF_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"heads", heads}, {"scale", scale}, {"d_heads", d_heads}, {"dscale", dscale}}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"heads", heads}, {"d_heads", d_heads}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"d_heads", d_heads}, heads.shape()));
  NF_RETURN_IF_ERROR(CheckHeadScale(op, heads, scale));
  NF_RETURN_IF_ERROR(CheckDType(op, {"dscale", dscale}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dscale", dscale}, scale.shape()));
  NF_RETURN_IF_ERROR(
      CheckDistinct(op, {{"d_heads", d_heads}, {"heads", heads}, {"d_tokens", d_tokens}}));
  NF_BACKEND(heads);
  return Checked(backend->MergeScaledHeadsBackward(d_tokens, heads, scale, d_heads, dscale),
                 __func__, {{"d_heads", d_heads}, {"dscale", dscale}});
}

// ---- LayerNorm ---------------------------------------------------------------------------------

namespace {

absl::Status CheckLayerNormArgs(absl::string_view op, const LayerNormArgs& args) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", args.x},
                                          {"weight", args.weight},
                                          {"bias", args.bias},
                                          {"y", args.y},
                                          {"mean", args.mean},
                                          {"rstd", args.rstd}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", args.x}));
  NF_RETURN_IF_ERROR(CheckRankAtLeast(op, {"x", args.x}, 1));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", args.x}, {"y", args.y}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"y", args.y}, args.x.shape()));
  for (Named t : {Named{"weight", args.weight}, Named{"bias", args.bias}}) {
    NF_RETURN_IF_ERROR(CheckFloating(op, t));
    NF_RETURN_IF_ERROR(CheckShape(op, t, {Cols(args.x)}));
  }
  // The backends read weight and bias with one element type.
  NF_RETURN_IF_ERROR(CheckDType(op, {"bias", args.bias}, args.weight.dtype()));
  for (Named t : {Named{"mean", args.mean}, Named{"rstd", args.rstd}}) {
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, {Rows(args.x)}));
  }
  if (!(args.eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps must be positive, got ", args.eps));
  }
  return absl::OkStatus();
}

absl::Status CheckRowPairs(absl::string_view op, Named pairs, const Tensor& x, DType dtype) {
  NF_RETURN_IF_ERROR(CheckDType(op, pairs, dtype));
  NF_RETURN_IF_ERROR(CheckShape(op, pairs, {Rows(x), 2}));
  if (!(pairs.tensor.device() == x.device())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", pairs.name, " is on ",
                                                   pairs.tensor.device().ToString(), ", expected ",
                                                   x.device().ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckTotalCols(absl::string_view op, int64_t total_cols, const Tensor& x) {
  if (total_cols >= Cols(x) && total_cols > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": total_cols ", total_cols,
                                                 " must be positive and at least the local ",
                                                 Cols(x), " columns"));
}

absl::Status CheckLayerNormBackwardArgs(absl::string_view op, const LayerNormBackwardArgs& args) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"dy", args.dy},
                                          {"x", args.x},
                                          {"weight", args.weight},
                                          {"mean", args.mean},
                                          {"rstd", args.rstd},
                                          {"dx", args.dx},
                                          {"dweight", args.dweight},
                                          {"dbias", args.dbias}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", args.x}));
  NF_RETURN_IF_ERROR(CheckRankAtLeast(op, {"x", args.x}, 1));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", args.x}, {"dy", args.dy}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", args.x}, {"dx", args.dx}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dy", args.dy}, args.x.shape()));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dx", args.dx}, args.x.shape()));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"weight", args.weight}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"weight", args.weight}, {Cols(args.x)}));
  for (Named t : {Named{"dweight", args.dweight}, Named{"dbias", args.dbias}}) {
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, {Cols(args.x)}));
  }
  for (Named t : {Named{"mean", args.mean}, Named{"rstd", args.rstd}}) {
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, {Rows(args.x)}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormForward(const LayerNormArgs& args) {
  NF_RETURN_IF_ERROR(CheckLayerNormArgs("LayerNormForward", args));
  NF_BACKEND(args.x);
  return Checked(backend->LayerNormForward(args), __func__,
                 {{"y", args.y}, {"mean", args.mean}, {"rstd", args.rstd}});
}

absl::Status LayerNormPartialStats(const Tensor& x, const Tensor& stats) {
  constexpr absl::string_view op = "LayerNormPartialStats";
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckRankAtLeast(op, {"x", x}, 1));
  NF_RETURN_IF_ERROR(CheckRowPairs(op, {"stats", stats}, x, DType::kF64));
  NF_BACKEND(x);
  return Checked(backend->LayerNormPartialStats(x, stats), __func__, {{"stats", stats}});
}

absl::Status LayerNormForwardFromStats(const LayerNormArgs& args, const Tensor& stats,
                                       int64_t total_cols) {
  constexpr absl::string_view op = "LayerNormForwardFromStats";
  NF_RETURN_IF_ERROR(CheckLayerNormArgs(op, args));
  NF_RETURN_IF_ERROR(CheckRowPairs(op, {"stats", stats}, args.x, DType::kF64));
  NF_RETURN_IF_ERROR(CheckTotalCols(op, total_cols, args.x));
  NF_BACKEND(args.x);
  return Checked(backend->LayerNormForwardFromStats(args, stats, total_cols), __func__,
                 {{"y", args.y}, {"mean", args.mean}, {"rstd", args.rstd}});
}

absl::Status LayerNormBackward(const LayerNormBackwardArgs& args) {
  NF_RETURN_IF_ERROR(CheckLayerNormBackwardArgs("LayerNormBackward", args));
  NF_BACKEND(args.x);
  return Checked(backend->LayerNormBackward(args), __func__,
                 {{"dx", args.dx}, {"dweight", args.dweight}, {"dbias", args.dbias}});
}

absl::Status LayerNormBackwardPartialSums(const LayerNormBackwardArgs& args, const Tensor& sums) {
  constexpr absl::string_view op = "LayerNormBackwardPartialSums";
  NF_RETURN_IF_ERROR(CheckLayerNormBackwardArgs(op, args));
  NF_RETURN_IF_ERROR(CheckRowPairs(op, {"sums", sums}, args.x, DType::kF32));
  NF_BACKEND(args.x);
  return Checked(backend->LayerNormBackwardPartialSums(args, sums), __func__, {{"sums", sums}});
}

absl::Status LayerNormBackwardFromSums(const LayerNormBackwardArgs& args, const Tensor& sums,
                                       int64_t total_cols) {
  constexpr absl::string_view op = "LayerNormBackwardFromSums";
  NF_RETURN_IF_ERROR(CheckLayerNormBackwardArgs(op, args));
  NF_RETURN_IF_ERROR(CheckRowPairs(op, {"sums", sums}, args.x, DType::kF32));
  NF_RETURN_IF_ERROR(CheckTotalCols(op, total_cols, args.x));
  NF_BACKEND(args.x);
  return Checked(backend->LayerNormBackwardFromSums(args, sums, total_cols), __func__,
                 {{"dx", args.dx}, {"dweight", args.dweight}, {"dbias", args.dbias}});
}

// ---- NormFormer's FFN LayerNorm, fused with the activation before it --------------------------

namespace {

// scratch like x, on x's device.
absl::Status CheckScratch(absl::string_view op, const Tensor& scratch, const Tensor& x) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"scratch", scratch}}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"scratch", scratch}));
  return CheckShape(op, {"scratch", scratch}, x.shape());
}

}  // namespace

absl::Status ActivationNormForward(const ActivationNormArgs& args) {
  constexpr absl::string_view op = "ActivationNormForward";
  NF_RETURN_IF_ERROR(CheckLayerNormArgs(op, LayerNormOf(args, args.x)));
  NF_RETURN_IF_ERROR(CheckScratch(op, args.scratch, args.x));
  NF_RETURN_IF_ERROR(CheckDropout(op, args.dropout));
  NF_BACKEND(args.x);
  return Checked(backend->ActivationNormForward(args), __func__,
                 {{"y", args.y}, {"mean", args.mean}, {"rstd", args.rstd}});
}

absl::Status ActivationNormBackward(const ActivationNormBackwardArgs& args) {
  constexpr absl::string_view op = "ActivationNormBackward";
  NF_RETURN_IF_ERROR(CheckLayerNormBackwardArgs(op, LayerNormBackwardOf(args, args.x)));
  NF_RETURN_IF_ERROR(CheckScratch(op, args.scratch, args.x));
  NF_RETURN_IF_ERROR(CheckDropout(op, args.dropout));
  if (args.dx.numel() > 0 && args.dx.raw_data() == args.dy.raw_data()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dx must not be dy's memory"));
  }
  NF_BACKEND(args.x);
  return Checked(backend->ActivationNormBackward(args), __func__,
                 {{"dx", args.dx}, {"dweight", args.dweight}, {"dbias", args.dbias}});
}

// ---- The residual add fused with the LayerNorms on either side of it ---------------------------

namespace {

// The two LayerNorms' checks name the one they are about (x, y, weight... are its tensors).
constexpr absl::string_view kResidualNormForward =
    "ResidualNormForward (LayerNorm of the residual)";
constexpr absl::string_view kBranchNormForward = "ResidualNormForward (LayerNorm of the branch)";
constexpr absl::string_view kResidualNormBackward =
    "ResidualNormBackward (LayerNorm of the residual)";
constexpr absl::string_view kBranchNormBackward = "ResidualNormBackward (LayerNorm of the branch)";

}  // namespace

absl::Status ResidualNormForward(const ResidualNormArgs& args) {
  constexpr absl::string_view op = "ResidualNormForward";
  NF_RETURN_IF_ERROR(CheckLayerNormArgs(kResidualNormForward, ResidualNormOf(args)));
  NF_RETURN_IF_ERROR(CheckScratch(op, args.scratch, args.residual));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"residual", args.residual}, {"x", args.x}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", args.x}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"x", args.x}, args.residual.shape()));
  if (args.norms_branch()) {
    NF_RETURN_IF_ERROR(CheckLayerNormArgs(kBranchNormForward, BranchNormOf(args)));
  } else {
    NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"residual", args.residual}, {"branch", args.branch}}));
    NF_RETURN_IF_ERROR(
        CheckFloatingSameDType(op, {"residual", args.residual}, {"branch", args.branch}));
    NF_RETURN_IF_ERROR(CheckShape(op, {"branch", args.branch}, args.residual.shape()));
  }
  NF_RETURN_IF_ERROR(CheckDropout(op, args.dropout));
  NF_RETURN_IF_ERROR(CheckDistinct(op, {{"x", args.x},
                                        {"branch", args.branch},
                                        {"residual", args.residual},
                                        {"y", args.y},
                                        {"scratch", args.scratch}}));
  NF_BACKEND(args.residual);
  return Checked(backend->ResidualNormForward(args), __func__,
                 {{"branch_mean", args.branch_mean},
                  {"branch_rstd", args.branch_rstd},
                  {"residual", args.residual},
                  {"y", args.y},
                  {"mean", args.mean},
                  {"rstd", args.rstd}});
}

absl::Status ResidualNormBackward(const ResidualNormBackwardArgs& args) {
  constexpr absl::string_view op = "ResidualNormBackward";
  NF_RETURN_IF_ERROR(CheckLayerNormBackwardArgs(kResidualNormBackward,
                                                ResidualNormBackwardOf(args, args.d_residual)));
  NF_RETURN_IF_ERROR(CheckScratch(op, args.scratch, args.residual));
  if (args.norms_branch()) {
    NF_RETURN_IF_ERROR(
        CheckLayerNormBackwardArgs(kBranchNormBackward, BranchNormBackwardOf(args, args.scratch)));
  } else {
    NF_RETURN_IF_ERROR(
        CheckSameDevice(op, {{"residual", args.residual}, {"d_branch", args.d_branch}}));
    NF_RETURN_IF_ERROR(
        CheckFloatingSameDType(op, {"residual", args.residual}, {"d_branch", args.d_branch}));
    NF_RETURN_IF_ERROR(CheckShape(op, {"d_branch", args.d_branch}, args.residual.shape()));
  }
  NF_RETURN_IF_ERROR(CheckDropout(op, args.dropout));
  NF_RETURN_IF_ERROR(CheckDistinct(op, {{"dy", args.dy},
                                        {"d_residual", args.d_residual},
                                        {"d_branch", args.d_branch},
                                        {"branch", args.branch},
                                        {"scratch", args.scratch}}));
  NF_BACKEND(args.residual);
  return Checked(backend->ResidualNormBackward(args), __func__,
                 {{"d_residual", args.d_residual},
                  {"d_branch", args.d_branch},
                  {"dweight", args.dweight},
                  {"dbias", args.dbias},
                  {"d_branch_weight", args.d_branch_weight},
                  {"d_branch_bias", args.d_branch_bias}});
}

// ---- Softmax and attention ---------------------------------------------------------------------

absl::Status SoftmaxForward(const Tensor& x, const Tensor& y) {
  constexpr absl::string_view op = "SoftmaxForward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"y", y}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"x", x}, {"y", y}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"y", y}, x.shape()));
  NF_BACKEND(x);
  return Checked(backend->SoftmaxForward(x, y), __func__, {{"y", y}});
}

absl::Status SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  constexpr absl::string_view op = "SoftmaxBackward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"y", y}, {"dy", dy}, {"dx", dx}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"y", y}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"y", y}, {"dy", dy}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"y", y}, {"dx", dx}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dy", dy}, y.shape()));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dx", dx}, y.shape()));
  NF_BACKEND(y);
  return Checked(backend->SoftmaxBackward(y, dy, dx), __func__, {{"dx", dx}});
}

namespace {

// q, k, v and every [batch, heads, seq, head_dim] companion; lse [batch, heads, seq].
absl::Status CheckAttentionTensors(absl::string_view op, std::initializer_list<Named> like_q,
                                   Named lse, const DropoutSpec& dropout) {
  const Named& q = *like_q.begin();
  NF_RETURN_IF_ERROR(CheckFloating(op, q));
  if (q.tensor.rank() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", q.name, " is ", q.tensor.DebugString(),
                                                   ", expected [batch, heads, seq, head_dim]"));
  }
  for (const Named& t : like_q) {
    NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, q, t));
    NF_RETURN_IF_ERROR(CheckShape(op, t, q.tensor.shape()));
    if (!(t.tensor.device() == q.tensor.device())) {
      return CheckSameDevice(op, {q, t});
    }
  }
  NF_RETURN_IF_ERROR(CheckDType(op, lse, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, lse, {q.tensor.dim(0), q.tensor.dim(1), q.tensor.dim(2)}));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {q, lse}));
  return CheckDropout(op, dropout);
}

}  // namespace

absl::Status AttentionForward(const AttentionArgs& args) {
  NF_RETURN_IF_ERROR(CheckAttentionTensors(
      "AttentionForward", {{"q", args.q}, {"k", args.k}, {"v", args.v}, {"out", args.out}},
      {"lse", args.lse}, args.dropout));
  NF_BACKEND(args.q);
  return Checked(backend->AttentionForward(args), __func__, {{"out", args.out}, {"lse", args.lse}});
}

absl::Status AttentionBackward(const AttentionBackwardArgs& args) {
  NF_RETURN_IF_ERROR(CheckAttentionTensors("AttentionBackward",
                                           {{"q", args.q},
                                            {"k", args.k},
                                            {"v", args.v},
                                            {"out", args.out},
                                            {"dout", args.dout},
                                            {"dq", args.dq},
                                            {"dk", args.dk},
                                            {"dv", args.dv}},
                                           {"lse", args.lse}, args.dropout));
  NF_BACKEND(args.q);
  return Checked(backend->AttentionBackward(args), __func__,
                 {{"dq", args.dq}, {"dk", args.dk}, {"dv", args.dv}});
}

absl::Status KvCacheAttention(const KvCacheAttentionArgs& args) {
  constexpr absl::string_view op = "KvCacheAttention";
  const Named q{"q", args.q};
  NF_RETURN_IF_ERROR(CheckDefined(op, q));
  NF_RETURN_IF_ERROR(CheckFloating(op, q));
  if (args.q.rank() != 4 || args.k_cache.rank() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": q ", args.q.DebugString(),
                                                   " and k_cache ", args.k_cache.DebugString(),
                                                   " must be [batch, heads, tokens, head_dim]"));
  }
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {q,
                                          {"k", args.k},
                                          {"v", args.v},
                                          {"k_cache", args.k_cache},
                                          {"v_cache", args.v_cache},
                                          {"out", args.out}}));
  const int64_t capacity = args.k_cache.dim(2);
  const Shape cache_shape{args.q.dim(0), args.q.dim(1), capacity, args.q.dim(3)};
  for (const Named t : {Named{"k", args.k}, Named{"v", args.v}, Named{"out", args.out}}) {
    NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, q, t));
    NF_RETURN_IF_ERROR(CheckShape(op, t, args.q.shape()));
  }
  for (const Named t : {Named{"k_cache", args.k_cache}, Named{"v_cache", args.v_cache}}) {
    NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, q, t));
    NF_RETURN_IF_ERROR(CheckShape(op, t, cache_shape));
  }
  if (args.past < 0 || args.past + args.q.dim(2) > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", args.past, " cached + ", args.q.dim(2),
                                                   " new tokens exceed the cache's ", capacity,
                                                   " rows"));
  }
  NF_BACKEND(args.q);
  return Checked(backend->KvCacheAttention(args), __func__, {{"out", args.out}});
}

// ---- Embedding and loss ------------------------------------------------------------------------

absl::Status EmbeddingForward(const EmbeddingArgs& args) {
  constexpr absl::string_view op = "EmbeddingForward";
  NF_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"ids", args.ids}, {"table", args.table}, {"out", args.out}}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"ids", args.ids}, DType::kI32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"ids", args.ids}, {args.ids.numel()}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"table", args.table}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"table", args.table}, {"out", args.out}));
  if (args.table.rank() != 2) {
    return CheckShape(op, {"table", args.table}, {args.table.numel(), 1});
  }
  NF_RETURN_IF_ERROR(CheckShape(op, {"out", args.out}, {args.ids.numel(), args.table.dim(1)}));
  // The table may hold padding rows past the real vocabulary (the last slice of a padded,
  // vocab-parallel embedding): ids are checked against global_vocab, the real size.
  const int64_t global =
      args.global_vocab == 0 ? args.vocab_offset + args.table.dim(0) : args.global_vocab;
  if (args.vocab_offset < 0 || global < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": negative vocab_offset (", args.vocab_offset, ") or global_vocab (", global, ")"));
  }
  NF_BACKEND(args.table);
  EmbeddingArgs resolved = args;
  resolved.global_vocab = global;
  return Checked(backend->EmbeddingForward(resolved), __func__, {{"out", args.out}});
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                               int64_t vocab_offset) {
  constexpr absl::string_view op = "EmbeddingBackward";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"ids", ids}, {"dout", dout}, {"dtable", dtable}}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"ids", ids}, DType::kI32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"ids", ids}, {ids.numel()}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"dtable", dtable}, DType::kF32));
  if (dtable.rank() != 2) return CheckShape(op, {"dtable", dtable}, {dtable.numel(), 1});
  NF_RETURN_IF_ERROR(CheckFloating(op, {"dout", dout}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dout", dout}, {ids.numel(), dtable.dim(1)}));
  if (vocab_offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": negative vocab_offset ", vocab_offset));
  }
  NF_BACKEND(dtable);
  return Checked(backend->EmbeddingBackward(ids, dout, dtable, vocab_offset), __func__,
                 {{"dtable", dtable}});
}

namespace {

absl::Status CheckCrossEntropyArgs(absl::string_view op, const CrossEntropyArgs& args,
                                   std::initializer_list<Named> per_row) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"logits", args.logits}, {"targets", args.targets}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"logits", args.logits}));
  if (args.logits.rank() != 2) {
    return CheckShape(op, {"logits", args.logits}, {Rows(args.logits), Cols(args.logits)});
  }
  NF_RETURN_IF_ERROR(CheckDType(op, {"targets", args.targets}, DType::kI32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"targets", args.targets}, {args.logits.dim(0)}));
  for (const Named& t : per_row) {
    NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"logits", args.logits}, t}));
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, {args.logits.dim(0)}));
  }
  if (args.vocab_offset < 0 || args.valid_vocab < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": negative vocab_offset (",
                                                   args.vocab_offset, ") or valid_vocab (",
                                                   args.valid_vocab, ")"));
  }
  return absl::OkStatus();
}

CrossEntropyArgs Resolved(const CrossEntropyArgs& args) {
  CrossEntropyArgs resolved = args;
  if (resolved.valid_vocab == 0) resolved.valid_vocab = args.vocab_offset + args.logits.dim(1);
  return resolved;
}

}  // namespace

absl::Status CrossEntropyRowMax(const CrossEntropyArgs& args, const Tensor& row_max) {
  NF_RETURN_IF_ERROR(CheckCrossEntropyArgs("CrossEntropyRowMax", args, {{"row_max", row_max}}));
  NF_BACKEND(args.logits);
  return Checked(backend->CrossEntropyRowMax(Resolved(args), row_max), __func__,
                 {{"row_max", row_max}});
}

absl::Status CrossEntropySumExp(const CrossEntropyArgs& args, const Tensor& row_max,
                                const Tensor& sum_exp, const Tensor& target_logit) {
  NF_RETURN_IF_ERROR(CheckCrossEntropyArgs(
      "CrossEntropySumExp", args,
      {{"row_max", row_max}, {"sum_exp", sum_exp}, {"target_logit", target_logit}}));
  NF_BACKEND(args.logits);
  return Checked(backend->CrossEntropySumExp(Resolved(args), row_max, sum_exp, target_logit),
                 __func__, {{"sum_exp", sum_exp}, {"target_logit", target_logit}});
}

absl::Status CrossEntropyLoss(const Tensor& targets, const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit, const Tensor& loss) {
  constexpr absl::string_view op = "CrossEntropyLoss";
  NF_RETURN_IF_ERROR(CheckDType(op, {"targets", targets}, DType::kI32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"targets", targets}, {targets.numel()}));
  for (Named t : {Named{"row_max", row_max}, Named{"sum_exp", sum_exp},
                  Named{"target_logit", target_logit}, Named{"loss", loss}}) {
    NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"targets", targets}, t}));
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, targets.shape()));
  }
  NF_BACKEND(targets);
  return Checked(backend->CrossEntropyLoss(targets, row_max, sum_exp, target_logit, loss), __func__,
                 {{"loss", loss}});
}

absl::Status AccumulateLoss(const Tensor& loss, const Tensor& targets, const Tensor& totals) {
  constexpr absl::string_view op = "AccumulateLoss";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"loss", loss}, {"targets", targets}}));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"loss", loss}, {"totals", totals}}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"loss", loss}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"loss", loss}, {loss.numel()}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"targets", targets}, DType::kI32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"targets", targets}, loss.shape()));
  NF_RETURN_IF_ERROR(CheckDType(op, {"totals", totals}, DType::kF64));
  NF_RETURN_IF_ERROR(CheckShape(op, {"totals", totals}, {2}));
  NF_BACKEND(loss);
  return Checked(backend->AccumulateLoss(loss, targets, totals), __func__, {{"totals", totals}});
}

absl::Status CrossEntropyForward(const CrossEntropyArgs& args, const Tensor& row_max,
                                 const Tensor& sum_exp, const Tensor& loss) {
  // The target logit is written into `loss` first and turned into the loss in place.
  NF_RETURN_IF_ERROR(CrossEntropyRowMax(args, row_max));
  NF_RETURN_IF_ERROR(CrossEntropySumExp(args, row_max, sum_exp, loss));
  return CrossEntropyLoss(args.targets, row_max, sum_exp, loss, loss);
}

absl::Status CrossEntropyBackward(const CrossEntropyArgs& args, const Tensor& row_max,
                                  const Tensor& sum_exp, const Tensor& dloss,
                                  const Tensor& dlogits) {
  constexpr absl::string_view op = "CrossEntropyBackward";
  NF_RETURN_IF_ERROR(CheckCrossEntropyArgs(
      op, args, {{"row_max", row_max}, {"sum_exp", sum_exp}, {"dloss", dloss}}));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"logits", args.logits}, {"dlogits", dlogits}}));
  NF_RETURN_IF_ERROR(CheckFloatingSameDType(op, {"logits", args.logits}, {"dlogits", dlogits}));
  NF_RETURN_IF_ERROR(CheckShape(op, {"dlogits", dlogits}, args.logits.shape()));
  NF_BACKEND(args.logits);
  return Checked(backend->CrossEntropyBackward(Resolved(args), row_max, sum_exp, dloss, dlogits),
                 __func__, {{"dlogits", dlogits}});
}

// ---- Optimizer and mixed precision -------------------------------------------------------------

namespace {

absl::Status CheckAdamWArgs(absl::string_view op, const AdamWArgs& args) {
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"params", args.params},
                                          {"grads", args.grads},
                                          {"exp_avg", args.exp_avg},
                                          {"exp_avg_sq", args.exp_avg_sq}}));
  for (Named t : {Named{"params", args.params}, Named{"grads", args.grads},
                  Named{"exp_avg", args.exp_avg}, Named{"exp_avg_sq", args.exp_avg_sq}}) {
    NF_RETURN_IF_ERROR(CheckDType(op, t, DType::kF32));
    NF_RETURN_IF_ERROR(CheckShape(op, t, args.params.shape()));
  }
  if (args.step < 1 || !(args.beta1 >= 0 && args.beta1 < 1) ||
      !(args.beta2 >= 0 && args.beta2 < 1) || !(args.eps > 0) || !std::isfinite(args.lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": invalid hyper-parameters (step=", args.step, ", lr=", args.lr,
                     ", betas=(", args.beta1, ", ", args.beta2, "), eps=", args.eps,
                     "); step >= 1, betas in [0, 1), eps > 0 and a finite lr are required"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(const AdamWArgs& args) {
  NF_RETURN_IF_ERROR(CheckAdamWArgs("AdamWStep", args));
  NF_BACKEND(args.params);
  return backend->AdamWStep(args);
}

absl::Status AdamWWouldOverflow(const AdamWArgs& args, float grad_scale, DType model_dtype,
                                const Tensor& found) {
  constexpr absl::string_view op = "AdamWWouldOverflow";
  NF_RETURN_IF_ERROR(CheckAdamWArgs(op, args));
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"params", args.params}, {"found", found}}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"found", found}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"found", found}, {1}));
  if (!IsFloating(model_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": model_dtype must be floating, got ", DTypeName(model_dtype)));
  }
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": grad_scale must be finite, got ", grad_scale));
  }
  NF_BACKEND(args.params);
  return backend->AdamWWouldOverflow(args, grad_scale, model_dtype, found);
}

absl::Status UnscaleAndCheck(const Tensor& grads, float inv_scale, const Tensor& found_nonfinite) {
  constexpr absl::string_view op = "UnscaleAndCheck";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"grads", grads}, {"found_nonfinite", found_nonfinite}}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"grads", grads}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckDType(op, {"found_nonfinite", found_nonfinite}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"found_nonfinite", found_nonfinite}, {1}));
  NF_BACKEND(grads);
  return backend->UnscaleAndCheck(grads, inv_scale, found_nonfinite);
}

absl::Status SquaredNorm(const Tensor& x, const Tensor& out) {
  constexpr absl::string_view op = "SquaredNorm";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"out", out}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"out", out}, DType::kF32));
  NF_RETURN_IF_ERROR(CheckShape(op, {"out", out}, {1}));
  NF_BACKEND(x);
  return backend->SquaredNorm(x, out);
}

// ---- Data movement and BLAS-1 ------------------------------------------------------------------

absl::Status Cast(const Tensor& src, const Tensor& dst) {
  constexpr absl::string_view op = "Cast";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"src", src}, {"dst", dst}}));
  if (src.dtype() != dst.dtype()) {
    NF_RETURN_IF_ERROR(CheckFloating(op, {"src", src}));
    NF_RETURN_IF_ERROR(CheckFloating(op, {"dst", dst}));
  }
  NF_RETURN_IF_ERROR(CheckSameNumel(op, {"src", src}, {"dst", dst}));
  NF_BACKEND(src);
  return Checked(backend->Cast(src, dst), __func__, {{"dst", dst}});
}

absl::Status Copy(const Tensor& src, const Tensor& dst) {
  constexpr absl::string_view op = "Copy";
  NF_RETURN_IF_ERROR(CheckDefined(op, {"src", src}));
  NF_RETURN_IF_ERROR(CheckDefined(op, {"dst", dst}));
  NF_RETURN_IF_ERROR(CheckDType(op, {"dst", dst}, src.dtype()));
  NF_RETURN_IF_ERROR(CheckSameNumel(op, {"src", src}, {"dst", dst}));
  const Device src_device = src.device(), dst_device = dst.device();
  if (src_device.type == DeviceType::kCuda && dst_device.type == DeviceType::kCuda &&
      src_device.index != dst_device.index) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": src is on ", src_device.ToString(), " and dst on ",
                     dst_device.ToString(), "; copies between GPUs go through the communicators"));
  }
  // The GPU side's backend moves the data (the CPU backend when both are on the host).
  NF_BACKEND(src_device.type == DeviceType::kCuda ? src : dst);
  return Checked(backend->Copy(src, dst), __func__, {{"dst", dst}});
}

absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape, Device device) {
  if (device.type == DeviceType::kCpu) return Tensor::HostZeros(dtype, std::move(shape));
  NF_ASSIGN_OR_RETURN(Allocator * allocator, AllocatorFor(device));
  NF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, std::move(shape), *allocator));
  NF_RETURN_IF_ERROR(Fill(t, 0.0f));
  return t;
}

absl::StatusOr<Tensor> OnHost(const Tensor& t) {
  internal::CountHostSync();
  if (t.device().type == DeviceType::kCpu) return t;
  NF_ASSIGN_OR_RETURN(Tensor host, Tensor::HostEmpty(t.dtype(), t.shape()));
  NF_RETURN_IF_ERROR(Copy(t, host));
  return host;
}

absl::Status Fill(const Tensor& x, float value) {
  NF_RETURN_IF_ERROR(CheckDefined("Fill", {"x", x}));
  NF_BACKEND(x);
  return Checked(backend->Fill(x, value), __func__, {{"x", x}});
}

absl::Status Scale(const Tensor& x, float alpha) {
  NF_RETURN_IF_ERROR(CheckFloating("Scale", {"x", x}));
  NF_BACKEND(x);
  return Checked(backend->Scale(x, alpha), __func__, {{"x", x}});
}

absl::Status Axpy(float alpha, const Tensor& x, const Tensor& y) {
  constexpr absl::string_view op = "Axpy";
  NF_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", x}, {"y", y}}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"x", x}));
  NF_RETURN_IF_ERROR(CheckFloating(op, {"y", y}));
  NF_RETURN_IF_ERROR(CheckSameNumel(op, {"x", x}, {"y", y}));
  NF_BACKEND(x);
  return Checked(backend->Axpy(alpha, x, y), __func__, {{"y", y}});
}

#undef NF_BACKEND

}  // namespace nf::ops
