// The pointwise activations of the library, and their double-precision host math for the
// CPU references (the device math: activation_math.cuh).
#pragma once

#include <cmath>

namespace llmk::detail {

enum class Activation { silu, gelu, gelu_tanh };

inline constexpr double kActInvSqrt2 = 0.70710678118654752440;
inline constexpr double kActInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kActAlpha = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kActBeta = 0.044715;

// act(g) and act'(g).
inline void act_value_and_slope(Activation act, double g, double& v, double& slope) {
  v = slope = 0.0;
  switch (act) {
    case Activation::silu: {
      const double s = 1.0 / (1.0 + std::exp(-g));
      v = g * s;
      slope = s * (1.0 + g * (1.0 - s));
      return;
    }
    case Activation::gelu: {
      const double cdf = 0.5 * std::erfc(-g * kActInvSqrt2);  // 1 + erf(z) cancels for z << 0
      v = g * cdf;
      slope = cdf + g * kActInvSqrt2Pi * std::exp(-0.5 * g * g);
      return;
    }
    case Activation::gelu_tanh: {
      // 0.5 (1 + tanh(z)) as sigmoid(2z): 1 + tanh(z) cancels for z << 0.
      const double s = 1.0 / (1.0 + std::exp(-2.0 * kActAlpha * (g + kActBeta * g * g * g)));
      v = g * s;
      slope = s + 2.0 * g * s * (1.0 - s) * kActAlpha * (1.0 + 3.0 * kActBeta * g * g);
      return;
    }
  }
}

}  // namespace llmk::detail
