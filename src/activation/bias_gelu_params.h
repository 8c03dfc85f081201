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
  float* partial;          // workspace [partial rows, d]: one row per gridDim.y row of blocks
  int64_t rows;
  int64_t d;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t x_stride;
};

// Partial-sum rows of the backward for blocks of `rows_per_block` rows on a device with
// `sm_count` SMs: a row of blocks per block of rows, at most 4 per SM (each partial row is
// d floats written and read again). One partial row means the kernel writes dbias itself
// (no reduction launch).
inline int64_t bias_gelu_partial_rows(int64_t rows, int64_t rows_per_block, int sm_count) {
  const int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  const int64_t cap = int64_t{4} * sm_count;
  return wanted < 1 ? 1 : wanted > cap ? cap : wanted;
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
