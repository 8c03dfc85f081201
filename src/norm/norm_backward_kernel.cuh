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
// Algorithm. Vector path: a persistent grid of `blocks` blocks (no more than are resident
// at once), block b taking rows b, b + blocks, ...; each thread owns the same columns in
// every row (16-byte vectors, as the forward), so it accumulates its share of dweight (and
// dbias) in registers across rows and writes it once to the partial rows of block b. Per
// row: one pass loads x and dy, block reductions give the row statistics (LayerNorm: the
// mean first, unless the forward's mean and rstd are given: then one reduction, of the sums
// of g and g * xc), a second pass over the registers writes dx; two rows are in flight per
// block (when VPT <= 2) so that loads overlap reductions without more partial sums. Warp
// path (LayerNorm over many rows of 33-128 vectors): one warp per row, one 16-warp block per
// SM, shuffle reductions, the column sums in per-warp slices of shared memory, one partial
// row per block (see norm_backward_warp_kernel). Loop path (unaligned rows or rows too
// long for registers): a row kernel writes dx and stores mean and r per row, then a column
// kernel sums over contiguous row chunks into the partial rows. Every path ends with a
// column reduction of the partial rows in a fixed order: the gradients are deterministic.
//
// Roofline (bf16, rows x d): read dy and x, write dx = 3 * rows * d * 2 bytes (+ partial
// sums, blocks * d * 4 bytes written and read, twice for LayerNorm). 8192 x 4096 bf16
// (LayerNorm, 264 blocks): 201 MB + 17 MB -> 73 us at 3.0 TB/s; 8192 x 1024 on the warp path
// (132 blocks): 50.3 MB + 2.2 MB -> 17.5 us (the vector path's 792-1056 partial rows there
// moved 13-17 MB of partial sums).
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

// R: rows in flight per block iteration (2 by default where VPT <= 2; LayerNorm and the
// gated form at VPT 1 take 1: 62 and 64 registers instead of 80 and 84 in bf16, two
// 512-thread blocks per SM instead of one, so one block's reductions overlap the other's
// loads).
template <class T, class W, int N, int VPT, bool kCentered, bool kGate, int R = (VPT <= 2 ? 2 : 1)>
__global__ void __launch_bounds__(512) norm_backward_vec_kernel(NormBackwardParams p,
                                                                NormWorkspace ws) {
  ptx::pdl_start();
  constexpr int K = kCentered ? 3 : 2;         // per row: sum xc^2, sum g*xc, (sum g)
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  const W* weight = static_cast<const W*>(p.weight);
  const bool has_weight = !kCentered || weight != nullptr;  // RMSNorm: always, at compile time
  const bool saved = kCentered && p.saved_mean != nullptr;  // the forward's mean and rstd
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
    float mean[R], rstd[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t row = base + q * int64_t{gridDim.x};
      valid[q] = row < p.rows;
      mean[q] = rstd[q] = 0.0f;
      if (saved && valid[q]) {
        mean[q] = p.saved_mean[row];
        rstd[q] = p.saved_rstd[row];
      }
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
    if (kCentered && !saved) {  // the same for every thread of the block: its barriers are safe
#pragma unroll
      for (int q = 0; q < R; ++q)
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
          if (valid[q] && col < d)
#pragma unroll
            for (int j = 0; j < N; ++j) mean[q] += to_float(xv[q][i].v[j]);
        }
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
          // LayerNorm: no fp32 copy of x kept from the mean's pass across its reduction.
          if constexpr (kCentered) opaque(xv[q][i]);
          const Vec<W, N> w = has_weight ? load_vec<W, N>(weight + col) : filled_vec<W, N>(1.0f);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xc = to_float(xv[q][i].v[j]) - mean[q];
            float g = to_float(dyv[q][i].v[j]);
            if constexpr (kGate) g *= silu(to_float(zv[q][i].v[j]));
            g *= p.offset + to_float(w.v[j]);
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
      const float r = saved ? rstd[q] : rsqrtf(sums[q * K] * inv_d + p.eps);
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
          const Vec<W, N> w = has_weight ? load_vec<W, N>(weight + col) : filled_vec<W, N>(1.0f);
          Vec<T, N> extra;
          if (dres != nullptr) extra = load_vec<T, N>(dres + col);
          Vec<T, N> out, dz;
          if constexpr (kGate) opaque(zv[q][i]);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float xhat = (to_float(xv[q][i].v[j]) - mean[q]) * r;
            const float scale = p.offset + to_float(w.v[j]);
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

// K warp sums in one butterfly pass (interleaved, so the shuffles' latencies overlap).
template <int K>
__device__ __forceinline__ void warp_sums(float (&v)[K]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], offset);
}

