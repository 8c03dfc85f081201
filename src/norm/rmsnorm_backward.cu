// rmsnorm_backward's CUDA launcher: the normalization backward (norm_backward_kernel.cuh)
// without centering.
#include "norm/norm_backward_launch.cuh"
#include "norm/norm_launchers.h"

namespace llmk::detail {

void rmsnorm_backward_cuda(const NormBackwardParams& p, DType act, DType weight, bool vector_ok,
                           cudaStream_t stream) {
  launch_norm_backward<false>("rmsnorm_backward", p, act, weight, vector_ok, stream);
}

int64_t rmsnorm_backward_workspace_elems(int64_t rows, int64_t d, int sm_count) {
  return norm_backward_workspace_elems(rows, d, false, sm_count);
}

}  // namespace llmk::detail
