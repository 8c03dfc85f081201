// Softmax / log-softmax forward kernels over rows [rows, n]:
//   y = exp(s x - m) / sum exp(s x - m)     or     y = s x - m - log(sum exp(s x - m)).
//
// Algorithm. One block per row (grid-strided over rows). With u = s x in fp32, each
// exponent is exp2((u - m) * log2(e)): u - m is exact near the max (Sterbenz), so inputs of
// magnitude 1e4 keep full fp32 accuracy where x * s * log2(e) - m would not. Each thread reduces its own
// elements to a pair (max, sum of exp2(v - max)), and the block merges the pairs in one
// reduction, rescaling each sum to the larger max (the online-softmax merge), so a row
// costs one block reduction instead of a max reduction followed by a sum reduction.
//   - softmax_vec_kernel keeps the row in registers (VPT 16-byte vectors per thread,
//     chosen like the normalization kernels' by common/row_shape.h): the row is read from
//     memory once.
//   - softmax_loop_kernel serves rows that do not fit (longer than 16 vectors x 512
//     threads: 65536 bf16 columns) or that are not 16-byte aligned (N = 1): a first pass
//     folds each chunk into the running (max, sum), the second re-reads the row and
//     writes y. (Measured and reverted: bounding the rows in flight to half the L2 so
//     that the re-read hits it, and unrolling the loops x4: slower or no faster.)
// Masked (-inf) entries contribute 0; a fully masked row gives zeros (log: -inf).
//
// Roofline (bf16, rows x n): read n, write n: 4 bytes per element (vector path), 6 with
// the loop path's second read when the row is not in L2. ~5 FLOPs and one exp2 per element:
// bandwidth bound. 8192 x 32000 bf16: 1.05 GB -> 350 us at 3.0 TB/s.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "softmax/softmax_params.h"

namespace llmk::detail {

inline constexpr float kLog2e = 1.4426950408889634f;

// exp(d) as one ex2.approx (relative error ~2^-22, flushing results below 2^-126 to 0).
__device__ __forceinline__ float exp_e(float d) { return ptx::exp2_approx(d * kLog2e); }

// A partial softmax denominator: the max of a set of values and the sum of exp(v - max)
// over the set. Empty or fully masked sets are {-inf, 0}.
struct MaxSum {
  float max;
  float sum;
};

// Merges every thread's pair; all threads get the row's pair. The row max first (a cheap
// max reduction), then each thread rescales its own sum to it once and the block sums:
// one exp per thread instead of one per merge step. Every thread of the block calls it.
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v) {
  const float m = block_max(v.max);
  if (m == -INFINITY) return {m, 0.0f};  // the whole row is masked (uniform across the block)
  return {m, block_sum(v.sum * exp_e(v.max - m))};
}

// The output of one element from its scaled value u = s * x and the row's pair. A fully masked row (sum 0) gives 0 (softmax) or -inf (log_softmax).
template <bool kLog>
struct SoftmaxOut {
  float max, inv_sum, log_sum;
  bool masked;  // the row's sum is 0: every entry is -inf
  __device__ __forceinline__ explicit SoftmaxOut(MaxSum row)
      : max(row.max), inv_sum(1.0f / row.sum), log_sum(logf(row.sum)), masked(row.sum == 0.0f) {}
  __device__ __forceinline__ float operator()(float u) const {
    if constexpr (kLog) return masked ? -INFINITY : (u - max) - log_sum;
    else return masked ? 0.0f : exp_e(u - max) * inv_sum;
  }
};

// Folds a vector of values (scaled by `scale`) into a thread's running pair.
template <class T, int N>
__device__ __forceinline__ MaxSum fold(MaxSum acc, const Vec<T, N>& v, float scale) {
  float m = acc.max;
#pragma unroll
  for (int j = 0; j < N; ++j) m = fmaxf(m, to_float(v.v[j]) * scale);
  if (m == -INFINITY) return acc;
  float sum = acc.sum * exp_e(acc.max - m);
#pragma unroll
  for (int j = 0; j < N; ++j) sum += exp_e(to_float(v.v[j]) * scale - m);
  return {m, sum};
}

template <class T, int N, int VPT, bool kLog>
__global__ void __launch_bounds__(512) softmax_vec_kernel(SoftmaxParams p) {
  const int n = static_cast<int>(p.n);
  const float scale = p.scale;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    Vec<T, N> s[VPT];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < n) {
        s[i] = load_vec<T, N>(x + col);
#pragma unroll
        for (int j = 0; j < N; ++j) m = fmaxf(m, to_float(s[i].v[j]) * scale);
      }
    }
    float sum = 0.0f;
    if (m != -INFINITY)
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
        if (col < n)
#pragma unroll
          for (int j = 0; j < N; ++j) sum += exp_e(to_float(s[i].v[j]) * scale - m);
      }
    const SoftmaxOut<kLog> y_of(block_max_sum({m, sum}));
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
      if (col < n) {
        opaque(s[i]);
        Vec<T, N> y;
#pragma unroll
        for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(y_of(to_float(s[i].v[j]) * scale));
        store_vec(out + col, y);
      }
    }
  }
}

template <class T, int N, bool kLog>
__global__ void __launch_bounds__(512) softmax_loop_kernel(SoftmaxParams p) {
  const float scale = p.scale;
  const int64_t step = int64_t{blockDim.x} * N;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step)
      acc = fold(acc, load_vec<T, N>(x + col), scale);
    // The block reduction's barriers also order every first-pass read before any write,
    // so out may be x; each thread then rewrites only the columns it read.
    const SoftmaxOut<kLog> y_of(block_max_sum(acc));
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step) {
      const Vec<T, N> v = load_vec<T, N>(x + col);
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(y_of(to_float(v.v[j]) * scale));
      store_vec(out + col, y);
    }
  }
}

}  // namespace llmk::detail
