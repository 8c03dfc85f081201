// The RMSNorm family's CUDA launchers and CPU references, called by norm_api.cc after the
// arguments are validated.
#pragma once

#include <cuda_runtime_api.h>

#include "llmk/tensor.h"
#include "norm/norm_params.h"

namespace llmk::detail {

void rmsnorm_cuda(const RMSNormParams& p, DType act, DType weight, bool vector_ok,
                  cudaStream_t stream);
void add_rmsnorm_cuda(const RMSNormParams& p, DType act, DType weight, bool vector_ok,
                      cudaStream_t stream);
void rmsnorm_backward_cuda(const RMSNormBackwardParams& p, DType act, DType weight,
                           bool vector_ok, cudaStream_t stream);
// Partial sums the backward splits the rows into on a device with `sm_count` SMs.
int64_t rmsnorm_backward_blocks(int64_t rows, int sm_count);

// CPU references (double accumulation); same parameter blocks, host pointers.
void rmsnorm_cpu(const RMSNormParams& p, DType act, DType weight);
void add_rmsnorm_cpu(const RMSNormParams& p, DType act, DType weight);
void rmsnorm_backward_cpu(const RMSNormBackwardParams& p, DType act, DType weight);

}  // namespace llmk::detail
