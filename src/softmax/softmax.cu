// Launcher of the softmax and log_softmax forward: the sm_90 cluster kernel for long rows
// (softmax_cluster_launch.cuh has the rule), else the one-block-per-row kernels
// (softmax_launch.cuh).
#include "softmax/softmax_cluster_launch.cuh"
#include "softmax/softmax_launch.cuh"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

void softmax_cuda(const SoftmaxParams& p, bool log, DType dtype, bool vector_ok, cudaStream_t stream) {
  const char* op = log ? "log_softmax" : "softmax";
  if (!launch_softmax_cluster(op, p, log, dtype, vector_ok, stream))
    launch_softmax(op, p, log, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
