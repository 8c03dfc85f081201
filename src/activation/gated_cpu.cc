// CPU references of the gated activations: double math, one rounding per output. The
// oracle of the GPU tests and the host backend.
#include <cmath>

#include "activation/gated_launchers.h"
#include "common/host_types.h"

namespace llmk::detail {

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kAlpha = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kBeta = 0.044715;

// act(g) and act'(g).
void act_value_and_slope(GatedAct act, double g, double& v, double& slope) {
  switch (act) {
    case GatedAct::silu: {
      const double s = 1.0 / (1.0 + std::exp(-g));
      v = g * s;
      slope = s * (1.0 + g * (1.0 - s));
      return;
    }
    case GatedAct::gelu: {
      const double cdf = 0.5 * std::erfc(-g * kInvSqrt2);  // 1 + erf(z) cancels for z << 0
      v = g * cdf;
      slope = cdf + g * kInvSqrt2Pi * std::exp(-0.5 * g * g);
      return;
    }
    case GatedAct::gelu_tanh: {
      // 0.5 (1 + tanh(z)) as sigmoid(2z): 1 + tanh(z) cancels for z << 0.
      const double s = 1.0 / (1.0 + std::exp(-2.0 * kAlpha * (g + kBeta * g * g * g)));
      v = g * s;
      slope = s + 2.0 * g * s * (1.0 - s) * kAlpha * (1.0 + 3.0 * kBeta * g * g);
      return;
    }
  }
}

template <class T>
void forward_rows(const GatedParams& p, GatedAct act) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* gate = static_cast<const T*>(p.gate) + r * p.gate_stride;
    const T* up = static_cast<const T*>(p.up) + r * p.up_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t c = 0; c < p.d; ++c) {
      double v, slope;
      act_value_and_slope(act, to_float(gate[c]), v, slope);
      out[c] = from_float<T>(static_cast<float>(v * to_float(up[c])));
    }
  }
}

template <class T>
void backward_rows(const GatedBackwardParams& p, GatedAct act) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    const T* gate = static_cast<const T*>(p.gate) + r * p.gate_stride;
    const T* up = static_cast<const T*>(p.up) + r * p.up_stride;
    T* dgate = static_cast<T*>(p.dgate) + r * p.dgate_stride;
    T* dup = static_cast<T*>(p.dup) + r * p.dup_stride;
    for (int64_t c = 0; c < p.d; ++c) {
      double v, slope;
      act_value_and_slope(act, to_float(gate[c]), v, slope);
      const double dyc = to_float(dy[c]), upc = to_float(up[c]);  // read before the in-place writes
      dgate[c] = from_float<T>(static_cast<float>(dyc * upc * slope));
      dup[c] = from_float<T>(static_cast<float>(dyc * v));
    }
  }
}

}  // namespace

void gated_forward_cpu(const GatedParams& p, GatedAct act, DType dtype) {
  dispatch_dtype(dtype, "gated activation", [&](auto tag) { forward_rows<host_type_t<decltype(tag)>>(p, act); });
}

void gated_backward_cpu(const GatedBackwardParams& p, GatedAct act, DType dtype) {
  dispatch_dtype(dtype, "gated activation backward",
                 [&](auto tag) { backward_rows<host_type_t<decltype(tag)>>(p, act); });
}

}  // namespace llmk::detail
