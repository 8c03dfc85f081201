// rmsnorm's CUDA launcher: the normalization kernels (norm_kernel.cuh) without centering.
#include "norm/norm_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void rmsnorm_cuda(const NormParams& p, DType act, DType weight, bool vector_ok,
                  cudaStream_t stream) {
  launch_norm<false, false>("rmsnorm", p, act, weight, vector_ok, stream);
}

}  // namespace llmk::detail