// Warp path (rows of 33..VPL * 32 vectors; no gate): one warp per row, a persistent grid
// of one block of kNormBackwardWarps warps per SM. Warp w of block b takes rows
// b * kNormBackwardWarps + w, then every (kNormBackwardWarps * gridDim.x)-th row. Each
// lane holds VPL vectors of x and dy at columns (i * 32 + lane) * N, the same in every
// row; the row statistics come from butterfly shuffles (no barrier). The lane adds its
// columns' dweight (and dbias) terms into its warp's slice of shared memory (dynamic:
// kNormBackwardWarps x [dweight, dbias] x VPL * 32 * N floats, up to 128 KB): in registers
// they were 64 floats per lane (157 registers at bf16 VPL 4, one 8-warp block per SM),
// and blocks of fewer warps mean more partial rows to write and reduce. At the end the
// block adds its warps' slices in warp order and writes one partial row: a fixed order
// for a given grid, so the gradients are deterministic.
inline constexpr int kNormBackwardWarps = 16;

template <int VPL, int N, bool kCentered>
constexpr int norm_backward_warp_smem_bytes() {
  return kNormBackwardWarps * (kCentered ? 2 : 1) * VPL * 32 * N * static_cast<int>(sizeof(float));
}

template <class T, class W, int N, int VPL, bool kCentered>
__global__ void __launch_bounds__(kNormBackwardWarps * 32) norm_backward_warp_kernel(NormBackwardParams p,
                                                                                    NormWorkspace ws) {
  ptx::pdl_start();
  constexpr int kStep = 32 * N;               // elements between a lane's vectors
  constexpr int kSlice = VPL * kStep;         // floats of one warp's column sums
  constexpr int K = kCentered ? 3 : 2;        // per row: sum xc^2, sum g*xc, (sum g)
  extern __shared__ __align__(16) float column_sums[];  // [warp][dweight, dbias][kSlice]
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  const int first = lane * N;
  auto in_row = [&](int i) { return first + i * kStep < d; };
  const W* weight = static_cast<const W*>(p.weight) + first;
  const bool has_weight = !kCentered || p.weight != nullptr;  // RMSNorm: always, at compile time
  const bool saved = kCentered && p.saved_mean != nullptr;  // the forward's mean and rstd
  float* dw_sums = column_sums + warp * (kCentered ? 2 : 1) * kSlice + first;  // this lane's columns
  float* db_sums = dw_sums + kSlice;
  // Only this lane ever touches its columns of its warp's slice: no barrier until the end.
#pragma unroll
  for (int i = 0; i < VPL; ++i)
    if (in_row(i))
#pragma unroll
      for (int j = 0; j < N; j += 4) {
        *reinterpret_cast<float4*>(dw_sums + i * kStep + j) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if constexpr (kCentered) *reinterpret_cast<float4*>(db_sums + i * kStep + j) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
  for (int64_t row = int64_t{blockIdx.x} * kNormBackwardWarps + warp; row < p.rows;
       row += int64_t{gridDim.x} * kNormBackwardWarps) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride + first;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride + first;
    Vec<T, N> xv[VPL], dyv[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (in_row(i)) {
        xv[i] = load_vec<T, N>(x + i * kStep);
        dyv[i] = load_vec<T, N>(dy + i * kStep);
      }
    float mean = 0.0f, saved_r = 0.0f;
    if (saved) {
      mean = p.saved_mean[row];
      saved_r = p.saved_rstd[row];
    } else if constexpr (kCentered) {
      mean = warp_sum(thread_row_sum(xv, in_row)) * inv_d;
    }
    float sums[K];
#pragma unroll
    for (int k = 0; k < K; ++k) sums[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (in_row(i)) {
        if constexpr (kCentered) opaque(xv[i]);  // no fp32 copy of x across the mean's reduction
        const Vec<W, N> w = has_weight ? load_vec<W, N>(weight + i * kStep) : filled_vec<W, N>(1.0f);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xc = to_float(xv[i].v[j]) - mean;
          const float g = to_float(dyv[i].v[j]) * (p.offset + to_float(w.v[j]));
          sums[0] += xc * xc;
          sums[1] += g * xc;
          if constexpr (kCentered) sums[2] += g;
        }
      }
    warp_sums(sums);
    const float r = saved ? saved_r : rsqrtf(sums[0] * inv_d + p.eps);
    const float mean_gxhat = r * sums[1] * inv_d;
    const float mean_g = kCentered ? sums[K - 1] * inv_d : 0.0f;
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride + first;
    const T* dres = p.dresidual == nullptr
                        ? nullptr
                        : static_cast<const T*>(p.dresidual) + row * p.dresidual_stride + first;
#pragma unroll
    for (int i = 0; i < VPL; ++i)
      if (in_row(i)) {
        opaque(xv[i]);
        opaque(dyv[i]);
        const Vec<W, N> w = has_weight ? load_vec<W, N>(weight + i * kStep) : filled_vec<W, N>(1.0f);
        Vec<T, N> extra;
        if (dres != nullptr) extra = load_vec<T, N>(dres + i * kStep);
        Vec<T, N> out;
#pragma unroll
        for (int j = 0; j < N; j += 4) {
          float4 dwv = *reinterpret_cast<const float4*>(dw_sums + i * kStep + j);
          float4 dbv = kCentered ? *reinterpret_cast<const float4*>(db_sums + i * kStep + j) : float4{};
          float* dw4 = &dwv.x;
          float* db4 = &dbv.x;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float xhat = (to_float(xv[i].v[j + k]) - mean) * r;
            const float dyf = to_float(dyv[i].v[j + k]);
            float v = r * (dyf * (p.offset + to_float(w.v[j + k])) - mean_g - xhat * mean_gxhat);
            if (dres != nullptr) v += to_float(extra.v[j + k]);
            out.v[j + k] = from_float<T>(v);
            dw4[k] += dyf * xhat;
            db4[k] += dyf;
          }
          *reinterpret_cast<float4*>(dw_sums + i * kStep + j) = dwv;
          if constexpr (kCentered) *reinterpret_cast<float4*>(db_sums + i * kStep + j) = dbv;
        }
        store_vec(dx + i * kStep, out);
      }
  }
  __syncthreads();
  // One partial row per block (two for LayerNorm): the warps' slices added in warp order.
#pragma unroll
  for (int part = 0; part < (kCentered ? 2 : 1); ++part) {
    float* partial_row = (part == 0 ? ws.dweight : ws.dbias) + blockIdx.x * p.d;
    for (int c = static_cast<int>(threadIdx.x) * 4; c < d; c += static_cast<int>(blockDim.x) * 4) {
      const float* slice = column_sums + part * kSlice + c;
      float4 total = *reinterpret_cast<const float4*>(slice);
#pragma unroll
      for (int w = 1; w < kNormBackwardWarps; ++w) {
        const float4 add = *reinterpret_cast<const float4*>(slice + w * (kCentered ? 2 : 1) * kSlice);
        total.x += add.x;
        total.y += add.y;
        total.z += add.z;
        total.w += add.w;
      }
      *reinterpret_cast<float4*>(partial_row + c) = total;
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
  const bool saved = kCentered && p.saved_mean != nullptr;  // the forward's mean and rstd
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* z = kGate ? static_cast<const T*>(p.gate) + row * p.gate_stride : nullptr;
    float mean = 0.0f;
    if (saved) {
      mean = p.saved_mean[row];
    } else if constexpr (kCentered) {
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
    const float r = saved ? p.saved_rstd[row] : rsqrtf(sums[0] * inv_d + p.eps);
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
