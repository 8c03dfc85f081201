// Warp and block sums in fp32. block_sum returns the total to every thread; it uses a
// 32-float shared scratch and two barriers, so calls may follow one another directly.
#pragma once

namespace llmk::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Every thread of the block must call it; blockDim.x is a multiple of 32.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  if (warps == 1) return v;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = lane < warps ? partial[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();  // partial may be reused by the next call
  return total;
}

}  // namespace llmk::detail

namespace llmk::detail {

// Two sums in one pass over the block: returns (sum of a, sum of b) to every thread.
__device__ __forceinline__ float2 block_sum2(float a, float b) {
  __shared__ float2 partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  a = warp_sum(a);
  b = warp_sum(b);
  if (warps == 1) return make_float2(a, b);
  if (lane == 0) partial[warp] = make_float2(a, b);
  __syncthreads();
  float2 t = lane < warps ? partial[lane] : make_float2(0.0f, 0.0f);
  t.x = warp_sum(t.x);
  t.y = warp_sum(t.y);
  __syncthreads();
  return t;
}

}  // namespace llmk::detail
