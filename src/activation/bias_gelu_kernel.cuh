// bias_gelu kernels: out = gelu(x + bias) and its backward, dx = dy * gelu'(x + bias) with
// the deterministic bias gradient dbias = sum over rows of dx.
//
// Algorithm. The gated activations' 2-d geometry (x over a row's 16-byte vectors, y over
// rows, grid-strided): each thread owns the same columns in every row it visits, so the
// backward keeps its columns' dbias sums in fp32 registers across rows, the block adds its
// threadIdx.y rows of sums in a fixed order in shared memory and writes one partial row per
// gridDim.y row of blocks; column_reduce_kernel adds the partial rows in a fixed order
// (with one row of blocks, the kernel writes dbias itself: decode-sized calls are one
// launch). The bias vector is loaded once per thread. Two rows are loaded before either is
// stored (62-64 registers: the 57-register one-row kernel's occupancy); four measured
// slower (112-128 registers halved the resident threads: 416 vs 319 us at 8192 x 16384).
//
// Roofline (bf16, rows x d): forward reads x and writes out, 4 bytes per element; backward
// reads dy and x and writes dx, 6 bytes, plus partial_rows * d * 4 bytes of partial sums
// written and read (4 * 132 rows: 3% at 8192 rows). ~20 FLOPs and one erfc/exp per element:
// bandwidth bound. 8192 x 14336 bf16 forward: 470 MB, 157 us at 3.0 TB/s; backward 705 MB.
#pragma once

#include <cstdint>

#include "activation/bias_gelu_params.h"
#include "activation/gated_kernel.cuh"
#include "common/activation_math.cuh"
#include "common/ptx.cuh"
#include "common/vec.cuh"

namespace llmk::detail {

template <class T, int N, Activation A>
__global__ void __launch_bounds__(256) bias_gelu_forward_kernel(BiasGeluParams p) {
  ptx::pdl_start();
  const GatedCursor c = gated_cursor<N>();
  if (c.col >= p.d) return;
  const Vec<T, N> b = load_vec<T, N>(static_cast<const T*>(p.bias) + c.col);
  for (int64_t row = c.first; row < p.rows; row += c.step) {
    const Vec<T, N> x = load_vec<T, N>(static_cast<const T*>(p.x) + row * p.x_stride + c.col);
    Vec<T, N> y;
#pragma unroll
    for (int j = 0; j < N; ++j)
      y.v[j] = from_float<T>(ActivationMath<A>::value(to_float(x.v[j]) + to_float(b.v[j])));
    store_vec(static_cast<T*>(p.out) + row * p.out_stride + c.col, y);
  }
}

template <class T, int N, Activation A>
__global__ void __launch_bounds__(256) bias_gelu_backward_kernel(BiasGeluBackwardParams p) {
  ptx::pdl_start();
  __shared__ float sums[256 * N];  // [threadIdx.y][threadIdx.x * N + j]
  const GatedCursor c = gated_cursor<N>();
  float db[N];
#pragma unroll
  for (int j = 0; j < N; ++j) db[j] = 0.0f;
  if (c.col < p.d) {
    const Vec<T, N> b = load_vec<T, N>(static_cast<const T*>(p.bias) + c.col);
    // Two rows per iteration, both loaded before either is stored.
    for (int64_t row = c.first; row < p.rows; row += 2 * c.step) {
      const bool second = row + c.step < p.rows;
      Vec<T, N> dy[2], x[2];
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (k == 0 || second) {
          dy[k] = load_vec<T, N>(static_cast<const T*>(p.dy) + (row + k * c.step) * p.dy_stride + c.col);
          x[k] = load_vec<T, N>(static_cast<const T*>(p.x) + (row + k * c.step) * p.x_stride + c.col);
        }
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (k == 0 || second) {
          Vec<T, N> dx;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            float v, slope;
            ActivationMath<A>::value_and_slope(to_float(x[k].v[j]) + to_float(b.v[j]), v, slope);
            const float g = to_float(dy[k].v[j]) * slope;
            dx.v[j] = from_float<T>(g);
            db[j] += g;
          }
          // In place (dx = x or dy) is safe: each thread reads its elements first.
          store_vec(static_cast<T*>(p.dx) + (row + k * c.step) * p.dx_stride + c.col, dx);
        }
    }
  }
  // The block's rows of sums, added in threadIdx.y order: one partial row per blockIdx.y.
#pragma unroll
  for (int j = 0; j < N; ++j) sums[(threadIdx.y * blockDim.x + threadIdx.x) * N + j] = db[j];
  __syncthreads();
  if (threadIdx.y == 0 && c.col < p.d) {
    float total[N];
#pragma unroll
    for (int j = 0; j < N; ++j) total[j] = 0.0f;
    for (unsigned y = 0; y < blockDim.y; ++y)
#pragma unroll
      for (int j = 0; j < N; ++j) total[j] += sums[(y * blockDim.x + threadIdx.x) * N + j];
    if (gridDim.y == 1) {  // the block's sums are the bias gradient
      Vec<T, N> out;
#pragma unroll
      for (int j = 0; j < N; ++j) out.v[j] = from_float<T>(total[j]);
      store_vec(static_cast<T*>(p.dbias) + c.col, out);
    } else {
      float* partial = p.partial + blockIdx.y * p.d + c.col;
#pragma unroll
      for (int j = 0; j < N; ++j) partial[j] = total[j];
    }
  }
}

}  // namespace llmk::detail
