// GEMM through cuBLASLt. normformer's tensors are row-major and cuBLASLt's matrices column-major;
// a row-major [r, c] matrix is the column-major [c, r] matrix of its transpose, so
//   C = op(A) op(B)  (row-major)   is computed as   C^T = op(B)^T op(A)^T  (column-major)
// with the operands swapped and the transposition flags kept. Products accumulate in fp32
// (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs, so fp32 results match the CPU's sgemm to
// rounding). The algorithm for each problem shape is chosen once by cuBLASLt's heuristic and
// cached, since the heuristic costs more than a small GEMM. A bias (GemmArgs::bias: one value per
// column of the row-major C, so per row of the column-major D) is added by cuBLASLt's BIAS
// epilogue instead of a pass of its own, when its vector is at least kBiasEpilogueAlignment
// bytes aligned. cuBLASLt takes alignment hints for A, B, C and D but none for the bias, and
// its kernels may read the bias with vector loads: a less aligned bias can fault with
// "misaligned address", which leaves the context unusable. Model biases are always aligned
// (model/param_table.h lays every parameter out on 256 bytes); any other bias gets the GEMM,
// then a plain bias add.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/status.h"

namespace nf::cuda {
namespace {

cudaDataType_t CudaTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// One column-major operand: rows x cols with leading dimension ld, `batch` matrices `stride`
// elements apart (stride 0 when one matrix serves every batch).
struct MatrixLayout {
  int64_t rows, cols, ld, batch, stride;
};

// Everything that decides the algorithm; the map key of the heuristic cache.
struct ProblemKey {
  int device;
  cudaDataType_t ab_type, c_type;
  cublasOperation_t op_a, op_b;
  MatrixLayout a, b, c;
  bool beta_nonzero;
  bool bias;  // the BIAS epilogue, its vector in c_type
  // Alignment in bytes (up to 256) of the swapped A, B and C pointers: views into flat
  // parameter buffers need not be aligned the way cuBLASLt's fastest kernels assume.
  uint32_t align_a, align_b, align_c;
  auto Tie() const {
    return std::make_tuple(device, ab_type, c_type, op_a, op_b, a.rows, a.cols, a.ld, a.batch,
                           a.stride, b.rows, b.cols, b.ld, b.batch, b.stride, c.rows, c.cols, c.ld,
                           c.batch, c.stride, beta_nonzero, bias, align_a, align_b, align_c);
  }
  bool operator<(const ProblemKey& other) const { return Tie() < other.Tie(); }
};

// Owns the cuBLASLt descriptors of one problem.
class MatmulPlan {
 public:
  ~MatmulPlan() {
    for (cublasLtMatrixLayout_t layout : {a_, b_, c_}) {
      if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    }
    if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
  }

  absl::Status Init(const ProblemKey& key, CudaContext& context) {
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                             &key.op_a, sizeof(key.op_a)));
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                             &key.op_b, sizeof(key.op_b)));
    if (key.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                               &epilogue, sizeof(epilogue)));
      NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          op_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &key.c_type, sizeof(key.c_type)));
    }
    NF_RETURN_IF_ERROR(MakeLayout(key.ab_type, key.a, &a_));
    NF_RETURN_IF_ERROR(MakeLayout(key.ab_type, key.b, &b_));
    NF_RETURN_IF_ERROR(MakeLayout(key.c_type, key.c, &c_));

    cublasLtMatmulPreference_t preference = nullptr;
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace = context.gemm_workspace_bytes();
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attribute, bytes] : alignments) {
      if (status == CUBLAS_STATUS_SUCCESS) {
        status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes));
      }
    }
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulAlgoGetHeuristic(context.cublaslt(), op_, a_, b_, c_, c_, preference,
                                              1, &heuristic_, &found);
    }
    cublasLtMatmulPreferenceDestroy(preference);
    NF_CUBLAS_RETURN_IF_ERROR(status);
    if (found == 0) {
      return absl::UnimplementedError(absl::StrCat(
          "Gemm: cuBLASLt has no algorithm for ", key.c.rows, "x", key.c.cols, " outputs of type ",
          static_cast<int>(key.c_type), " from inputs of type ", static_cast<int>(key.ab_type)));
    }
    return absl::OkStatus();
  }

  // `bias`: the epilogue's vector when the plan has one. The descriptor holds its address, so
  // calls on one plan must not overlap (one thread per device drives the backend).
  absl::Status Run(CudaContext& context, const void* a, const void* b, void* c, float alpha,
                   float beta, const void* bias) {
    if (bias != nullptr) {
      NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    // Operands swapped (see the file comment): cuBLASLt's A is our B.
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        context.cublaslt(), op_, &alpha, a, a_, b, b_, &beta, c, c_, c, c_, &heuristic_.algo,
        context.gemm_workspace(), context.gemm_workspace_bytes(), context.stream()));
    return absl::OkStatus();
  }

 private:
  static absl::Status MakeLayout(cudaDataType_t type, const MatrixLayout& m,
                                 cublasLtMatrixLayout_t* layout) {
    NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(layout, type, m.rows, m.cols, m.ld));
    if (m.batch > 1) {
      const int32_t count = static_cast<int32_t>(m.batch);
      NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      NF_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof(m.stride)));
    }
    return absl::OkStatus();
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

