// Softmax / log-softmax backward kernels over rows [rows, n], from the forward's output y:
//   softmax:     dx = s * y * (dy - dot),       dot = sum(dy * y)
//   log_softmax: dx = s * (dy - exp(y) * dot),  dot = sum(dy)
//
// Algorithm. One block per row, one block sum per row. softmax_backward_vec_kernel holds
// the row's y and dy in registers (VPT <= 8 16-byte vectors of each per thread: rows up to
// 4096 vectors): each is read once. softmax_backward_loop_kernel (longer rows, or
// unaligned with N = 1) re-reads both on its second pass. At VPT 8 only one block fits
// per SM, with nothing to overlap its load phase, still faster than the loop kernel's two
// reads. On sm_90 long rows split over a thread-block cluster
// instead (softmax_backward_cluster_kernel in softmax_cluster_kernel.cuh, the rule in
// softmax_cluster_launch.cuh), with this file's row helpers.
//
// Roofline (bf16): read y and dy, write dx: 6 bytes per element; ~4 FLOPs (log: plus one
// exp): bandwidth bound. 8192 x 32000 bf16: 1.57 GB -> 524 us at 3.0 TB/s.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "softmax/softmax_kernel.cuh"
#include "softmax/softmax_params.h"

namespace llmk::detail {

// dot's summand and dx of one element.
template <bool kLog>
__device__ __forceinline__ float softmax_dot_term(float y, float dy) {
  return kLog ? dy : dy * y;
}
template <bool kLog>
__device__ __forceinline__ float softmax_dx(float y, float dy, float dot, float scale) {
  return kLog ? scale * (dy - __expf(y) * dot) : scale * y * (dy - dot);
}

// Loads this thread's VPT vectors of y and dy of a row of n columns into registers
// (row_vec_col's columns; vectors past the row's end are left unset) and returns the
// thread's part of dot.
template <class T, int N, int VPT, bool kLog>
__device__ __forceinline__ float load_backward_row(const T* y, const T* dy, int n, Vec<T, N> (&yv)[VPT],
                                                   Vec<T, N> (&dyv)[VPT]) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = row_vec_col<N>(i);
    if (col < n) {
      yv[i] = load_vec<T, N>(y + col);
      dyv[i] = load_vec<T, N>(dy + col);
#pragma unroll
      for (int j = 0; j < N; ++j) dot += softmax_dot_term<kLog>(to_float(yv[i].v[j]), to_float(dyv[i].v[j]));
    }
  }
  return dot;
}

// Writes dx of the thread's vectors (load_backward_row's) from the row's dot.
template <class T, int N, int VPT, bool kLog>
__device__ __forceinline__ void store_backward_row(T* dx, int n, Vec<T, N> (&yv)[VPT], Vec<T, N> (&dyv)[VPT],
                                                   float dot, float scale) {
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = row_vec_col<N>(i);
    if (col < n) {
      opaque(yv[i]);
      opaque(dyv[i]);
      Vec<T, N> g;
#pragma unroll
      for (int j = 0; j < N; ++j)
        g.v[j] = from_float<T>(softmax_dx<kLog>(to_float(yv[i].v[j]), to_float(dyv[i].v[j]), dot, scale));
      store_vec(dx + col, g);
    }
  }
}

template <class T, int N, int VPT, bool kLog>
__global__ void __launch_bounds__(512) softmax_backward_vec_kernel(SoftmaxBackwardParams p) {
  ptx::pdl_start();
  const int n = static_cast<int>(p.n);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    Vec<T, N> yv[VPT], dyv[VPT];
    const float dot = block_sum(load_backward_row<T, N, VPT, kLog>(static_cast<const T*>(p.y) + row * p.y_stride,
                                                                     static_cast<const T*>(p.dy) + row * p.dy_stride,
                                                                     n, yv, dyv));
    store_backward_row<T, N, VPT, kLog>(static_cast<T*>(p.dx) + row * p.dx_stride, n, yv, dyv, dot, p.scale);
  }
}

template <class T, int N, bool kLog>
__global__ void __launch_bounds__(512) softmax_backward_loop_kernel(SoftmaxBackwardParams p) {
  ptx::pdl_start();
  const int64_t step = int64_t{blockDim.x} * N;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* y = static_cast<const T*>(p.y) + row * p.y_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    float dot = 0.0f;
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step) {
      const Vec<T, N> yv = load_vec<T, N>(y + col), dyv = load_vec<T, N>(dy + col);
#pragma unroll
      for (int j = 0; j < N; ++j) dot += softmax_dot_term<kLog>(to_float(yv.v[j]), to_float(dyv.v[j]));
    }
    // The barriers of block_sum order the first pass's reads before any write (dx may be
    // dy or y); each thread then rewrites only the columns it read.
    dot = block_sum(dot);
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step) {
      const Vec<T, N> yv = load_vec<T, N>(y + col), dyv = load_vec<T, N>(dy + col);
      Vec<T, N> g;
#pragma unroll
      for (int j = 0; j < N; ++j)
        g.v[j] = from_float<T>(softmax_dx<kLog>(to_float(yv.v[j]), to_float(dyv.v[j]), dot, p.scale));
      store_vec(dx + col, g);
    }
  }
}

}  // namespace llmk::detail
