// The normalization family's CUDA launchers and CPU references, called by norm_api.cc after
// the arguments are validated. `affine` is the weight's (and bias's) dtype.
#pragma once

#include <cuda_runtime_api.h>

#include "llmk/tensor.h"
#include "norm/norm_params.h"

namespace llmk::detail {

void rmsnorm_cuda(const NormParams& p, DType act, DType weight, bool vector_ok, cudaStream_t stream);
void add_rmsnorm_cuda(const NormParams& p, DType act, DType weight, bool vector_ok,
                      cudaStream_t stream);
void layernorm_cuda(const NormParams& p, DType act, DType affine, bool vector_ok,
                    cudaStream_t stream);
// Gated RMSNorm (p.gate / p.dgate set); the backward uses rmsnorm's workspace size.
void rmsnorm_swiglu_cuda(const NormParams& p, DType act, DType weight, bool vector_ok,
                         cudaStream_t stream);
void rmsnorm_swiglu_backward_cuda(const NormBackwardParams& p, DType act, DType weight,
                                  bool vector_ok, cudaStream_t stream);
void rmsnorm_backward_cuda(const NormBackwardParams& p, DType act, DType weight, bool vector_ok,
                           cudaStream_t stream);
void layernorm_backward_cuda(const NormBackwardParams& p, DType act, DType affine,
                             bool vector_ok, cudaStream_t stream);
// f32 workspace elements of the backward on a device with `sm_count` SMs.
int64_t rmsnorm_backward_workspace_elems(int64_t rows, int64_t d, int sm_count);
int64_t layernorm_backward_workspace_elems(int64_t rows, int64_t d, int sm_count);

// CPU references (double accumulation); same parameter blocks, host pointers. rmsnorm's
// serve rmsnorm_swiglu too (p.gate / p.dgate set).
void rmsnorm_cpu(const NormParams& p, DType act, DType weight);
void add_rmsnorm_cpu(const NormParams& p, DType act, DType weight);
void layernorm_cpu(const NormParams& p, DType act, DType affine);
void rmsnorm_backward_cpu(const NormBackwardParams& p, DType act, DType weight);
void layernorm_backward_cpu(const NormBackwardParams& p, DType act, DType affine);

}  // namespace llmk::detail
