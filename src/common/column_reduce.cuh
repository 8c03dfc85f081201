// The last step of every deterministic parameter gradient (dweight, dbias): partial sums
// [blocks, d] in f32, one row per block of the main kernel, added up per column in a
// fixed order.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"
#include "common/pdl_launch.h"
#include "common/ptx.cuh"

namespace llmk::detail {

// out[col] = sum over b < blocks of partial[b, col], in a fixed order. Block (32, 16): x
// picks the column, y a strided subset of partial rows; the 16 subtotals are added in order.
template <class W>
__global__ void __launch_bounds__(512) column_reduce_kernel(const float* partial, W* out,
                                                            int64_t blocks, int64_t d) {
  ptx::pdl_start();
  __shared__ float subtotal[16][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < d)
    for (int64_t b = threadIdx.y; b < blocks; b += 16) acc += partial[b * d + col];
  subtotal[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < 16; ++y) total += subtotal[y][threadIdx.x];
    out[col] = from_float<W>(total);
  }
}

template <class W>
void launch_column_reduce(const float* partial, W* out, int64_t blocks, int64_t d, cudaStream_t stream) {
  launch_pdl(column_reduce_kernel<W>, dim3(static_cast<unsigned>((d + 31) / 32)), dim3(32, 16), 0, stream, partial, out,
             blocks, d);
}

}  // namespace llmk::detail
