// Backward kernels of the normalization family: RMSNorm (kCentered = false) and LayerNorm
// (kCentered = true). With mean = kCentered ? mean(x) : 0, r = rsqrt(mean((x - mean)^2) +
// eps), xhat = (x - mean) * r and g = dy * (offset + weight):
//   dx      = r * (g - [kCentered: mean(g)] - xhat * mean(g * xhat))   (+ dresidual)
//   dweight = sum over rows of dy * xhat,   dbias = sum over rows of dy   (LayerNorm)
// (for RMSNorm this is r * g - x * r^3 / d * sum(g * x)). kGate (rmsnorm_swiglu, whose
// forward is y * silu(z) with y the RMSNorm output): dy is the gradient of that product,
// the norm's gradient is dy * silu(z), recomputed from z in each pass, and
// dz = dy * y * silu'(z) is written beside dx.
//
// Algorithm. Vector path: a persistent grid of `blocks` blocks, block b taking rows b,
// b + blocks, ...; each thread owns the same columns in every row (16-byte vectors, as the
// forward), so it accumulates its share of dweight (and dbias) in registers across rows and
// writes it once to the partial rows of block b. Per row: one pass loads x and dy, block
// reductions give the row statistics (LayerNorm: the mean first), a second pass over the
// registers writes dx; two rows are in flight per block (when VPT <= 2) so that loads
// overlap reductions without more partial sums. Loop path (unaligned rows or rows too long
// for registers): a row kernel writes dx and stores mean and r per row, then a column
// kernel sums over contiguous row chunks into the partial rows. Both paths end with a
// column reduction of the partial rows in a fixed order: the gradients are deterministic.
//
// Roofline (bf16, rows x d): read dy and x, write dx = 3 * rows * d * 2 bytes (+ partial
// sums, blocks * d * 4 written and read, twice for LayerNorm). 8192 x 4096 bf16: 201 MB +
// 8.7 MB -> 70 us at 3.0 TB/s.
#pragma once

#include <cstdint>

#include "common/column_reduce.cuh"
#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/norm_kernel.cuh"
#include "norm/norm_params.h"

namespace llmk::detail {

// Where the partial sums and per-row statistics live in the workspace; `capacity` is the
// most partial rows a call may use (rmsnorm_backward_blocks).
struct NormWorkspace {
  float* dweight;  // [capacity, d]
  float* dbias;    // [capacity, d], LayerNorm only
  float* mean;     // [rows], loop path
  float* rstd;     // [rows], loop path
};

inline NormWorkspace norm_workspace(float* base, int64_t capacity, int64_t d, int64_t rows,
                                    bool centered) {
  float* stats = base + (centered ? 2 : 1) * capacity * d;
  return {base, centered ? base + capacity * d : nullptr, stats, stats + rows};
}

// Writes a thread's N accumulated column sums with 16-byte stores: a block's whole partial
// row leaves through one SM, and 4-byte stores (one word per 32-byte sector) made that the
// slowest part of a one-row call.
template <int N>
__device__ __forceinline__ void store_partial(float* dst, const float (&sums)[N]) {
#pragma unroll
  for (int j = 0; j < N; j += 4)
    *reinterpret_cast<float4*>(dst + j) = make_float4(sums[j], sums[j + 1], sums[j + 2], sums[j + 3]);
}

template <class T, class W, int N, int VPT, bool kCentered, bool kGate>
__global__ void __launch_bounds__(512) norm_backward_vec_kernel(NormBackwardParams p,
                                                                NormWorkspace ws) {
  ptx::pdl_start();
  constexpr int R = VPT <= 2 ? 2 : 1;          // rows in flight per iteration
  constexpr int K = kCentered ? 3 : 2;         // per row: sum xc^2, sum g*xc, (sum g)
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  const W* weight = static_cast<const W*>(p.weight);
  const bool has_weight = !kCentered || weight != nullptr;  // RMSNorm: always, at compile time
  float dw[VPT][N], db[kCentered ? VPT : 1][N];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) {
      dw[i][j] = 0.0f;
      if constexpr (kCentered) db[i][j] = 0.0f;
    }

