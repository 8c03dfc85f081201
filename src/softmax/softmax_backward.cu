// Launcher of the softmax and log_softmax backward; its own translation unit so that the
// forward and backward instantiations compile in parallel.
#include "softmax/softmax_launch.cuh"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

void softmax_backward_cuda(const SoftmaxBackwardParams& p, bool log, DType dtype, bool vector_ok,
                           cudaStream_t stream) {
  launch_softmax(log ? "log_softmax_backward" : "softmax_backward", p, log, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