absl::StatusOr<MatmulPlan*> PlanFor(const ProblemKey& key, CudaContext& context) {
  static std::mutex mutex;
  static auto* plans = new std::map<ProblemKey, std::unique_ptr<MatmulPlan>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans->find(key);
  if (it == plans->end()) {
    auto plan = std::make_unique<MatmulPlan>();
    NF_RETURN_IF_ERROR(plan->Init(key, context));
    it = plans->emplace(key, std::move(plan)).first;
  }
  return it->second.get();
}

// The least alignment, in bytes, of a bias cuBLASLt's epilogue is given (see the top).
constexpr uint32_t kBiasEpilogueAlignment = 16;

uint32_t AlignmentOf(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The column-major layout of a stored row-major operand t ([rows, cols] or [batch, rows, cols])
// for `batch` products.
MatrixLayout ColumnMajorOf(const Tensor& t, int64_t batch) {
  const int64_t rows = t.dim(-2), cols = t.dim(-1);
  return {cols, rows, cols, batch, t.rank() == 3 ? rows * cols : 0};
}

}  // namespace

absl::Status CudaBackend::Gemm(const ops::GemmArgs& args) {
  const Tensor& c = args.c;
  if (c.numel() == 0) return absl::OkStatus();
  const int64_t batch = c.rank() == 3 ? c.dim(0) : 1;
  const int64_t k = args.trans_a ? args.a.dim(-2) : args.a.dim(-1);
  // cuBLASLt has no fp32-input kernels writing 16-bit outputs: compute those in fp32, then
  // round once (the CPU backend does the same). Those, empty products and biases too little
  // aligned for the epilogue add a bias after.
  const bool staged = args.a.dtype() == DType::kF32 && c.dtype() != DType::kF32;
  if (args.bias.defined() &&
      (k == 0 || staged || AlignmentOf(args.bias.raw_data()) < kBiasEpilogueAlignment)) {
    NF_RETURN_IF_ERROR(Gemm(args.WithoutBias()));
    return AddBias(c, args.bias);
  }
  // An empty product leaves C = beta C. With beta = 0, C is not read (as cuBLASLt and the CPU's
  // Sgemm do not read it): scaling by 0 would keep a NaN, and turn an inf into NaN, of memory
  // not yet written, where the CPU writes zeros.
  if (k == 0) return args.beta == 0.0f ? Fill(c, 0.0f) : Scale(c, args.beta);
  if (staged) {
    NF_ASSIGN_OR_RETURN(Tensor staged, Tensor::Empty(DType::kF32, c.shape(), context_.allocator()));
    if (args.beta != 0.0f) NF_RETURN_IF_ERROR(Cast(c, staged));
    ops::GemmArgs fp32_args = args;
    fp32_args.c = staged;
    NF_RETURN_IF_ERROR(Gemm(fp32_args));
    return Cast(staged, c);
  }
  ProblemKey key{};
  key.device = context_.device();
  key.ab_type = CudaTypeOf(args.a.dtype());
  key.c_type = CudaTypeOf(c.dtype());
  // Swapped operands, flags kept: cuBLASLt's A is our B, its B our A.
  key.op_a = args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.op_b = args.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.a = ColumnMajorOf(args.b, batch);
  key.b = ColumnMajorOf(args.a, batch);
  key.c = ColumnMajorOf(c, batch);
  key.beta_nonzero = args.beta != 0.0f;
  key.bias = args.bias.defined();
  key.align_a = AlignmentOf(args.b.raw_data());
  key.align_b = AlignmentOf(args.a.raw_data());
  key.align_c = AlignmentOf(c.raw_data());
  NF_ASSIGN_OR_RETURN(MatmulPlan * plan, PlanFor(key, context_));
  return plan->Run(context_, args.b.raw_data(), args.a.raw_data(), c.raw_data(), args.alpha,
                   args.beta, key.bias ? args.bias.raw_data() : nullptr);
}

}  // namespace nf::cuda
