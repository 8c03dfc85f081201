// The row pieces of the softmax forward that cross_entropy (src/loss/) shares with the
// softmax family (src/softmax/softmax_kernel.cuh, whose header has the algorithm): the
// scale of a row and its exact exponents (RowScale), a partial (max key, sum of exp(z)) pair
// (MaxSum) and its merges across a warp or a block, a thread's register-resident row
// (load_row, row_vec_col), the fold of a vector into a running pair, and the output of one
// element from the row's pair (SoftmaxOut).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/softmax_params.h"
#include "common/vec.cuh"

namespace llmk::detail {

// The scale of a row of T and the exponents it gives. Keys sign(s) x order the entries as
// s x does, exactly; a max key m names the extreme input xe = sign(s) m of its set, and an
// input x has the exponent z = (x - xe) s <= 0 there.
template <class T>
struct RowScale {
  float scale, sign, scale_log2e;
  __device__ __forceinline__ explicit RowScale(const SoftmaxParams& p)
      : scale(p.scale), sign(p.sign), scale_log2e(p.scale_log2e) {}
  // s = 1 (cross_entropy's logits): z = x - max x, exact near the max.
  __device__ __forceinline__ static RowScale unit() { return RowScale(1.0f, 1.0f, 1.4426950408889634f); }
  __device__ __forceinline__ RowScale(float s, float sgn, float s_log2e) : scale(s), sign(sgn), scale_log2e(s_log2e) {}
  __device__ __forceinline__ float key(float x) const { return sign * x; }
  __device__ __forceinline__ float extreme(float m) const { return sign * m; }
  __device__ __forceinline__ float z(float x, float xe) const { return (x - xe) * scale; }
  // exp(z) as a term of a sum: one ex2.approx of (x - xe) s log2(e). Its relative error
  // (2 ulp + |z| 2^-24) is weighted by the term's size e^z, so the sum keeps ~2 ulp.
  __device__ __forceinline__ float exp_term(float x, float xe) const {
    return ptx::exp2_approx((x - xe) * scale_log2e);
  }
  // exp(z) as a softmax output: expf for fp32 (2 ulp, as torch.softmax); for bf16 and f16,
  // rounded to 2^-9 and 2^-12, the term's ex2.approx.
  __device__ __forceinline__ float exp_out(float x, float xe) const {
    if constexpr (std::is_same_v<T, float>) return expf(z(x, xe));
    else return exp_term(x, xe);
  }
};

// A partial softmax denominator: the max key of a set of values and the sum of exp(z)
// over the set. Empty or fully masked sets are {-inf, 0}.
struct MaxSum {
  float max;
  float sum;
};

// `sum`, a partial sum of max key a, rescaled to max key m >= a; an empty partial stays 0
// (also when s = 0, where its exponent would be -inf * 0).
template <class T>
__device__ __forceinline__ float rescaled(float sum, float a, float m, const RowScale<T>& sc) {
  return sum == 0.0f ? 0.0f : sum * sc.exp_term(sc.extreme(a), sc.extreme(m));
}

// Merges the pairs of a group of threads (max_of / sum_of: its max and sum reductions);
// every thread gets the merged pair. The max first (a cheap max reduction), then each
// thread rescales its own sum to it once and the group sums: one exp per thread instead of
// one per merge step.
template <class T, class MaxOf, class SumOf>
__device__ __forceinline__ MaxSum merged_max_sum(MaxSum v, const RowScale<T>& sc, MaxOf max_of, SumOf sum_of) {
  const float m = max_of(v.max);
  if (m == -INFINITY) return {m, 0.0f};  // every pair is empty (uniform across the group)
  return {m, sum_of(rescaled(v.sum, v.max, m, sc))};
}

// The block's pair from every thread's; every thread of the block calls it.
template <class T>
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, const RowScale<T>& sc) {
  return merged_max_sum(v, sc, [](float x) { return block_max(x); }, [](float x) { return block_sum(x); });
}

// The warp's pair from its 32 lanes' (a lane without one passes {-inf, 0}).
template <class T>
__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v, const RowScale<T>& sc) {
  return merged_max_sum(v, sc, [](float x) { return warp_max(x); }, [](float x) { return warp_sum(x); });
}

// As block_max_sum, and `extra` (each thread's partial of another row sum) becomes the
// block's total in the same reduction.
template <class T>
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, const RowScale<T>& sc, float& extra) {
  const float m = block_max(v.max);
  float sums[2] = {m == -INFINITY ? 0.0f : rescaled(v.sum, v.max, m, sc), extra};
  block_sums(sums);
  extra = sums[1];
  return {m, sums[0]};
}

