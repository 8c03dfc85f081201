// layernorm_backward's CUDA launcher: the normalization backward (norm_backward_kernel.cuh)
// with centering.
#include "norm/norm_backward_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void layernorm_backward_cuda(const NormBackwardParams& p, DType act, DType affine,
                             bool vector_ok, cudaStream_t stream) {
  launch_norm_backward<true>("layernorm_backward", p, act, affine, vector_ok, stream);
}

int64_t layernorm_backward_workspace_elems(int64_t rows, int64_t d, int sm_count) {
  return norm_backward_workspace_elems(rows, d, true, sm_count);
}

}  // namespace llmk::detail
