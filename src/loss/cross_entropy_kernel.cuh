// Cross-entropy over vocabulary logits, per row (token), with label smoothing, z-loss and
// the gradient written in the same call:
//   lse  = log sum_j exp(z_j)                                 z = logits in fp32, [rows, V]
//   loss = (1 - eps) (lse - z_t) + eps (lse - mean_j z_j) + z_loss lse^2     (0 if t ignored)
//   dlogits_j = grad_scale * (softmax_j (1 + 2 z_loss lse) - (1 - eps) [j == t] - eps / V)
//
// Algorithm. One block per row (grid-strided over rows), softmax's machinery with the
// scale fixed at 1 (common/softmax_rows.cuh): each thread folds its columns into a pair
// (max, sum of exp(z - max)) with one ex2.approx per element, formed from x - max (exact
// near the max), plus the plain sum of z when eps != 0; one block reduction merges the
// pairs and the sums. z_t is one broadcast load of the row's target column, issued before
// the reduction so that its latency hides behind the row. Thread 0 writes loss and lse.
//   - Without dlogits every row takes the loop kernel: one pass, the row read once,
//     whatever its length (registers would save nothing).
//   - With dlogits, rows that fit in registers (16-byte aligned, at most 16 vectors x 512
//     threads: 65536 bf16/f16 or 32768 f32 columns; vocab 32000 bf16 is VPT 8 x 500
//     threads) take cross_entropy_vec_kernel: read once, the gradient written from
//     registers. Longer rows (Llama 3's 128256, Gemma's 262144) take the loop kernel's
//     two-pass path: pass one the (max, sum), pass two re-reads the row and writes the
//     gradient. dlogits may be logits itself (Liger's trick: the backward then reads
//     nothing): each thread rewrites only the columns it read, after the reduction's
//     barriers, as softmax in place.
// Targets are int64 or int32. Out-of-range targets (not ignore_index, outside [0, V)) give
// that row a NaN loss and a NaN gradient; no element outside the row is read. A row that is
// entirely -inf with a valid target has loss +inf and lse -inf (its gradient is the target
// and smoothing terms alone: softmax of a fully masked row is 0, as in llmk::softmax).
//
// Roofline (bf16, rows x V; 12 bytes per row for target, loss, lse):
//   loss only:            read 2V bytes per row
//   gradient, registers:  read 2V, write 2V
//   gradient, two passes: read 2V, re-read 2V (from L2 when the rows in flight fit in it,
//                         else DRAM), write 2V
// 8192 x 128256 bf16 (2.10 GB of logits): loss only 700 us at 3.0 TB/s; with the gradient
// 4.20 GB (re-read from L2) to 6.30 GB (from DRAM): 1.40 to 2.10 ms. ~6 instructions and one
// ex2 per element per pass (2.1e9 ex2 over both passes: ~0.6 ms of SFU time on an H100's
// 132 x 16 ex2/clk): bandwidth bound, with less margin than softmax.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/softmax_rows.cuh"
#include "common/vec.cuh"
#include "loss/cross_entropy.h"

namespace llmk::detail {

// A row's target: its class t, whether the row is ignored, and whether t indexes the row.
struct RowTarget {
  int64_t t;
  bool ignored;
  bool in_range;
};

__device__ __forceinline__ RowTarget row_target(const CrossEntropyParams& p, int64_t row) {
  const int64_t t = p.target_i64 ? static_cast<const int64_t*>(p.target)[row]
                                 : static_cast<const int32_t*>(p.target)[row];
  const bool ignored = t == p.ignore_index;
  return {t, ignored, !ignored && t >= 0 && t < p.n};
}

// The logit of the row's target column (0 when it does not index the row: never read).
template <class T>
__device__ __forceinline__ float target_logit(const T* x, const RowTarget& tg) {
  return tg.in_range ? to_float(x[tg.t]) : 0.0f;
}

// The end of a row: from the row's (max, sum) pair, the sum of its z (when eps != 0) and
// z_t, thread 0 writes loss and lse; the rest is the row's gradient, grad(z_j, j == t).
template <class T>
struct CrossEntropyRow {
  SoftmaxOut<T, false> prob;
  float c_prob, c_smooth, c_target;
  bool zero;  // ignored row: gradient 0

