// The second half of a split-K GEMM: out = epilogue(sum over the pieces of their fp32 partial
// sums), the epilogue of gemm_epilogue.cuh (bias, gelu / gelu_tanh, residual; silu_mul does
// not split).
//
// partial is [splits][m][ld_partial] fp32 (ld_partial a multiple of 4, columns n..ld_partial
// unused). One thread per 4 columns of a row: `splits` float4 loads (coalesced across the
// warp), the sum in a fixed order (split 0 first: the result does not depend on timing),
// then the epilogue and the stores. residual may alias out: each element is read and then
// written by the same thread.
//
// Roofline: splits * m * n * 4 bytes read + m * n out (+ residual), all from L2 at the sizes
// it serves (M <= 256: <= 4 x 256 x 6144 x 4 = 25 MB), a few microseconds beside the GEMM.
#pragma once

#include "common/device_types.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_epilogue.cuh"

namespace llmk::detail {

template <class TOut, GemmActivation Act>
__global__ void __launch_bounds__(256) gemm_split_reduce_kernel(const GemmParams p, const float* partial,
                                                                int64_t splits, int64_t ld_partial) {
  const int64_t quads = ld_partial / 4, items = p.m * quads, slice = p.m * ld_partial;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < items;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = item / quads, col = (item % quads) * 4;
    const float* src = partial + row * ld_partial + col;
    float4 sum = *reinterpret_cast<const float4*>(src);
    for (int64_t s = 1; s < splits; ++s) {
      const float4 v = *reinterpret_cast<const float4*>(src + s * slice);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const float acc[4] = {sum.x, sum.y, sum.z, sum.w};
    gemm_store_four<TOut, Act>(p, row, col, acc);
  }
}

}  // namespace llmk::detail
