// Helpers for numerical tests: random inputs, tensors from vectors, float64 comparisons,
// central finite differences, rounding constants and status checks. References in tests are
// written in double, independently of the kernels they check.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::testing {

// fp32 unit roundoff: the relative error of one rounding to fp32.
inline constexpr double kU32 = 0x1p-24;

// Unit roundoff of `dtype` (half an ulp, relative): the error of one rounding to it.
inline double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 0x1p-11;
    case DType::kBF16:
      return 0x1p-8;
    default:
      return kU32;
  }
}

// The largest |v[i]|, 0 for an empty vector.
inline double MaxAbs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Expects an InvalidArgument error whose message contains `mentions`.
inline void ExpectInvalidArgument(const absl::Status& status, const std::string& mentions) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(mentions)) << status;
}

// The same, and the message starts with "<op>: ".
inline void ExpectInvalidArgument(const absl::Status& status, const std::string& op,
                                  const std::string& mentions) {
  ExpectInvalidArgument(status, mentions);
  EXPECT_THAT(std::string(status.message()), ::testing::StartsWith(op + ": ")) << status;
}

// n uniform values in [lo, hi), reproducible from the seed.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

// A CPU tensor of dtype holding values (rounded to dtype); aborts the test on error.
inline Tensor MakeTensor(DType dtype, Shape shape, const std::vector<float>& values) {
  auto t = TensorFromFloats(dtype, std::move(shape), values);
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    std::abort();
  }
  return *std::move(t);
}

inline Tensor MakeZeros(DType dtype, Shape shape) {
  auto t = Tensor::HostZeros(dtype, std::move(shape));
  if (!t.ok()) {
    ADD_FAILURE() << t.status();
    std::abort();
  }
  return *std::move(t);
}

inline Tensor MakeIds(Shape shape, const std::vector<int32_t>& ids) {
  Tensor t = MakeZeros(DType::kI32, std::move(shape));
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

// The tensor's values as doubles (floating dtypes).
inline std::vector<double> ToDoubles(const Tensor& t) {
  if (t.dtype() == DType::kF64)
    return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
  auto floats = ToFloatVector(t);
  NF_EXPECT_OK(floats);
  return std::vector<double>(floats->begin(), floats->end());
}

// The values as they are after rounding to dtype (what a kernel actually reads).
inline std::vector<double> Rounded(DType dtype, const std::vector<float>& values) {
  return ToDoubles(MakeTensor(dtype, {static_cast<int64_t>(values.size())}, values));
}

// Expects |actual - expected| <= atol + rtol * |expected| elementwise, reporting the worst.
inline void ExpectAllClose(const std::vector<double>& actual, const std::vector<double>& expected,
                           double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0.0;
  size_t worst_index = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double excess = std::abs(actual[i] - expected[i]) - (atol + rtol * std::abs(expected[i]));
    if (!(excess <= worst) || std::isnan(actual[i]) != std::isnan(expected[i])) {
      worst = std::isnan(excess) ? INFINITY : excess;
      worst_index = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << worst_index << " is " << actual[worst_index]
                        << ", expected " << expected[worst_index] << " (atol " << atol << ", rtol "
                        << rtol << ")";
}

// Bitwise equality of two fp32 tensors (a fused op against the unfused ops it stands for).
inline void ExpectSameBits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  for (int64_t i = 0; i < actual.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(e[i]))
        << what << " [" << i << "]: " << a[i] << ", expected " << e[i];
  }
}

// d f / d x by central differences in double: (f(x + h) - f(x - h)) / 2h per coordinate.
inline std::vector<double> NumericGradient(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double h = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

}  // namespace nf::testing
