// RMSNorm forward kernels, with an optional fused residual add (kAdd):
//   s   = kAdd ? round_T(x + residual) : x          (s is stored to residual_out if kAdd)
//   out = s * rsqrt(mean(s^2) + eps) * (offset + weight),  fp32 math, one rounding.
//
// Algorithm. One block per row (grid-strided over rows). The vector kernel keeps the whole
// row in registers: thread t holds VPT 16-byte vectors at columns (i * blockDim + t) * N,
// so each of the VPT loads is coalesced across the block. One pass reads the row, a block
// reduction gives sum(s^2), a second pass over the registers writes the output: the row is
// read from memory exactly once. The row stays in registers in its storage dtype (4
// registers per vector). The launcher picks VPT (and so the block size, d / (N * VPT)) that
// keeps the most threads resident per SM, from the compiled kernels' register counts; for
// a few rows (decode) it picks the most threads per row instead, for the shortest latency. The loop kernel serves rows that are not 16-byte aligned
// (or longer than the vector kernel holds): scalar accesses, a second read of the row from
// L1/L2.
//
// Roofline (bf16, rows x d): bytes = 2 * rows * d * 2 (+ 2 * rows * d * 2 with kAdd: read
// residual, write residual_out) + weight; FLOPs ~4 per element, so purely bandwidth bound.
// 8192 x 4096 bf16: 134 MB -> 44.7 us at the measured 3.0 TB/s copy rate.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/norm_params.h"

namespace llmk::detail {

template <class T, class W, int N, int VPT, bool kAdd>
__global__ void __launch_bounds__(512) rmsnorm_vec_kernel(RMSNormParams p) {
  // With few vectors per thread the weight is loaded with the row, before the reduction,
  // so that a lone row (decode) pays one memory round trip instead of two.
  constexpr bool kPrefetchWeight = VPT <= 4;
  const int d = static_cast<int>(p.d);
  const W* weight = static_cast<const W*>(p.weight);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    Vec<T, N> s[VPT];
    Vec<W, N> w[kPrefetchWeight ? VPT : 1];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < d) {
        s[i] = load_vec<T, N>(x + col);
        if constexpr (kPrefetchWeight) w[i] = load_vec<W, N>(weight + col);
        if constexpr (kAdd) {
          const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
          const Vec<T, N> r = load_vec<T, N>(res + col);
#pragma unroll
          for (int j = 0; j < N; ++j) s[i].v[j] = from_float<T>(to_float(s[i].v[j]) + to_float(r.v[j]));
          store_vec(static_cast<T*>(p.residual_out) + row * p.residual_out_stride + col, s[i]);
        }
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float v = to_float(s[i].v[j]);
          sum_sq += v * v;
        }
      }
    }
    const float r = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + p.eps);
    if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = r;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < d) {
        opaque(s[i]);
        Vec<W, N> wv;
        if constexpr (kPrefetchWeight) wv = w[i];
        else wv = load_vec<W, N>(weight + col);
        Vec<T, N> y;
#pragma unroll
        for (int j = 0; j < N; ++j)
          y.v[j] = from_float<T>(to_float(s[i].v[j]) * r * (p.offset + to_float(wv.v[j])));
        store_vec(out + col, y);
      }
    }
  }
}

template <class T, class W, bool kAdd>
__global__ void __launch_bounds__(512) rmsnorm_loop_kernel(RMSNormParams p) {
  const W* weight = static_cast<const W*>(p.weight);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    T* residual_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
    float sum_sq = 0.0f;
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      T s = x[col];
      if constexpr (kAdd) {
        const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
        s = from_float<T>(to_float(s) + to_float(res[col]));
        residual_out[col] = s;
      }
      const float v = to_float(s);
      sum_sq += v * v;
    }
    const float r = rsqrtf(block_sum(sum_sq) / static_cast<float>(p.d) + p.eps);
    if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = r;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    // Each thread revisits exactly the columns it read (and, with kAdd, wrote) above, so
    // in-place calls need no barrier between the two passes.
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      const float v = to_float(kAdd ? residual_out[col] : x[col]);
      out[col] = from_float<T>(v * r * (p.offset + to_float(weight[col])));
    }
  }
}

}  // namespace llmk::detail
