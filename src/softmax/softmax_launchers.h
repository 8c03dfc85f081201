// The softmax family's CUDA launchers and CPU references, called by softmax_api.cc after
// the arguments are validated. kLog selects log_softmax. `vector_ok`: every pointer and
// row stride is 16-byte aligned and n is a multiple of the 16-byte vector.
#pragma once

#include <cuda_runtime_api.h>

#include "llmk/dtype.h"
#include "softmax/softmax_params.h"

namespace llmk::detail {

void softmax_cuda(const SoftmaxParams& p, bool log, DType dtype, bool vector_ok, cudaStream_t stream);
void softmax_backward_cuda(const SoftmaxBackwardParams& p, bool log, DType dtype, bool vector_ok,
                           cudaStream_t stream);

void softmax_cpu(const SoftmaxParams& p, bool log, DType dtype);
void softmax_backward_cpu(const SoftmaxBackwardParams& p, bool log, DType dtype);

}  // namespace llmk::detail