  for (int64_t base = blockIdx.x; base < p.rows; base += int64_t{R} * gridDim.x) {
    Vec<T, N> xv[R][VPT], dyv[R][VPT], zv[R][kGate ? VPT : 1];
    bool valid[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t row = base + q * int64_t{gridDim.x};
      valid[q] = row < p.rows;
      const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
      const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (valid[q] && col < d) {
          xv[q][i] = load_vec<T, N>(x + col);
          dyv[q][i] = load_vec<T, N>(dy + col);
          if constexpr (kGate)
            zv[q][i] = load_vec<T, N>(static_cast<const T*>(p.gate) + row * p.gate_stride + col);
        }
      }
    }
    float mean[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      mean[q] = 0.0f;
      if constexpr (kCentered)
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
          if (valid[q] && col < d)
#pragma unroll
            for (int j = 0; j < N; ++j) mean[q] += to_float(xv[q][i].v[j]);
        }
    }
    if constexpr (kCentered) {
      block_sums(mean);
#pragma unroll
      for (int q = 0; q < R; ++q) mean[q] *= inv_d;
    }
    float sums[R * K];
#pragma unroll
    for (int k = 0; k < R * K; ++k) sums[k] = 0.0f;
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (valid[q] && col < d) {
          Vec<W, N> w{};
          if (has_weight) w = load_vec<W, N>(weight + col);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xc = to_float(xv[q][i].v[j]) - mean[q];
            float g = to_float(dyv[q][i].v[j]);
            if constexpr (kGate) g *= silu(to_float(zv[q][i].v[j]));
            g *= norm_scale(p.offset, has_weight, w.v[j]);
            sums[q * K] += xc * xc;
            sums[q * K + 1] += g * xc;
            if constexpr (kCentered) sums[q * K + 2] += g;
          }
        }
      }
    block_sums(sums);
#pragma unroll
    for (int q = 0; q < R; ++q) {
      if (!valid[q]) break;
      const int64_t row = base + q * int64_t{gridDim.x};
      const float r = rsqrtf(sums[q * K] * inv_d + p.eps);
      const float mean_gxhat = r * sums[q * K + 1] * inv_d;
      const float mean_g = kCentered ? sums[q * K + 2] * inv_d : 0.0f;
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
          Vec<W, N> w{};
          if (has_weight) w = load_vec<W, N>(weight + col);
          Vec<T, N> extra;
          if (dres != nullptr) extra = load_vec<T, N>(dres + col);
          Vec<T, N> out, dz;
          if constexpr (kGate) opaque(zv[q][i]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xhat = (to_float(xv[q][i].v[j]) - mean[q]) * r;
            const float scale = norm_scale(p.offset, has_weight, w.v[j]);
            float dyf = to_float(dyv[q][i].v[j]);
            if constexpr (kGate) {
              float act, slope;
              ActivationMath<Activation::silu>::value_and_slope(to_float(zv[q][i].v[j]), act, slope);
              dz.v[j] = from_float<T>(dyf * xhat * scale * slope);  // dy * y * silu'(z)
              dyf *= act;                                           // the norm's dy
            }
            const float g = dyf * scale;
            float v = r * (g - mean_g - xhat * mean_gxhat);
            if (dres != nullptr) v += to_float(extra.v[j]);
            out.v[j] = from_float<T>(v);
            dw[i][j] += dyf * xhat;
            if constexpr (kCentered) db[i][j] += dyf;
          }
          store_vec(dx + col, out);
          if constexpr (kGate) store_vec(static_cast<T*>(p.dgate) + row * p.dgate_stride + col, dz);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
    if (col < d) {
      store_partial(ws.dweight + blockIdx.x * p.d + col, dw[i]);
      if constexpr (kCentered) store_partial(ws.dbias + blockIdx.x * p.d + col, db[i]);
    }
  }
}

