// Kernel parameter blocks of the gated activations, shared by the launchers, the kernels
// and the CPU references. The fused [..., 2d] form and the two-tensor form both reduce to
// a gate and an up pointer with their own row strides (fused: up = gate + d).
#pragma once

#include <cstdint>

#include "common/activation_math.h"

namespace llmk::detail {

// out = act(gate) * up over rows x d.
struct GatedParams {
  void* out;
  const void* gate;
  const void* up;
  int64_t rows;
  int64_t d;
  int64_t out_stride;
  int64_t gate_stride;
  int64_t up_stride;
};

// dgate = dy * up * act'(gate), dup = dy * act(gate).
struct GatedBackwardParams {
  void* dgate;
  void* dup;
  const void* dy;
  const void* gate;
  const void* up;
  int64_t rows;
  int64_t d;
  int64_t dgate_stride;
  int64_t dup_stride;
  int64_t dy_stride;
  int64_t gate_stride;
  int64_t up_stride;
};

}  // namespace llmk::detail
