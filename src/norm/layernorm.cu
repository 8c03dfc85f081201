// layernorm's CUDA launcher: the normalization kernels (norm_kernel.cuh) with centering.
#include "norm/norm_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void layernorm_cuda(const NormParams& p, DType act, DType affine, bool vector_ok,
                    cudaStream_t stream) {
  launch_norm<false, true>("layernorm", p, act, affine, vector_ok, stream);
}

}  // namespace llmk::detail
