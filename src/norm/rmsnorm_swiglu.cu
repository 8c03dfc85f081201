// rmsnorm_swiglu's CUDA launchers: the normalization kernels (norm_kernel.cuh,
// norm_backward_kernel.cuh) without centering, with the SiLU gate.
#include "norm/norm_backward_launch.cuh"
#include "norm/norm_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void rmsnorm_swiglu_cuda(const NormParams& p, DType act, DType weight, bool vector_ok,
                         cudaStream_t stream) {
  launch_norm<false, false, true>("rmsnorm_swiglu", p, act, weight, vector_ok, stream);
}

void rmsnorm_swiglu_backward_cuda(const NormBackwardParams& p, DType act, DType weight,
                                  bool vector_ok, cudaStream_t stream) {
  launch_norm_backward<false, true>("rmsnorm_swiglu_backward", p, act, weight, vector_ok, stream);
}

}  // namespace llmk::detail
