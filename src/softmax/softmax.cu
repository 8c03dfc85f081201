// Launcher of the softmax and log_softmax forward.
#include "softmax/softmax_launch.cuh"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

void softmax_cuda(const SoftmaxParams& p, bool log, DType dtype, bool vector_ok, cudaStream_t stream) {
  launch_softmax(log ? "log_softmax" : "softmax", p, log, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
