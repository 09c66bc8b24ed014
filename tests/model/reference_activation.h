// The FFN activations of docs/design.md section 4 and their derivatives in float64, for the
// reference models (reference_model.h, reference_layer.h).
#pragma once

#include <cmath>

#include "model/model_config.pb.h"

namespace nf::testing {

inline double ReferenceActivation(model::ModelConfig::Activation activation, double v) {
  switch (activation) {
    case model::ModelConfig::GELU_TANH:
      return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case model::ModelConfig::RELU_SQUARED:
      return v > 0 ? v * v : 0.0;
    default:
      return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  }
}

inline double ReferenceActivationGrad(model::ModelConfig::Activation activation, double v) {
  switch (activation) {
    case model::ModelConfig::GELU_TANH: {
      const double a = std::sqrt(2.0 / M_PI), th = std::tanh(a * (v + 0.044715 * v * v * v));
      return 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * a * (1.0 + 3 * 0.044715 * v * v);
    }
    case model::ModelConfig::RELU_SQUARED:
      return v > 0 ? 2 * v : 0.0;
    default:
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
             v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
  }
}

}  // namespace nf::testing
