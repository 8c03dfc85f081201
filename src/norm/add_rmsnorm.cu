// Launchers of the fused residual add + RMSNorm (kAdd = true instantiations).
#include "norm/norm_launchers.h"
#include "norm/rmsnorm_launch.cuh"

namespace llmk::detail {

void add_rmsnorm_cuda(const RMSNormParams& p, DType act, DType weight, bool vector_ok,
                      cudaStream_t stream) {
  launch_rmsnorm<true>(p, act, weight, vector_ok, stream);
}

}  // namespace llmk::detail
