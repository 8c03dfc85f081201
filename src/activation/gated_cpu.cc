// CPU references of the gated activations: double math, one rounding per output. The
// oracle of the GPU tests and the host backend.
#include <cmath>

#include "activation/gated_launchers.h"
#include "common/host_types.h"

namespace llmk::detail {

namespace {

template <class T>
void forward_rows(const GatedParams& p, Activation act) {
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
void backward_rows(const GatedBackwardParams& p, Activation act) {
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

void gated_forward_cpu(const GatedParams& p, Activation act, DType dtype) {
  dispatch_dtype(dtype, "gated activation", [&](auto tag) { forward_rows<host_type_t<decltype(tag)>>(p, act); });
}

void gated_backward_cpu(const GatedBackwardParams& p, Activation act, DType dtype) {
  dispatch_dtype(dtype, "gated activation backward",
                 [&](auto tag) { backward_rows<host_type_t<decltype(tag)>>(p, act); });
}

}  // namespace llmk::detail
