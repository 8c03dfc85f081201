// RMSNorm backward kernels. With r = rsqrt(mean(x^2) + eps), w' = offset + weight, g = dy*w':
//   dx      = r * g - x * r^3 / d * sum_row(g * x)   (+ dresidual)
//   dweight = sum over rows of dy * x * r
//
// Algorithm. Vector path: a persistent grid of `blocks` blocks, block b taking rows b,
// b + blocks, ...; each thread owns the same columns in every row (16-byte vectors, as the
// forward), so it accumulates its share of dweight in registers across rows and writes it
// once to partial[b, :]. Per row: one pass loads x and dy, a paired block reduction gives
// sum(x^2) and sum(g*x), a second pass over the registers writes dx; two rows are in flight
// per block (when VPT <= 2) so that loads overlap reductions without more partial sums. Loop path (unaligned
// rows or rows too long for registers): a row kernel writes dx and stores r per row, then a
// column kernel sums dy*x*r over contiguous row chunks into partial. Both paths end with
// a column reduction of partial in a fixed order: dweight is deterministic.
//
// Roofline (bf16, rows x d): read dy and x, write dx = 3 * rows * d * 2 bytes (+ partial
// sums, blocks * d * 4 written and read). 8192 x 4096 bf16: 201 MB + 8.7 MB -> 70 us at
// 3.0 TB/s.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/norm_params.h"

namespace llmk::detail {

template <class T, class W, int N, int VPT>
__global__ void __launch_bounds__(512) rmsnorm_backward_vec_kernel(RMSNormBackwardParams p) {
  // Rows per iteration: two independent rows in flight per block when the registers allow,
  // so that one row's loads overlap the other's reduction.
  constexpr int R = VPT <= 2 ? 2 : 1;
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  const W* weight = static_cast<const W*>(p.weight);
  float dw[VPT][N];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) dw[i][j] = 0.0f;

  for (int64_t base = blockIdx.x; base < p.rows; base += int64_t{R} * gridDim.x) {
    Vec<T, N> xv[R][VPT], dyv[R][VPT];
    float sums[2 * R];  // per row: sum(x^2), sum(g * x)
#pragma unroll
    for (int k = 0; k < 2 * R; ++k) sums[k] = 0.0f;
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t row = base + q * int64_t{gridDim.x};
      if (row >= p.rows) break;
      const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
      const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < d) {
          xv[q][i] = load_vec<T, N>(x + col);
          dyv[q][i] = load_vec<T, N>(dy + col);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < d && base + q * int64_t{gridDim.x} < p.rows) {
          const Vec<W, N> w = load_vec<W, N>(weight + col);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xf = to_float(xv[q][i].v[j]);
            sums[2 * q] += xf * xf;
            sums[2 * q + 1] += to_float(dyv[q][i].v[j]) * (p.offset + to_float(w.v[j])) * xf;
          }
        }
      }
    block_sums(sums);
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t row = base + q * int64_t{gridDim.x};
      if (row >= p.rows) break;
      const float r = rsqrtf(sums[2 * q] * inv_d + p.eps);
      const float c = r * r * r * sums[2 * q + 1] * inv_d;
      T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
      const T* dres = p.dresidual == nullptr
                          ? nullptr
                          : static_cast<const T*>(p.dresidual) + row * p.dresidual_stride;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < d) {
          opaque(xv[q][i]);
          opaque(dyv[q][i]);
          const Vec<W, N> w = load_vec<W, N>(weight + col);
          Vec<T, N> extra;
          if (dres != nullptr) extra = load_vec<T, N>(dres + col);
          Vec<T, N> out;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xf = to_float(xv[q][i].v[j]);
            const float dyf = to_float(dyv[q][i].v[j]);
            float v = r * dyf * (p.offset + to_float(w.v[j])) - xf * c;
            if (dres != nullptr) v += to_float(extra.v[j]);
            out.v[j] = from_float<T>(v);
            dw[i][j] += dyf * xf * r;
          }
          store_vec(dx + col, out);
        }
      }
    }
  }
  // 16-byte stores: the block's whole partial row leaves through one SM, and scalar stores
  // (one 4-byte word per 32-byte sector) made that the slowest part of a one-row call.
  float* partial = p.partial + blockIdx.x * p.d;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
    if (col < d) {
#pragma unroll
      for (int j = 0; j < N; j += 4)
        *reinterpret_cast<float4*>(partial + col + j) = make_float4(dw[i][j], dw[i][j + 1], dw[i][j + 2], dw[i][j + 3]);
    }
  }
}

// Loop path, step 1: dx per row, and r per row into rstd ([rows] f32).
template <class T, class W>
__global__ void __launch_bounds__(512) rmsnorm_backward_loop_kernel(RMSNormBackwardParams p,
                                                                   float* rstd) {
  const W* weight = static_cast<const W*>(p.weight);
  const float inv_d = 1.0f / static_cast<float>(p.d);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    float sum_sq = 0.0f, sum_gx = 0.0f;
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      const float xf = to_float(x[col]);
      sum_sq += xf * xf;
      sum_gx += to_float(dy[col]) * (p.offset + to_float(weight[col])) * xf;
    }
    float sums[2] = {sum_sq, sum_gx};
    block_sums(sums);
    const float r = rsqrtf(sums[0] * inv_d + p.eps);
    const float c = r * r * r * sums[1] * inv_d;
    if (threadIdx.x == 0) rstd[row] = r;
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    const T* dres = p.dresidual == nullptr
                        ? nullptr
                        : static_cast<const T*>(p.dresidual) + row * p.dresidual_stride;
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      float v = r * to_float(dy[col]) * (p.offset + to_float(weight[col])) - to_float(x[col]) * c;
      if (dres != nullptr) v += to_float(dres[col]);
      dx[col] = from_float<T>(v);
    }
  }
}

// Loop path, step 2: partial[b, col] = sum over rows of chunk b of dy * x * r.
// Grid: (ceil(d / blockDim.x), blocks).
template <class T>
__global__ void rmsnorm_backward_columns_kernel(RMSNormBackwardParams p, const float* rstd) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= p.d) return;
  const int64_t chunk = (p.rows + p.blocks - 1) / p.blocks;
  const int64_t first = blockIdx.y * chunk;
  const int64_t last = first + chunk < p.rows ? first + chunk : p.rows;
  float acc = 0.0f;
  for (int64_t row = first; row < last; ++row) {
    const float xf = to_float(static_cast<const T*>(p.x)[row * p.x_stride + col]);
    const float dyf = to_float(static_cast<const T*>(p.dy)[row * p.dy_stride + col]);
    acc += dyf * xf * rstd[row];
  }
  p.partial[blockIdx.y * p.d + col] = acc;
}

// dweight[col] = sum over b of partial[b, col], in a fixed order. Block (32, 16): x picks
// the column, y a strided subset of partial rows; the 16 subtotals are added in order.
template <class W>
__global__ void __launch_bounds__(512) rmsnorm_dweight_reduce_kernel(RMSNormBackwardParams p) {
  __shared__ float subtotal[16][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < p.d)
    for (int64_t b = threadIdx.y; b < p.blocks; b += 16) acc += p.partial[b * p.d + col];
  subtotal[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.d) {
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < 16; ++y) total += subtotal[y][threadIdx.x];
    static_cast<W*>(p.dweight)[col] = from_float<W>(total);
  }
}

}  // namespace llmk::detail
