// Warp and block reductions in fp32. block_sum / block_sums / block_max return the result to
// every thread; they use a small shared scratch and two barriers, so calls may follow one
// another.
#pragma once

#include <cmath>

namespace llmk::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The warp's largest v, in every lane: one redux.sync over the floats' order-preserving
// integer images (non-negative floats keep their bits, negative ones have the magnitude bits
// flipped) instead of five shuffle-and-compare steps, which a decode-sized row kernel (one
// block on one SM) waits on. Unlike fmaxf, a NaN with the sign bit clear is the largest value
// (one with it set the smallest): a row's NaN reaches its max, where it reached its sum before.
__device__ __forceinline__ float warp_max(float v) {
  const int bits = __float_as_int(v);
  const int image = __reduce_max_sync(0xffffffffu, bits >= 0 ? bits : bits ^ 0x7fffffff);
  return __int_as_float(image >= 0 ? image : image ^ 0x7fffffff);
}

// K sums in one pass over the block: each v[k] becomes the block's total of v[k].
// Every thread of the block must call it; blockDim.x is a multiple of 32.
template <int K>
__device__ __forceinline__ void block_sums(float (&v)[K]) {
  __shared__ float partial[32][K];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  if (warps == 1) return;
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k) partial[warp][k] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(lane < warps ? partial[lane][k] : 0.0f);
  __syncthreads();
}

__device__ __forceinline__ float block_sum(float v) {
  float sums[1] = {v};
  block_sums(sums);
  return sums[0];
}

// The sum over one row's threads: the whole block (blockDim.y == 1: block_sum, every
// thread of the block calls it), or the blockDim.x <= 32 lanes of a row group when a block
// holds blockDim.y short rows (only that group's lanes need to call it).
__device__ __forceinline__ float row_sum(float v) {
  if (blockDim.y == 1) return block_sum(v);
  const unsigned width = blockDim.x;
  const unsigned first_lane = (threadIdx.y * width) % 32;
  const unsigned mask = (width == 32 ? 0xffffffffu : ((1u << width) - 1u)) << first_lane;
  for (unsigned offset = width / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, width);
  return v;
}

// A reduction over a block of at most 512 threads for a kernel whose registers bound no
// occupancy (one block per row over few rows): warp w's value (lane 0's v, reduced over the
// warp by the caller) goes to slots[w], the slots past the last warp hold `identity`, and
// after one barrier every thread folds all 16 slots from four 16-byte broadcast loads in a
// tree: no second round of shuffles. No barrier follows: a caller alternates two slot arrays
// between consecutive reductions (each thread's reads of one array come before the barrier
// of the next reduction, which every thread passes before the array is written again).
template <class Op>
__device__ __forceinline__ float block_fold_16(float (&slots)[16], float v, float identity, Op op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) slots[warp] = v;
  if (warp == 0 && lane >= warps && lane < 16) slots[lane] = identity;
  __syncthreads();
  float4 q[4];
#pragma unroll
  for (int g = 0; g < 4; ++g) q[g] = reinterpret_cast<const float4*>(slots)[g];
  auto fold4 = [&](float4 a, float4 b) { return make_float4(op(a.x, b.x), op(a.y, b.y), op(a.z, b.z), op(a.w, b.w)); };
  const float4 r = fold4(fold4(q[0], q[1]), fold4(q[2], q[3]));
  return op(op(r.x, r.y), op(r.z, r.w));
}

// The block's max of v, returned to every thread (same contract as block_sum).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (warps == 1) return v;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = warp_max(lane < warps ? partial[lane] : -INFINITY);
  __syncthreads();
  return v;
}

}  // namespace llmk::detail
