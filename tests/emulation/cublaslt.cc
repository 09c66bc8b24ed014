// cuBLASLt on the emulated GPUs: the calls core/cuda/gemm.cc makes, each argument checked
// against cuBLASLt's documented requirements, and the product computed in fp32 (OpenBLAS
// sgemm on fp32 copies of the operands) on the stream, as CUBLAS_COMPUTE_32F computes it.
//
// Checked: attribute sizes; column-major layouts whose leading dimension holds a column;
// matching shapes of op(A) [m, k], op(B) [k, n], C and D [m, n] and their batches; the type
// combinations cuBLASLt has kernels for (A = B in fp32/fp16/bf16, C = D in the same type or,
// for 16-bit inputs, fp32; fp32 inputs with a 16-bit output have none: the heuristic finds no
// algorithm); the BIAS epilogue's vector (set, of D's or the declared type, 16-byte aligned);
// every operand at least as aligned as the preference promised the heuristic (256 bytes unless
// told less: a kernel chosen for aligned operands faults on a misaligned one); the workspace
// the algorithm asked for. With beta = 0 C is not read, as cuBLASLt does not read it.
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/emulation/streams.h"

namespace nf::emu {
namespace {

struct Handle {
  int device;
};

struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Preference {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

// The workspace the emulated algorithm asks for: what a split-K kernel would, when allowed.
constexpr uint64_t kAlgorithmWorkspace = uint64_t{1} << 20;
constexpr uint64_t kAlgorithmId = 0x4e46454d55;  // "NFEMU"
constexpr uintptr_t kBiasAlignment = 16;

template <typename T>
cublasStatus_t Read(const void* buf, size_t size, T* out) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

size_t ElementBytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

float Load(const void* base, int64_t index, cudaDataType_t type) {
  switch (type) {
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[index]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

void Store(void* base, int64_t index, cudaDataType_t type, float value) {
  switch (type) {
    case CUDA_R_16F:
      static_cast<__half*>(base)[index] = __float2half_rn(value);
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
      break;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

bool SupportedTypes(cudaDataType_t ab, cudaDataType_t cd) {
  if (ab == CUDA_R_32F) return cd == CUDA_R_32F;
  if (ab == CUDA_R_16F || ab == CUDA_R_16BF) return cd == ab || cd == CUDA_R_32F;
  return false;
}

bool LayoutValid(const Layout& l) {
  return l.ld >= static_cast<int64_t>(std::max<uint64_t>(1, l.rows)) && l.batch >= 1;
}

uint32_t AlignmentOf(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The shapes of one product, or an error status.
struct Problem {
  uint64_t m, n, k;
  int32_t batch;
};
cublasStatus_t ProblemOf(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c,
                         const Layout& dl, Problem* p) {
  if (!LayoutValid(a) || !LayoutValid(b) || !LayoutValid(c) || !LayoutValid(dl)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const uint64_t m = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t kb = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t n = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (k != kb || c.rows != m || c.cols != n || dl.rows != m || dl.cols != n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Batches: every operand has the product's count, or one matrix (stride 0) serves all.
  const int32_t batch = dl.batch;
  for (const Layout* l : {&a, &b, &c}) {
    if (l->batch != batch && !(l->batch == 1 && l->stride == 0)) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (a.type != b.type || c.type != dl.type || !SupportedTypes(a.type, dl.type)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *p = {m, n, k, batch};
  return CUBLAS_STATUS_SUCCESS;
}

// [rows, cols] column-major matrix `index` of a layout, as fp32 with leading dimension rows.
std::vector<float> ToFloat(const void* base, const Layout& l, int32_t index) {
  std::vector<float> out(l.rows * l.cols);
  const int64_t offset = static_cast<int64_t>(index) * l.stride;
  for (uint64_t col = 0; col < l.cols; ++col) {
    for (uint64_t row = 0; row < l.rows; ++row) {
      out[col * l.rows + row] = Load(base, offset + col * l.ld + row, l.type);
    }
  }
  return out;
}

}  // namespace
}  // namespace nf::emu

using nf::emu::Handle;
using nf::emu::Layout;
using nf::emu::MatmulDesc;
using nf::emu::Preference;
using nf::emu::Read;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = reinterpret_cast<cublasLtHandle_t>(new Handle{device});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<Handle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new MatmulDesc();
  d->compute = compute;
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<MatmulDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* buf, size_t size) {
  auto* d = reinterpret_cast<MatmulDesc*>(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return Read(buf, size, reinterpret_cast<int32_t*>(&d->trans_a));
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return Read(buf, size, reinterpret_cast<int32_t*>(&d->trans_b));
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return Read(buf, size, reinterpret_cast<uint32_t*>(&d->epilogue));
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return Read(buf, size, &d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return Read(buf, size, &d->bias_type);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;  // not one gemm.cc sets: not emulated
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(const cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<Layout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attribute,
                                                const void* buf, size_t size) {
  auto* l = reinterpret_cast<Layout*>(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return Read(buf, size, &l->batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return Read(buf, size, &l->stride);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *preference = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete reinterpret_cast<Preference*>(preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buf, size_t size) {
  auto* p = reinterpret_cast<Preference*>(preference);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return Read(buf, size, &p->max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return Read(buf, size, &p->align[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return Read(buf, size, &p->align[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return Read(buf, size, &p->align[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return Read(buf, size, &p->align[3]);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle,
                                              cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (handle == nullptr || operation == nullptr || a == nullptr || b == nullptr || c == nullptr ||
      d == nullptr || preference == nullptr || requested <= 0 || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const auto& desc = *reinterpret_cast<const MatmulDesc*>(operation);
  const auto& pref = *reinterpret_cast<const Preference*>(preference);
  nf::emu::Problem problem;
  *returned = 0;
  const cublasStatus_t status = nf::emu::ProblemOf(
      desc, *reinterpret_cast<const Layout*>(a), *reinterpret_cast<const Layout*>(b),
      *reinterpret_cast<const Layout*>(c), *reinterpret_cast<const Layout*>(d), &problem);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc.epilogue != CUBLASLT_EPILOGUE_BIAS) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].algo.data[0] = nf::emu::kAlgorithmId;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = pref.align[i];
  results[0].workspaceSize =
      pref.max_workspace >= nf::emu::kAlgorithmWorkspace ? nf::emu::kAlgorithmWorkspace : 0;
  results[0].algo.data[5] = results[0].workspaceSize;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                              const void* alpha, const void* a, cublasLtMatrixLayout_t a_desc,
                              const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                              const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace nf::emu;
  if (handle == nullptr || operation == nullptr || alpha == nullptr || beta == nullptr ||
      a_desc == nullptr || b_desc == nullptr || c_desc == nullptr || d_desc == nullptr ||
      algo == nullptr || algo->data[0] != kAlgorithmId) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const MatmulDesc desc = *reinterpret_cast<const MatmulDesc*>(operation);
  const Layout la = *reinterpret_cast<const Layout*>(a_desc);
  const Layout lb = *reinterpret_cast<const Layout*>(b_desc);
  const Layout lc = *reinterpret_cast<const Layout*>(c_desc);
  const Layout ld = *reinterpret_cast<const Layout*>(d_desc);
  Problem p;
  if (const cublasStatus_t s = ProblemOf(desc, la, lb, lc, ld, &p); s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  Stream* s = StreamOf(stream);
  if (s == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const int device = StreamDevice(s);
  auto fault = [&](const std::string& why) {
    FailDevice(device, cudaErrorLaunchFailure, absl::StrCat("cublasLtMatmul: ", why));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  };
  // The algorithm was chosen for operands at least this aligned.
  const void* operands[4] = {a, b, c, d};
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (AlignmentOf(operands[i]) < algo->data[1 + i]) {
      return fault(absl::StrCat("misaligned address: ", names[i], " is ", AlignmentOf(operands[i]),
                                "-byte aligned but the algorithm was "
                                "chosen for ",
                                algo->data[1 + i], " bytes"));
    }
  }
  // The workspace the heuristic said the algorithm needs.
  const uint64_t needed = algo->data[5];
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool bias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type =
      desc.bias_type < 0 ? ld.type : static_cast<cudaDataType_t>(desc.bias_type);
  if (bias) {
    if (desc.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (bias_type != ld.type && bias_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (reinterpret_cast<uintptr_t>(desc.bias) % kBiasAlignment != 0) {
      return fault(absl::StrCat("misaligned address: the bias vector is ", AlignmentOf(desc.bias),
                                "-byte aligned (the epilogue reads it in "
                                "16-byte vectors)"));
    }
  }
  Operation op;
  op.what = absl::StrCat("cublasLtMatmul ", p.m, "x", p.n, "x", p.k, " batch ", p.batch);
  op.accesses = {{a, false}, {b, false}, {d, true}};
  if (beta_value != 0.0f) op.accesses.push_back({c, false});
  if (bias) op.accesses.push_back({desc.bias, false});
  if (needed > 0) op.accesses.push_back({workspace, true});
  const void* bias_ptr = desc.bias;
  op.run = [=] {
    std::vector<float> out(p.m * p.n);
    for (int32_t i = 0; i < p.batch; ++i) {
      const std::vector<float> fa = ToFloat(a, la, la.batch == 1 ? 0 : i);
      const std::vector<float> fb = ToFloat(b, lb, lb.batch == 1 ? 0 : i);
      cblas_sgemm(CblasColMajor, desc.trans_a == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  desc.trans_b == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, static_cast<int>(p.m),
                  static_cast<int>(p.n), static_cast<int>(p.k), alpha_value, fa.data(),
                  static_cast<int>(la.rows), fb.data(), static_cast<int>(lb.rows), 0.0f, out.data(),
                  static_cast<int>(p.m));
      const int64_t c_offset = static_cast<int64_t>(lc.batch == 1 ? 0 : i) * lc.stride;
      const int64_t d_offset = static_cast<int64_t>(i) * ld.stride;
      for (uint64_t col = 0; col < p.n; ++col) {
        for (uint64_t row = 0; row < p.m; ++row) {
          float v = out[col * p.m + row];
          if (beta_value != 0.0f) v += beta_value * Load(c, c_offset + col * lc.ld + row, lc.type);
          if (bias) v += Load(bias_ptr, static_cast<int64_t>(row), bias_type);
          Store(d, d_offset + col * ld.ld + row, ld.type, v);
        }
      }
    }
  };
  const cudaError_t queued = Enqueue(s, std::move(op));
  return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
