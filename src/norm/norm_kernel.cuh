// Forward kernels of the normalization family: RMSNorm (kCentered = false, optionally
// with a fused residual add, kAdd, or a SiLU gate, kGate) and LayerNorm (kCentered = true):
//   s    = kAdd ? round_T(x + residual) : x         (s is stored to residual_out if kAdd)
//   mean = kCentered ? mean(s) : 0
//   rstd = rsqrt(mean((s - mean)^2) + eps)
//   out  = (s - mean) * rstd * (offset + weight) + bias   fp32 math, one rounding
//   kGate: out = s * rstd * (offset + weight) * silu(gate)  (gate read in the first pass
//   with the row when the weight is, so a decode-sized call still pays one round trip)
// (a missing weight counts as 1, a missing bias as 0).
//
// Algorithm. One block per row (grid-strided over rows); rows of at most 32 vectors share a
// block, blockDim.y rows of blockDim.x lanes each, reduced by shuffles within the row's
// lanes (RMSNorm over a 128-wide head, as Qwen3's q/k norm and Qwen3-Next's gated norm, was
// a 32-thread block with half its lanes idle). The vector kernel keeps the whole row in
// registers: thread t holds VPT 16-byte vectors at columns (i * blockDim + t) * N,
// so each of the VPT loads is coalesced across the block. One pass reads the row, block
// reductions give the statistics (LayerNorm: the mean first, then the centered sum of
// squares from registers, which is exact where E[x^2] - E[x]^2 would cancel), a second
// pass over the registers writes the output: the row is read from memory exactly once.
// The row stays in registers in its storage dtype (4 registers per vector). The launcher
// picks VPT (and so the block size, d / (N * VPT)) that keeps the most threads resident per
// SM, from the compiled kernels' register counts; for a few rows (decode) it picks the most
// threads per row instead, for the shortest latency. The loop kernel serves rows that are
// not 16-byte aligned (or longer than the vector kernel holds): scalar accesses, the row
// re-read from L1/L2.
//
// Roofline (bf16, rows x d): bytes = 2 * rows * d * 2 (+ 2 * rows * d * 2 with kAdd: read
// residual, write residual_out) + weight (+ bias); FLOPs ~4-6 per element, so purely
// bandwidth bound. 8192 x 4096 bf16: 134 MB -> 44.7 us at the measured 3.0 TB/s copy rate.
#pragma once

#include <cstdint>

#include "common/activation_math.cuh"
#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/norm_params.h"

namespace llmk::detail {

// Weight and bias of one column as the affine step uses them: scale = offset + w (w = 1
// when there is no weight), shift = b (0 when there is no bias).
template <class W>
__device__ __forceinline__ float norm_scale(float offset, bool has_weight, W w) {
  return offset + (has_weight ? to_float(w) : 1.0f);
}
template <class W>
__device__ __forceinline__ float norm_shift(bool has_bias, W b) {
  return has_bias ? to_float(b) : 0.0f;
}

__device__ __forceinline__ float silu(float g) { return ActivationMath<Activation::silu>::value(g); }

// A row's sum: over the row's lanes when a block may hold several short rows, else the block.
template <bool kShortRows>
__device__ __forceinline__ float norm_sum(float v) {
  if constexpr (kShortRows) return row_sum(v);
  else return block_sum(v);
}

template <class T, class W, int N, int VPT, bool kAdd, bool kCentered, bool kGate>
__global__ void __launch_bounds__(512) norm_vec_kernel(NormParams p) {
  ptx::pdl_start();
  // With few vectors per thread the weight is loaded with the row, before the reduction,
  // so that a lone row (decode) pays one memory round trip instead of two.
  constexpr bool kPrefetchWeight = VPT <= 4;
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  // RMSNorm always has a weight and never a bias: known at compile time, so its kernels
  // spend no registers or branches on the optional parameters of LayerNorm.
  const bool has_weight = !kCentered || weight != nullptr;
  const bool has_bias = kCentered && bias != nullptr;
  // VPT 1 serves short rows too: blockDim.y rows per block of blockDim.x <= 32 lanes each.
  // Larger VPT compile without that path (its reductions cost 16 registers at VPT 4).
  constexpr bool kShortRows = VPT == 1;
  const int rows_per_block = kShortRows ? blockDim.y : 1;
  for (int64_t row = int64_t{blockIdx.x} * rows_per_block + (kShortRows ? threadIdx.y : 0); row < p.rows;
       row += int64_t{gridDim.x} * rows_per_block) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    Vec<T, N> s[VPT];
    Vec<W, N> w[kPrefetchWeight ? VPT : 1];
    Vec<T, N> z[kGate && kPrefetchWeight ? VPT : 1];
    const T* gate = kGate ? static_cast<const T*>(p.gate) + row * p.gate_stride : nullptr;
    float sum_sq = 0.0f;  // RMSNorm: accumulated as the row arrives
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < d) {
        s[i] = load_vec<T, N>(x + col);
        if constexpr (kPrefetchWeight) {
          if (has_weight) w[i] = load_vec<W, N>(weight + col);
          if constexpr (kGate) z[i] = load_vec<T, N>(gate + col);
        }
        if constexpr (kAdd) {
          const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
          const Vec<T, N> rv = load_vec<T, N>(res + col);
#pragma unroll
          for (int j = 0; j < N; ++j) s[i].v[j] = from_float<T>(to_float(s[i].v[j]) + to_float(rv.v[j]));
          store_vec(static_cast<T*>(p.residual_out) + row * p.residual_out_stride + col, s[i]);
        }
        if constexpr (!kCentered)
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float v = to_float(s[i].v[j]);
            sum_sq += v * v;
          }
      }
    }
    float mean = 0.0f, r;
    if constexpr (kCentered) {
      // The mean first, then the centered sum of squares from registers: exact where
      // E[x^2] - E[x]^2 would cancel (rows far from zero, outliers).
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < d)
#pragma unroll
          for (int j = 0; j < N; ++j) sum += to_float(s[i].v[j]);
      }
      mean = norm_sum<kShortRows>(sum) * inv_d;
      float m2 = 0.0f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < d)
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float c = to_float(s[i].v[j]) - mean;
            m2 += c * c;
          }
      }
      r = rsqrtf(norm_sum<kShortRows>(m2) * inv_d + p.eps);
    } else {
      r = rsqrtf(norm_sum<kShortRows>(sum_sq) / static_cast<float>(d) + p.eps);
    }
    if (threadIdx.x == 0) {
      if (p.rstd != nullptr) p.rstd[row] = r;
      if constexpr (kCentered)
        if (p.mean != nullptr) p.mean[row] = mean;
    }
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < d) {
        opaque(s[i]);
        Vec<W, N> wv, bv;
        if (has_weight) {
          if constexpr (kPrefetchWeight) wv = w[i];
          else wv = load_vec<W, N>(weight + col);
        }
        if (has_bias) bv = load_vec<W, N>(bias + col);
        Vec<T, N> zv;
        if constexpr (kGate) {
          if constexpr (kPrefetchWeight) zv = z[i];
          else zv = load_vec<T, N>(gate + col);
        }
        Vec<T, N> y;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float v = to_float(s[i].v[j]);
          if constexpr (kCentered)
            y.v[j] = from_float<T>((v - mean) * r * norm_scale(p.offset, has_weight, wv.v[j]) +
                                   norm_shift(has_bias, bv.v[j]));
          else if constexpr (kGate)
            y.v[j] = from_float<T>(v * r * (p.offset + to_float(wv.v[j])) * silu(to_float(zv.v[j])));
          else
            y.v[j] = from_float<T>(v * r * (p.offset + to_float(wv.v[j])));
        }
        store_vec(out + col, y);
      }
    }
  }
}

