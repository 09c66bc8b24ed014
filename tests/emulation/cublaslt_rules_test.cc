// The cuBLASLt double (cublaslt.cc) keeps cuBLASLt's documented requirements: each case calls
// cuBLASLt's own C API as core/cuda/gemm.cc does, with one argument wrong, or all right and the
// product checked against a plain loop.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/emulation/emulator.h"

namespace nf::emu {
namespace {

using ::testing::HasSubstr;

// One column-major problem D[m, n] = alpha * A[m, k] B[k, n] + beta * C, all fp32 unless set.
class CublasLtRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClearReportsAndErrors();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&workspace_, kWorkspace), cudaSuccess);
  }
  void TearDown() override {
    for (cublasLtMatrixLayout_t layout : layouts_) cublasLtMatrixLayoutDestroy(layout);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
    if (preference_ != nullptr) cublasLtMatmulPreferenceDestroy(preference_);
    cudaFree(workspace_);
    cudaStreamDestroy(stream_);
    cublasLtDestroy(handle_);
    ClearReportsAndErrors();
  }

  cublasLtMatrixLayout_t Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t layout = nullptr;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
    layouts_.push_back(layout);
    return layout;
  }
  void Describe(size_t max_workspace = kWorkspace) {
    ASSERT_EQ(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&preference_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(
        cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &max_workspace, sizeof(max_workspace)),
        CUBLAS_STATUS_SUCCESS);
  }
  // The heuristic's status; the algorithms it found (0 or 1) in found_, the one in result_.
  cublasStatus_t Heuristic(cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                           cublasLtMatrixLayout_t c) {
    found_ = 0;
    return cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a, b, c, c, preference_, 1, &result_,
                                          &found_);
  }
  float* Device(const std::vector<float>& host) {
    void* ptr = nullptr;
    EXPECT_EQ(cudaMalloc(&ptr, host.size() * sizeof(float) + 256), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    return static_cast<float*>(ptr);
  }
  std::vector<float> Host(const float* device, size_t n) {
    std::vector<float> host(n);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

  static constexpr size_t kWorkspace = size_t{4} << 20;
  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatmulHeuristicResult_t result_{};
  int found_ = 0;
  std::vector<cublasLtMatrixLayout_t> layouts_;
};

TEST_F(CublasLtRulesTest, ABatchedTransposedProductWithBiasIsComputedAndCIsNotReadAtBetaZero) {
  // op(A) = A^T with A stored [k=3, m=2]; B [k=3, n=2]; two batches; D[2, 2] + bias[2].
  const int m = 2, n = 2, k = 3, batch = 2;
  std::vector<float> a(k * m * batch), b(k * n * batch);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.25f * static_cast<float>(i % 5);
  const std::vector<float> bias = {10.0f, 20.0f};
  const std::vector<float> c(m * n * batch, std::nanf(""));  // must not be read
  float *da = Device(a), *db = Device(b), *dc = Device(c), *dbias = Device(bias);
  Describe();
  const cublasOperation_t transposed = CUBLAS_OP_T;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transposed,
                                           sizeof(transposed)),
            CUBLAS_STATUS_SUCCESS);
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias,
                                           sizeof(dbias)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la = Layout(CUDA_R_32F, k, m, k), lb = Layout(CUDA_R_32F, k, n, k),
                         lc = Layout(CUDA_R_32F, m, n, m);
  const int32_t count = batch;
  for (auto [layout, stride] : {std::pair{la, int64_t{k * m}}, std::pair{lb, int64_t{k * n}},
                                std::pair{lc, int64_t{m * n}}}) {
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof(count)),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof(stride)),
              CUBLAS_STATUS_SUCCESS);
  }
  ASSERT_EQ(Heuristic(la, lb, lc), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found_, 1);
  const float alpha = 2.0f, beta = 0.0f;
  ASSERT_EQ(cublasLtMatmul(handle_, desc_, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc,
                           &result_.algo, workspace_, kWorkspace, stream_),
            CUBLAS_STATUS_SUCCESS);
  const std::vector<float> d = Host(dc, m * n * batch);
  for (int p = 0; p < batch; ++p) {
    for (int col = 0; col < n; ++col) {
      for (int row = 0; row < m; ++row) {
        float want = bias[row];
        for (int i = 0; i < k; ++i) {
          want += alpha * a[p * k * m + row * k + i] * b[p * k * n + col * k + i];
        }
        EXPECT_FLOAT_EQ(d[p * m * n + col * m + row], want) << p << " " << row << " " << col;
      }
    }
  }
}

