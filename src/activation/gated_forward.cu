// Launcher of the gated activation forward (silu_and_mul, gelu_and_mul, swiglu, geglu); its own
// translation unit so that the forward and backward instantiations compile in parallel.
#include "activation/gated_launch.cuh"
#include "activation/gated_launchers.h"

namespace llmk::detail {

void gated_forward_cuda(const GatedParams& p, Activation act, DType dtype, bool vector_ok,
                        cudaStream_t stream) {
  launch_gated("gated_forward_kernel", p, act, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
