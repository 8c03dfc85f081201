// Launcher of the gated activation backward (silu_and_mul, gelu_and_mul, swiglu, geglu).
#include "activation/gated_launch.cuh"
#include "activation/gated_launchers.h"

namespace llmk::detail {

void gated_backward_cuda(const GatedBackwardParams& p, Activation act, DType dtype, bool vector_ok,
                         cudaStream_t stream) {
  launch_gated("gated_backward_kernel", p, act, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
