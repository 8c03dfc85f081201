// The gated activations' CUDA launchers and CPU references, called by activation_api.cc
// after the arguments are validated. `vector_ok`: every pointer and row stride is 16-byte
// aligned and d is a multiple of the 16-byte vector.
#pragma once

#include <cuda_runtime_api.h>

#include "activation/gated_params.h"
#include "llmk/dtype.h"

namespace llmk::detail {

void gated_forward_cuda(const GatedParams& p, Activation act, DType dtype, bool vector_ok,
                        cudaStream_t stream);
void gated_backward_cuda(const GatedBackwardParams& p, Activation act, DType dtype, bool vector_ok,
                         cudaStream_t stream);

void gated_forward_cpu(const GatedParams& p, Activation act, DType dtype);
void gated_backward_cpu(const GatedBackwardParams& p, Activation act, DType dtype);

}  // namespace llmk::detail
