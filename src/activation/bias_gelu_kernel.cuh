// bias_gelu kernels: out = gelu(x + bias) and its backward, dx = dy * gelu'(x + bias) with
// the deterministic bias gradient dbias = sum over rows of dx.
//
// Algorithm. Forward: the gated activations' 2-d geometry (x over a row's 16-byte vectors,
// y over rows, grid-strided). Backward, one launch at every size: blocks of tx vectors x
// ty rows, gridDim.x column blocks, gridDim.y "splits" of the rows (the geometry and its
// reasons: bias_gelu_backward_geometry). Each thread owns the same columns in every row it
// visits and keeps their dbias sums in fp32 registers; the block adds its rows of sums in
// a fixed order (block_column_sums: a butterfly within warps, then the warps in order).
// - One split (up to 128 rows, or column blocks that fill the GPU by themselves): the
//   block saw every row of its columns and writes dbias. 16 rows: 16 x 16 blocks, one row
//   per thread, 24 blocks at d = 3072, 128 at d = 16384.
// - Splits > 1: each block writes its fp32 sums to partial row blockIdx.y and counts itself
//   on its column block's arrival counter; the last to arrive adds the partial rows in a
//   fixed order and writes dbias ("last block done"; the launcher zeroes the counters).
//   The splits fill one wave (4 blocks of 256 per SM), each block >= 64 rows.
// The order of every addition depends only on the shape, dtype, alignment and device, so
// dbias is the same bits on every run. The bias vector is loaded once per thread. Two rows
// are loaded before either is stored (64 registers under __launch_bounds__(256, 4), no
// spills; the erf form wants 80 unbounded); four were slower (112-128 registers halved
// the resident threads).
//
// Roofline (bf16, rows x d): forward reads x and writes out, 4 bytes per element; backward
// reads dy and x and writes dx, 6 bytes, plus splits * d * 8 bytes of partial sums written
// and read (at most 2.1% of the rows' traffic: 2048 x 3072, 22 splits: 0.54 MB against
// 38 MB; 8192 x 16384, 4 splits: 0.5 MB against 805 MB). ~20 FLOPs and one erfc/exp per
// element: bandwidth bound once the tanh form's sigmoid takes no IEEE division (~30 issued
// instructions per bf16 element, from ~40 with its Newton steps and slow-path branches).
// 8192 x 16384 backward: 805 MB, 270 us at the H100's 2.985 TB/s
// copy rate; 16 rows: latency (one launch, one DRAM round trip for dy and x, the block's
// sums, the stores of dx and dbias); split calls add a counter memset before the launch
// and the last block's re-read of the partial rows (L2) after the others finish.
#pragma once

#include <cstdint>

#include "activation/bias_gelu_params.h"
#include "activation/gated_kernel.cuh"
#include "common/activation_math.cuh"
#include "common/column_reduce.cuh"
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

// N fp32 column sums to global memory, 16 bytes at a time where N allows.
template <int N>
__device__ __forceinline__ void store_sums(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k)
      reinterpret_cast<float4*>(p)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = v[j];
  }
}

// acc += N fp32 sums another block stored (through L2: L1 is not coherent across SMs).
template <int N>
__device__ __forceinline__ void add_sums(float (&acc)[N], const float* p) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 s = __ldcg(reinterpret_cast<const float4*>(p) + k);
      acc[4 * k] += s.x;
      acc[4 * k + 1] += s.y;
      acc[4 * k + 2] += s.z;
      acc[4 * k + 3] += s.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] += __ldcg(p + j);
  }
}

template <class T, int N>
__device__ __forceinline__ void store_dbias(void* dbias, int64_t col, const float (&v)[N]) {
  Vec<T, N> out;
#pragma unroll
  for (int j = 0; j < N; ++j) out.v[j] = from_float<T>(v[j]);
  store_vec(static_cast<T*>(dbias) + col, out);
}

// Grid (column blocks, splits), block (tx vectors, ty rows): bias_gelu_backward_geometry.
template <class T, int N, Activation A>
__global__ void __launch_bounds__(256, kBiasGeluBlocksPerSm) bias_gelu_backward_kernel(BiasGeluBackwardParams p) {
  ptx::pdl_start();
  __shared__ float sums[256 * N];
  const GatedCursor c = gated_cursor<N>();
  const bool active = c.col < p.d;  // inactive threads still take part in the block's sums
  float db[N];
#pragma unroll
  for (int j = 0; j < N; ++j) db[j] = 0.0f;
  if (active) {
    const Vec<T, N> b = load_vec<T, N>(static_cast<const T*>(p.bias) + c.col);
    // Two rows per iteration, both loaded before either is stored. Without a second row
    // the first is loaded twice and its second copy left out: conditional loads kept
    // the absent row's registers alive across the iteration (12 bytes spilled in the loop).
    for (int64_t row = c.first; row < p.rows; row += 2 * c.step) {
      const bool second = row + c.step < p.rows;
      const int64_t rows[2] = {row, second ? row + c.step : row};
      Vec<T, N> dy[2], x[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        dy[k] = load_vec<T, N>(static_cast<const T*>(p.dy) + rows[k] * p.dy_stride + c.col);
        x[k] = load_vec<T, N>(static_cast<const T*>(p.x) + rows[k] * p.x_stride + c.col);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        Vec<T, N> dx;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float v, slope;
          ActivationMath<A>::value_and_slope(to_float(x[k].v[j]) + to_float(b.v[j]), v, slope);
          const float g = to_float(dy[k].v[j]) * slope;
          dx.v[j] = from_float<T>(g);
          if (k == 0 || second) db[j] += g;
        }
        // In place (dx = x or dy) is safe: each thread reads its elements first.
        if (k == 0 || second) store_vec(static_cast<T*>(p.dx) + rows[k] * p.dx_stride + c.col, dx);
      }
    }
  }
  block_column_sums(db, sums);  // the block's rows, in a fixed order, in threadIdx.y == 0
  if (gridDim.y == 1) {         // the block saw every row: its sums are the bias gradient
    if (threadIdx.y == 0 && active) store_dbias<T>(p.dbias, c.col, db);
    return;
  }
  if (threadIdx.y == 0 && active) store_sums(p.partial + blockIdx.y * p.d + c.col, db);
  if (!arrive_last(p.arrivals + blockIdx.x, gridDim.y)) return;
  // The last block of this column block adds its partial rows in a fixed order: row
  // threadIdx.y, + ty, ... per thread, then the threads' sums as above. Which block is
  // last does not change the order, so dbias is the same bits on every run.
#pragma unroll
  for (int j = 0; j < N; ++j) db[j] = 0.0f;
  if (active)
    for (unsigned r = threadIdx.y; r < gridDim.y; r += blockDim.y) add_sums(db, p.partial + r * p.d + c.col);
  block_column_sums(db, sums);
  if (threadIdx.y == 0 && active) store_dbias<T>(p.dbias, c.col, db);
}

}  // namespace llmk::detail
