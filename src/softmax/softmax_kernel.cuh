// Softmax / log-softmax forward kernels over rows [rows, n]:
//   y = exp(z) / sum exp(z)     or     y = z - log(sum exp(z)),     z = s x - max(s x).
//
// Algorithm. One block per row (grid-strided over rows). Each exponent is formed as
// z = (x - xe) * s, with xe the row's extreme input (its largest x for s >= 0, its smallest
// for s < 0, found as the max of the exact keys sign(s) x): x - xe is exact near the max
// (Sterbenz) and the product is rounded once, so z keeps a relative error of 2^-23 however
// large s x is. (s x - max(s x) rounds s x first, an absolute error of |s x| 2^-24 in every
// exponent: 6e-5 at |s x| = 1e3, and -3e-5 for the log_softmax of a single column.) The
// sums take one ex2.approx per term (a term's error weighs its size e^z: the sum keeps
// ~2 ulp); fp32 softmax outputs take expf (2 ulp, as torch.softmax). Each thread reduces
// its own elements to a pair (max key, sum of exp(z)), and the block merges the pairs in
// one reduction, rescaling each sum to the larger max (the online-softmax merge), so a row
// costs one block reduction instead of a max reduction followed by a sum reduction.
//   - softmax_vec_kernel keeps the row in registers (VPT 16-byte vectors per thread,
//     chosen like the normalization kernels' by common/row_shape.h): the row is read from
//     memory once. Over few rows (decode, sampling) the 16-bit softmax at VPT <= 2 keeps
//     each exponential from the sums' pass instead of the input (kKeepExps, below): one
//     ex2 per element, where a lone row's block waits on its SM's ex2 throughput.
//   - softmax_loop_kernel serves rows that do not fit (longer than 16 vectors x 512
//     threads: 65536 bf16 columns) or that are not 16-byte aligned (N = 1): a first pass
//     folds each chunk into the running (max, sum), the second re-reads the row and
//     writes y. (Measured and reverted: bounding the rows in flight to half the L2 so
//     that the re-read hits it, and unrolling the loops x4: slower or no faster.)
//   - On sm_90, long rows (at small batch, or past 16384 bf16 columns at any batch, up to
//     65535 rows and 65536 vectors) split each row over a thread-block cluster instead
//     (softmax_cluster_kernel.cuh, its dispatch rule in softmax_cluster_launch.cuh).
// Masked (-inf) entries contribute 0; a fully masked row gives zeros (log: -inf).
//
// Roofline (bf16, rows x n): read n, write n: 4 bytes per element (vector path), 6 with
// the loop path's second read when the row is not in L2. ~5 FLOPs and two ex2 per element
// (fp32 softmax: one ex2 and one expf, ~10 instructions, over 8 bytes): bandwidth bound.
// 8192 x 32000 bf16: 1.05 GB -> 350 us at 3.0 TB/s.
// (RowScale, MaxSum, fold, load_row and the block merges, which cross_entropy (src/loss/) shares,
// are in common/softmax_rows.cuh.)
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/softmax_rows.cuh"
#include "common/vec.cuh"
#include "softmax/softmax_params.h"

namespace llmk::detail {

// block_max_sum for the few-rows kernel (kKeepExps below: one block of at most 512 threads
// per row, registers free): both second levels fold the warps' values from shared memory
// (block_fold_16) instead of a second round of shuffles, and the two reductions alternate
// two slot arrays instead of ending on barriers. A fully masked row still runs the sum (of
// zeros), so that every thread passes both barriers.
template <class T>
__device__ __forceinline__ MaxSum block_max_sum_few_rows(MaxSum v, const RowScale<T>& sc) {
  __shared__ __align__(16) float max_slots[16], sum_slots[16];
  const float m = block_fold_16(max_slots, warp_max(v.max), -INFINITY, [](float a, float b) { return fmaxf(a, b); });
  const float own = m == -INFINITY ? 0.0f : rescaled(v.sum, v.max, m, sc);
  return {m, block_fold_16(sum_slots, warp_sum(own), 0.0f, [](float a, float b) { return a + b; })};
}

// Writes the outputs of this thread's VPT vectors of a register-resident row of n columns
// (load_row's), y_of the row's output function.
template <class T, int N, int VPT, bool kLog>
__device__ __forceinline__ void store_row(T* out, int n, Vec<T, N> (&s)[VPT], const SoftmaxOut<T, kLog>& y_of) {
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = row_vec_col<N>(i);
    if (col < n) {
      opaque(s[i]);
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(y_of(to_float(s[i].v[j])));
      store_vec(out + col, y);
    }
  }
}

// A thread's exponentials kept from the sums' pass (kKeepExps below): e[i][j] = exp(x - xe_t)
// for element j of vector i, xe_t the extreme input of the thread's own elements, 0 for
// vectors past the row's end and for a thread whose elements are all masked.
template <int N, int VPT>
struct ThreadExps {
  float e[VPT][N];
};