// The streaming kernel: N-element vectors (N = 1: rows that are not 16-byte aligned),
// each thread striding over the row; the row is re-read for the output (and LayerNorm's
// centered pass) from L2, where it still is: a few rows per SM are in flight. It holds no
// row, so 32 registers and blocks of up to 1024 threads keep every SM full.
template <class T, class W, int N, bool kAdd, bool kCentered, bool kGate>
__global__ void __launch_bounds__(1024, 2) norm_loop_kernel(NormParams p) {
  ptx::pdl_start();
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  const bool has_weight = !kCentered || weight != nullptr;
  const bool has_bias = kCentered && bias != nullptr;
  const float inv_d = 1.0f / static_cast<float>(p.d);
  const int64_t vectors = p.d / N;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    T* residual_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
    const T* s_row = kAdd ? residual_out : x;  // the normalized input, for the later passes
    // Each thread revisits exactly the vectors it read (and, with kAdd, wrote) in the
    // first pass, so in-place calls need no barrier between the passes.
    float sum = 0.0f;  // of s (LayerNorm) or of s^2 (RMSNorm)
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      Vec<T, N> s = load_vec<T, N>(x + v * N);
      if constexpr (kAdd) {
        const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
        const Vec<T, N> r = load_vec<T, N>(res + v * N);
#pragma unroll
        for (int j = 0; j < N; ++j) s.v[j] = from_float<T>(to_float(s.v[j]) + to_float(r.v[j]));
        store_vec(residual_out + v * N, s);
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float f = to_float(s.v[j]);
        sum += kCentered ? f : f * f;
      }
    }
    float mean = 0.0f;
    if constexpr (kCentered) {  // a second pass (from L1/L2) for the centered sum of squares
      mean = block_sum(sum) * inv_d;
      sum = 0.0f;
#pragma unroll 4
      for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
        const Vec<T, N> s = load_vec<T, N>(s_row + v * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float c = to_float(s.v[j]) - mean;
          sum += c * c;
        }
      }
    }
    const float r = rsqrtf(block_sum(sum) * inv_d + p.eps);
    if (threadIdx.x == 0) {
      if (p.rstd != nullptr) p.rstd[row] = r;
      if constexpr (kCentered)
        if (p.mean != nullptr) p.mean[row] = mean;
    }
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    const T* gate = kGate ? static_cast<const T*>(p.gate) + row * p.gate_stride : nullptr;
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      const Vec<T, N> s = load_vec<T, N>(s_row + v * N);
      Vec<W, N> w, b;
      if (has_weight) w = load_vec<W, N>(weight + v * N);
      if (has_bias) b = load_vec<W, N>(bias + v * N);
      Vec<T, N> z;
      if constexpr (kGate) z = load_vec<T, N>(gate + v * N);
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float f = (to_float(s.v[j]) - mean) * r * norm_scale(p.offset, has_weight, w.v[j]) +
                  norm_shift(has_bias, b.v[j]);
        if constexpr (kGate) f *= silu(to_float(z.v[j]));
        y.v[j] = from_float<T>(f);
      }
      store_vec(out + v * N, y);
    }
  }
}

}  // namespace llmk::detail