TEST_F(CublasLtRulesTest, ALeadingDimensionShorterThanAColumnIsInvalid) {
  Describe();
  EXPECT_EQ(Heuristic(Layout(CUDA_R_32F, 4, 4, 3), Layout(CUDA_R_32F, 4, 4, 4),
                      Layout(CUDA_R_32F, 4, 4, 4)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(found_, 0);
}

TEST_F(CublasLtRulesTest, Fp32InputsWithA16BitOutputHaveNoAlgorithm) {
  Describe();
  EXPECT_EQ(Heuristic(Layout(CUDA_R_32F, 4, 4, 4), Layout(CUDA_R_32F, 4, 4, 4),
                      Layout(CUDA_R_16F, 4, 4, 4)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found_, 0);
}

TEST_F(CublasLtRulesTest, AnAttributeOfTheWrongSizeIsInvalid) {
  Describe();
  const int64_t too_wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &too_wide,
                                           sizeof(too_wide)),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(CublasLtRulesTest, LessWorkspaceThanTheAlgorithmAskedForIsInvalid) {
  Describe();
  cublasLtMatrixLayout_t l = Layout(CUDA_R_32F, 4, 4, 4);
  ASSERT_EQ(Heuristic(l, l, l), CUBLAS_STATUS_SUCCESS);
  ASSERT_GT(result_.workspaceSize, 0u);
  float* x = Device(std::vector<float>(16, 1.0f));
  const float alpha = 1.0f, beta = 0.0f;
  EXPECT_EQ(cublasLtMatmul(handle_, desc_, &alpha, x, l, x, l, &beta, x, l, x, l, &result_.algo,
                           workspace_, result_.workspaceSize - 1, stream_),
            CUBLAS_STATUS_INVALID_VALUE);
}

// The heuristic picks kernels for operands as aligned as the preference says (256 bytes unless
// told less); a less aligned operand faults as "misaligned address" on a GPU.
TEST_F(CublasLtRulesTest, AnOperandLessAlignedThanPromisedFaults) {
  Describe();
  cublasLtMatrixLayout_t l = Layout(CUDA_R_32F, 4, 4, 4);
  ASSERT_EQ(Heuristic(l, l, l), CUBLAS_STATUS_SUCCESS);
  float* x = Device(std::vector<float>(20, 1.0f));
  const float alpha = 1.0f, beta = 0.0f;
  EXPECT_EQ(cublasLtMatmul(handle_, desc_, &alpha, x + 1, l, x, l, &beta, x, l, x, l, &result_.algo,
                           workspace_, kWorkspace, stream_),
            CUBLAS_STATUS_EXECUTION_FAILED);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("misaligned address: A is 4-byte aligned"));
}

TEST_F(CublasLtRulesTest, ABiasVectorLessThan16ByteAlignedFaults) {
  Describe();
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  float* x = Device(std::vector<float>(20, 1.0f));
  const float* bias = x + 1;
  ASSERT_EQ(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
      CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l = Layout(CUDA_R_32F, 4, 4, 4);
  ASSERT_EQ(Heuristic(l, l, l), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  EXPECT_EQ(cublasLtMatmul(handle_, desc_, &alpha, x, l, x, l, &beta, x, l, x, l, &result_.algo,
                           workspace_, kWorkspace, stream_),
            CUBLAS_STATUS_EXECUTION_FAILED);
  ASSERT_EQ(Reports().size(), 1u);
  EXPECT_THAT(Reports()[0], HasSubstr("the bias vector is 4-byte aligned"));
}

}  // namespace
}  // namespace nf::emu
