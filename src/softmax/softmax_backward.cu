// Launcher of the softmax and log_softmax backward: the sm_90 cluster kernel for long rows
// (softmax_cluster_launch.cuh has the rule), else the one-block-per-row kernels; its own
// translation unit so that the forward and backward instantiations compile in parallel.
#include "softmax/softmax_cluster_launch.cuh"
#include "softmax/softmax_launch.cuh"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

void softmax_backward_cuda(const SoftmaxBackwardParams& p, bool log, DType dtype, bool vector_ok,
                           cudaStream_t stream) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  if (!launch_softmax_cluster(op, p, log, dtype, vector_ok, stream))
    launch_softmax(op, p, log, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
