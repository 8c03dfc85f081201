// The last step of a deterministic parameter gradient (dweight, dbias): partial sums
// [blocks, d] in f32, one row per block of the main kernel, added up per column in a
// fixed order, by a second launch (column_reduce_kernel) or by the main kernel's last
// block of each column block (block_column_sums, arrive_last).
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

// One-launch column sums: the pieces with which a kernel adds its blocks' column sums
// itself, in a fixed order, instead of handing partial rows to column_reduce_kernel
// (bias_gelu_backward).

// Adds v (N columns per thread) over a block's threadIdx.y rows in a fixed order; the sums
// are in the threads of threadIdx.y == 0. blockDim.x is a power of two and the block whole
// warps; every thread calls it. smem: blockDim.x * blockDim.y * N floats (fewer suffice:
// one row of the block per warp). Within a warp (blockDim.x < 32) a butterfly over the
// lanes that share columns leaves every such lane the same bits, then the warps' sums are
// added in warp order.
template <int N>
__device__ __forceinline__ void block_column_sums(float (&v)[N], float* smem) {
  const unsigned tx = blockDim.x;
  for (unsigned offset = tx; offset < 32; offset *= 2)
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], offset);
  const unsigned rows_per_warp = tx < 32 ? 32 / tx : 1;
  const unsigned groups = blockDim.y / rows_per_warp;
  if (threadIdx.y % rows_per_warp == 0)
#pragma unroll
    for (int j = 0; j < N; ++j) smem[((threadIdx.y / rows_per_warp) * N + j) * tx + threadIdx.x] = v[j];
  __syncthreads();
  if (threadIdx.y == 0)
    for (unsigned g = 1; g < groups; ++g)
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] += smem[(g * N + j) * tx + threadIdx.x];
}

// "Last block done": every thread of a block calls it after its stores of partial sums;
// of the `blocks` blocks counting on `counter` (zero before the first arrives), it is true
// in every thread of the one that arrives last, which then sees the others' stores (read
// them through L2: __ldcg) and has set the counter back to zero.
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned blocks) {
  __shared__ bool last;
  __threadfence();  // this thread's partial sums are visible on the GPU before the arrival
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    last = atomicAdd(counter, 1u) == blocks - 1;
    if (last) *counter = 0;  // every block has arrived: none touches it again
  }
  __syncthreads();
  if (last) __threadfence();  // the other blocks' sums are read after their arrivals
  return last;
}

}  // namespace llmk::detail
