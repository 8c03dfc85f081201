// Warp and block sums in fp32. block_sum / block_sums return the totals to every thread;
// they use a small shared scratch and two barriers, so calls may follow one another.
#pragma once

namespace llmk::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
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

// Count, mean and sum of squared deviations (M2) of a set of values; merge() combines two
// disjoint sets exactly (Chan, Golub and LeVeque's parallel variance), so a variance is
// reduced in one pass without the cancellation of E[x^2] - E[x]^2.
struct MeanM2 {
  float n;
  float mean;
  float m2;
};

__device__ __forceinline__ MeanM2 merge(MeanM2 a, MeanM2 b) {
  const float n = a.n + b.n;
  if (n == 0.0f) return a;
  const float delta = b.mean - a.mean;
  const float fb = b.n / n;
  return {n, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.n * fb};
}

// The block's merged MeanM2, identical in every thread (each warp merges the per-warp
// results in the same order). Two barriers, like block_sums.
__device__ __forceinline__ MeanM2 block_mean_m2(MeanM2 v) {
  __shared__ MeanM2 partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  auto warp_merge = [&](MeanM2 x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const MeanM2 other{__shfl_down_sync(0xffffffffu, x.n, offset),
                         __shfl_down_sync(0xffffffffu, x.mean, offset),
                         __shfl_down_sync(0xffffffffu, x.m2, offset)};
      x = merge(x, other);
    }
    // Lane 0 holds the merge of all lanes; give it to every lane.
    return MeanM2{__shfl_sync(0xffffffffu, x.n, 0), __shfl_sync(0xffffffffu, x.mean, 0),
                  __shfl_sync(0xffffffffu, x.m2, 0)};
  };
  v = warp_merge(v);
  if (warps == 1) return v;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = warp_merge(lane < warps ? partial[lane] : MeanM2{0.0f, 0.0f, 0.0f});
  __syncthreads();
  return v;
}

__device__ __forceinline__ float block_sum(float v) {
  float sums[1] = {v};
  block_sums(sums);
  return sums[0];
}

}  // namespace llmk::detail
