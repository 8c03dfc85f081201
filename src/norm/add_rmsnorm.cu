// add_rmsnorm's CUDA launcher: the normalization kernels (norm_kernel.cuh) with the fused
// residual add.
#include "norm/norm_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void add_rmsnorm_cuda(const NormParams& p, DType act, DType weight, bool vector_ok,
                      cudaStream_t stream) {
  launch_norm<true, false>("add_rmsnorm", p, act, weight, vector_ok, stream);
}

}  // namespace llmk::detail