// Column of the first element of vector i of this thread in a register-resident row.
template <int N>
__device__ __forceinline__ int row_vec_col(int i) {
  return (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * N;
}

// The running max key of a thread's vectors. 16-bit vectors compare pairs in their own type
// (max.bf16x2 / max.f16x2, min alike, which skip NaN as fmaxf does): the largest and the
// smallest input, exact, give the max key for either sign of the scale, at one instruction
// per element where converting each to fp32, scaling it by the sign and comparing took three
// (the bf16 kernels were near issue-bound; the pairs bring them closer to copy speed).
// kPairs = false keeps the per-element form: at VPT 16 (one block of 512
// threads per 65536-column row: sm_80, or rows the cluster kernel does not take) the pairs'
// two accumulators made the 16-bit softmax kernels spill 28-56 bytes.
template <class T, bool kPairs = true>
struct MaxKey {
  static constexpr bool kPacked = kPairs && !std::is_same_v<T, float>;
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  Pair hi{T(-INFINITY), T(-INFINITY)}, lo{T(INFINITY), T(INFINITY)};  // kPacked
  float m = -INFINITY;                                                // otherwise
  template <int N>
  __device__ __forceinline__ void add(const Vec<T, N>& v, const RowScale<T>& sc) {
    if constexpr (!kPacked) {
#pragma unroll
      for (int j = 0; j < N; ++j) m = fmaxf(m, sc.key(to_float(v.v[j])));
    } else {
#pragma unroll
      for (int j = 0; j < N / 2; ++j) {
        const Pair p = reinterpret_cast<const Pair*>(v.v)[j];
        hi = __hmax2(hi, p);
        lo = __hmin2(lo, p);
      }
    }
  }
  __device__ __forceinline__ float value(const RowScale<T>& sc) const {
    if constexpr (!kPacked) return m;
    else return sc.sign > 0.0f ? fmaxf(to_float(hi.x), to_float(hi.y)) : -fminf(to_float(lo.x), to_float(lo.y));
  }
};

// Loads this thread's VPT vectors of a row of n columns into registers (vectors past the
// row's end are left unset) and returns the thread's max key over them.
template <class T, int N, int VPT>
__device__ __forceinline__ float load_row_max_key(const T* x, int n, Vec<T, N> (&s)[VPT], const RowScale<T>& sc) {
  MaxKey<T, (VPT <= 8)> key;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    if (row_vec_col<N>(i) < n) {
      s[i] = load_vec<T, N>(x + row_vec_col<N>(i));
      key.add(s[i], sc);
    }
  return key.value(sc);
}

// As load_row_max_key, and returns the thread's pair over its vectors.
template <class T, int N, int VPT>
__device__ __forceinline__ MaxSum load_row(const T* x, int n, Vec<T, N> (&s)[VPT], const RowScale<T>& sc) {
  const float m = load_row_max_key(x, n, s, sc);
  float sum = 0.0f;
  const float xe = sc.extreme(m);
  if (m != -INFINITY)
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (row_vec_col<N>(i) < n)
#pragma unroll
        for (int j = 0; j < N; ++j) sum += sc.exp_term(to_float(s[i].v[j]), xe);
  return {m, sum};
}

// The output of one element from its input x and the row's pair. A fully masked row (sum
// 0) gives 0 (softmax) or -inf (log_softmax).
template <class T, bool kLog>
struct SoftmaxOut {
  RowScale<T> sc;
  float xe, inv_sum, log_sum;
  bool masked;  // the row's sum is 0: every entry is -inf
  __device__ __forceinline__ SoftmaxOut(MaxSum row, const RowScale<T>& scale)
      : sc(scale), xe(scale.extreme(row.max)), inv_sum(1.0f / row.sum), log_sum(logf(row.sum)),
        masked(row.sum == 0.0f) {}
  __device__ __forceinline__ float operator()(float x) const {
    if constexpr (kLog) return masked ? -INFINITY : sc.z(x, xe) - log_sum;
    else return masked ? 0.0f : sc.exp_out(x, xe) * inv_sum;
  }
};

// Folds a vector of inputs into a thread's running pair.
template <class T, int N>
__device__ __forceinline__ MaxSum fold(MaxSum acc, const Vec<T, N>& v, const RowScale<T>& sc) {
  float m = acc.max;
#pragma unroll
  for (int j = 0; j < N; ++j) m = fmaxf(m, sc.key(to_float(v.v[j])));
  if (m == -INFINITY) return acc;
  float sum = rescaled(acc.sum, acc.max, m, sc);
  const float xe = sc.extreme(m);
#pragma unroll
  for (int j = 0; j < N; ++j) sum += sc.exp_term(to_float(v.v[j]), xe);
  return {m, sum};
}

}  // namespace llmk::detail