// Loads this thread's VPT vectors of a row of n columns and returns its pair, keeping each
// element's exp(x - xe_t) in `exps`.
template <class T, int N, int VPT>
__device__ __forceinline__ MaxSum load_row_exps(const T* x, int n, ThreadExps<N, VPT>& exps, const RowScale<T>& sc) {
  Vec<T, N> s[VPT];
  const float m = load_row_max_key(x, n, s, sc), xe = sc.extreme(m);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) {
      exps.e[i][j] = row_vec_col<N>(i) < n && m != -INFINITY ? sc.exp_term(to_float(s[i].v[j]), xe) : 0.0f;
      sum += exps.e[i][j];
    }
  return {m, sum};
}

// Writes softmax outputs from kept exponentials: exp(z) = exp(x - xe_t) * exp(xe_t - xe), one
// factor per thread (with 1 / sum folded in) instead of one exponential per element. A
// thread without elements in the row, and a fully masked row, write zeros.
template <class T, int N, int VPT>
__device__ __forceinline__ void store_row_exps(T* out, int n, const ThreadExps<N, VPT>& exps, MaxSum own, MaxSum row,
                                               const RowScale<T>& sc) {
  const float factor =
      own.sum == 0.0f ? 0.0f : __fdividef(sc.exp_term(sc.extreme(own.max), sc.extreme(row.max)), row.sum);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int col = row_vec_col<N>(i);
    if (col < n) {
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(exps.e[i][j] * factor);
      store_vec(out + col, y);
    }
  }
}

// kKeepExps (16-bit softmax, not log, at VPT <= 2: softmax_launch.cuh takes it for few rows)
// keeps each element's exponential from the sums' pass and scales it by one per-thread factor
// for the output: one ex2 per element instead of two. At one row of 4096 bf16 columns on one
// SM the second ex2 pass was ~250 of the kernel's cycles (16 ex2 a clock per SM); the kept
// values cost 8 registers per vector, which the many-row launches keep for occupancy.
// Error: two ex2.approx and an approximate division (__fdividef, 2 ulp; the sum is at most
// the row's length, far inside its range), ~6 ulp of fp32, far below bf16's and f16's output
// rounding (whose outputs already took the ex2.approx form).
template <class T, int VPT, bool kLog>
inline constexpr bool kSoftmaxCanKeepExps = !kLog && !std::is_same_v<T, float> && VPT <= 2;

// Blocks of 512 threads per SM the vector kernel is compiled for (0: no bound): VPT 4 (rows
// of 1025-2048 vectors, one block each) is held to the 40 registers of three blocks, which it
// had before the warp max became a redux (44 left free: two blocks).
template <int VPT>
constexpr int softmax_vec_min_blocks() {
  return VPT == 4 ? 3 : 0;
}

template <class T, int N, int VPT, bool kLog, bool kKeepExps = false>
__global__ void __launch_bounds__(512, softmax_vec_min_blocks<VPT>()) softmax_vec_kernel(SoftmaxParams p) {
  static_assert(!kKeepExps || kSoftmaxCanKeepExps<T, VPT, kLog>);
  // A block without a row exits before the wait, on a test that reads a field of each
  // 64-byte line of the parameter block (rows; sign, which is never 0): see
  // common/pdl_launch.h on the parameter block's first reads.
  if (blockIdx.x >= p.rows || p.sign == 0.0f) return;
  ptx::pdl_start();
  const int n = static_cast<int>(p.n);
  const RowScale<T> sc(p);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    if constexpr (kKeepExps) {
      ThreadExps<N, VPT> exps;
      const MaxSum own = load_row_exps(x, n, exps, sc);
      store_row_exps(out, n, exps, own, block_max_sum_few_rows(own, sc), sc);
    } else {
      Vec<T, N> s[VPT];
      const MaxSum own = load_row(x, n, s, sc);
      store_row(out, n, s, SoftmaxOut<T, kLog>(block_max_sum(own, sc), sc));
    }
  }
}

template <class T, int N, bool kLog>
__global__ void __launch_bounds__(512) softmax_loop_kernel(SoftmaxParams p) {
  ptx::pdl_start();
  const RowScale<T> sc(p);
  const int64_t step = int64_t{blockDim.x} * N;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step)
      acc = fold(acc, load_vec<T, N>(x + col), sc);
    // The block reduction's barriers also order every first-pass read before any write,
    // so out may be x; each thread then rewrites only the columns it read.
    const SoftmaxOut<T, kLog> y_of(block_max_sum(acc, sc), sc);
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    for (int64_t col = int64_t{threadIdx.x} * N; col < p.n; col += step) {
      const Vec<T, N> v = load_vec<T, N>(x + col);
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(y_of(to_float(v.v[j])));
      store_vec(out + col, y);
    }
  }
}

}  // namespace llmk::detail