  __device__ __forceinline__ CrossEntropyRow(const CrossEntropyParams& p, int64_t row, MaxSum ms,
                                             const RowScale<T>& sc, float sum_z, float zt,
                                             const RowTarget& tg)
      : prob(ms, sc), zero(tg.ignored) {
    const float eps = static_cast<float>(p.label_smoothing), z_loss = static_cast<float>(p.z_loss);
    const float log_sum = logf(ms.sum);  // -inf for a fully masked row
    const float lse = ms.max + log_sum;
    const bool masked = ms.sum == 0.0f;
    if (threadIdx.x == 0) {
      float loss = 0.0f;
      if (!tg.ignored) {
        if (!tg.in_range) {
          loss = NAN;
        } else if (masked) {
          loss = INFINITY;
        } else {
          // lse - z = (max - z) + log(sum): no cancellation of lse against z.
          if (eps != 1.0f) loss += (1.0f - eps) * ((ms.max - zt) + log_sum);
          if (eps != 0.0f) loss += eps * ((ms.max - sum_z / static_cast<float>(p.n)) + log_sum);
          if (z_loss != 0.0f) loss += z_loss * lse * lse;
        }
      }
      p.loss[row] = loss;
      p.lse[row] = lse;
    }
    const float g = static_cast<float>(p.grad_scale);
    c_prob = !tg.in_range && !tg.ignored ? NAN
             : masked                    ? 0.0f
             : z_loss != 0.0f            ? g * (1.0f + 2.0f * z_loss * lse)
                                         : g;
    c_smooth = g * eps / static_cast<float>(p.n);
    c_target = g * (1.0f - eps);
  }

  __device__ __forceinline__ float grad(float z, bool is_target) const {
    if (zero) return 0.0f;
    return fmaf(prob(z), c_prob, -(c_smooth + (is_target ? c_target : 0.0f)));
  }
};

// The sum of a vector's elements in fp32.
template <class T, int N>
__device__ __forceinline__ float vec_sum(const Vec<T, N>& v) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) s += to_float(v.v[j]);
  return s;
}

// The gradient of the N columns from `col` of a row whose target is t.
template <class T, int N, class Col>
__device__ __forceinline__ Vec<T, N> grad_vec(const CrossEntropyRow<T>& r, const Vec<T, N>& v, Col col, Col t) {
  Vec<T, N> g;
#pragma unroll
  for (int j = 0; j < N; ++j) g.v[j] = from_float<T>(r.grad(to_float(v.v[j]), col + j == t));
  return g;
}

// With dlogits, rows that fit in registers: read once. The launcher picks VPT and the block.
template <class T, int N, int VPT>
__global__ void __launch_bounds__(512) cross_entropy_vec_kernel(CrossEntropyParams p) {
  ptx::pdl_start();
  const int n = static_cast<int>(p.n);
  const RowScale<T> sc = RowScale<T>::unit();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
    const RowTarget tg = row_target(p, row);
    const float zt = target_logit(x, tg);
    Vec<T, N> s[VPT];
    const MaxSum own = load_row(x, n, s, sc);
    float sum_z = 0.0f;
    if (p.label_smoothing != 0.0)
#pragma unroll
      for (int i = 0; i < VPT; ++i)
        if (row_vec_col<N>(i) < n) sum_z += vec_sum(s[i]);
    const MaxSum ms = block_max_sum(own, sc, sum_z);
    // A one-warp block has no barrier in the reduction: order the z_t load before any
    // write of the gradient (dlogits may be logits).
    __syncwarp();
    const CrossEntropyRow<T> r(p, row, ms, sc, sum_z, zt, tg);
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
    const int t_col = tg.in_range ? static_cast<int>(tg.t) : -1;  // 32-bit compares per element
    // (softmax_vec_kernel's store loop; a shared helper taking a lambda cost the f32 softmax
    // kernel 6 registers, so each kernel writes its own.)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int col = row_vec_col<N>(i);
      if (col < n) {
        opaque(s[i]);
        store_vec(dl + col, grad_vec(r, s[i], col, t_col));
      }
    }
  }
}

// Every row without dlogits (one pass), and rows too long for registers or not 16-byte
// aligned with it (two passes). N = 16-byte vectors or 1 (unaligned rows).
template <class T, int N, bool kGrad>
__global__ void __launch_bounds__(512) cross_entropy_loop_kernel(CrossEntropyParams p) {
  ptx::pdl_start();
  const RowScale<T> sc = RowScale<T>::unit();
  const int64_t step = int64_t{blockDim.x} * N;
  const bool smoothing = p.label_smoothing != 0.0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
    const RowTarget tg = row_target(p, row);
    const float zt = target_logit(x, tg);
    MaxSum acc{-INFINITY, 0.0f};
    float sum_z = 0.0f;
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step) {
      const Vec<T, N> v = load_vec<T, N>(x + col);
      acc = fold(acc, v, sc);
      if (smoothing) sum_z += vec_sum(v);
    }
    const MaxSum ms = block_max_sum(acc, sc, sum_z);
    __syncwarp();  // as in the vec kernel: z_t is read before dlogits (maybe logits) is written
    const CrossEntropyRow<T> r(p, row, ms, sc, sum_z, zt, tg);
    if constexpr (kGrad) {
      T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
      for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step)
        store_vec(dl + col, grad_vec(r, load_vec<T, N>(x + col), col, tg.t));
    }
  }
}

}  // namespace llmk::detail