// Loop path, step 1: dx per row, and mean and r per row into the workspace.
template <class T, class W, bool kCentered, bool kGate>
__global__ void __launch_bounds__(512) norm_backward_loop_kernel(NormBackwardParams p,
                                                                 NormWorkspace ws) {
  ptx::pdl_start();
  const W* weight = static_cast<const W*>(p.weight);
  const float inv_d = 1.0f / static_cast<float>(p.d);
  auto scale = [&](int64_t col) {
    return norm_scale(p.offset, weight != nullptr, weight != nullptr ? weight[col] : W{});
  };
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* z = kGate ? static_cast<const T*>(p.gate) + row * p.gate_stride : nullptr;
    float mean = 0.0f;
    if constexpr (kCentered) {
      for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) mean += to_float(x[col]);
      mean = block_sum(mean) * inv_d;
    }
    float sums[3] = {0.0f, 0.0f, 0.0f};  // sum xc^2, sum g*xc, sum g
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      const float xc = to_float(x[col]) - mean;
      float g = to_float(dy[col]) * scale(col);
      if constexpr (kGate) g *= silu(to_float(z[col]));
      sums[0] += xc * xc;
      sums[1] += g * xc;
      sums[2] += g;
    }
    block_sums(sums);
    const float r = rsqrtf(sums[0] * inv_d + p.eps);
    const float mean_gxhat = r * sums[1] * inv_d;
    const float mean_g = kCentered ? sums[2] * inv_d : 0.0f;
    if (threadIdx.x == 0) {
      ws.mean[row] = mean;
      ws.rstd[row] = r;
    }
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    const T* dres = p.dresidual == nullptr
                        ? nullptr
                        : static_cast<const T*>(p.dresidual) + row * p.dresidual_stride;
    for (int64_t col = threadIdx.x; col < p.d; col += blockDim.x) {
      const float xhat = (to_float(x[col]) - mean) * r;
      float dyf = to_float(dy[col]);
      if constexpr (kGate) {
        float act, slope;
        ActivationMath<Activation::silu>::value_and_slope(to_float(z[col]), act, slope);
        static_cast<T*>(p.dgate)[row * p.dgate_stride + col] = from_float<T>(dyf * xhat * scale(col) * slope);
        dyf *= act;
      }
      float v = r * (dyf * scale(col) - mean_g - xhat * mean_gxhat);
      if (dres != nullptr) v += to_float(dres[col]);
      dx[col] = from_float<T>(v);
    }
  }
}

// Loop path, step 2: partial rows b of dweight (and dbias): sums over the rows of chunk b
// of dy * xhat (and dy). Grid: (ceil(d / blockDim.x), blocks).
template <class T, bool kCentered, bool kGate>
__global__ void norm_backward_columns_kernel(NormBackwardParams p, NormWorkspace ws) {
  ptx::pdl_start();
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= p.d) return;
  const int64_t chunk = (p.rows + p.blocks - 1) / p.blocks;
  const int64_t first = blockIdx.y * chunk;
  const int64_t last = first + chunk < p.rows ? first + chunk : p.rows;
  float dw = 0.0f, db = 0.0f;
  for (int64_t row = first; row < last; ++row) {
    const float xf = to_float(static_cast<const T*>(p.x)[row * p.x_stride + col]);
    float dyf = to_float(static_cast<const T*>(p.dy)[row * p.dy_stride + col]);
    if constexpr (kGate) dyf *= silu(to_float(static_cast<const T*>(p.gate)[row * p.gate_stride + col]));
    dw += dyf * (xf - ws.mean[row]) * ws.rstd[row];
    db += dyf;
  }
  ws.dweight[blockIdx.y * p.d + col] = dw;
  if constexpr (kCentered) ws.dbias[blockIdx.y * p.d + col] = db;
}

}  // namespace llmk::detail
