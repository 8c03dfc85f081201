// Launchers of the RMSNorm forward: rmsnorm (this file's instantiations: kAdd = false).
#include "norm/norm_launchers.h"
#include "norm/rmsnorm_launch.cuh"

namespace llmk::detail {

void rmsnorm_cuda(const RMSNormParams& p, DType act, DType weight, bool vector_ok,
                  cudaStream_t stream) {
  launch_rmsnorm<false>(p, act, weight, vector_ok, stream);
}

}  // namespace llmk::detail
