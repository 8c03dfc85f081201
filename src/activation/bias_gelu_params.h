// Kernel parameter blocks of bias_gelu, shared by the launchers, the kernels and the CPU
// reference. x and the outputs are [rows, d] with their own row strides; bias is [d].
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/activation_math.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// out = gelu(x + bias).
struct BiasGeluParams {
  void* out;
  const void* x;
  const void* bias;
  int64_t rows;
  int64_t d;
  int64_t out_stride;
  int64_t x_stride;
};

// dx = dy * gelu'(x + bias); dbias = sum over rows of dx (fp32), through `partial`.
struct BiasGeluBackwardParams {
  void* dx;
  void* dbias;             // [d], bias's dtype
  const void* dy;
  const void* x;
  const void* bias;
  float* partial;          // workspace [partial_rows, d]
  int64_t rows;
  int64_t d;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t x_stride;
  int64_t partial_rows;    // one per grid row of blocks
};

// Partial-sum rows of the backward on a device with `sm_count` SMs (the workspace holds
// partial_rows * d floats).
inline int64_t bias_gelu_partial_rows(int64_t rows, int sm_count) {
  const int64_t cap = int64_t{4} * sm_count;
  return rows < cap ? (rows > 0 ? rows : 1) : cap;
}

// `act`: Activation::gelu or gelu_tanh. `vector_ok`: 16-byte aligned rows and bias, d a
// multiple of the vector.
void bias_gelu_cuda(const BiasGeluParams& p, Activation act, DType dtype, bool vector_ok,
                    cudaStream_t stream);
void bias_gelu_backward_cuda(const BiasGeluBackwardParams& p, Activation act, DType dtype,
                             bool vector_ok, cudaStream_t stream);
void bias_gelu_cpu(const BiasGeluParams& p, Activation act, DType dtype);
void bias_gelu_backward_cpu(const BiasGeluBackwardParams& p, Activation act, DType dtype);

}  // namespace llmk::detail
