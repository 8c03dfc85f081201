// The stmatrix + TMA-store epilogue piece: a consumer warpgroup's 64 x kCols block of
// final fp32 values (wgmma accumulator layout, wgmma.cuh) written as 16-bit elements into
// shared memory in the 128-byte-swizzled layout of a TMA box of 64 rows x 64 columns
// (kCols / 64 boxes of 8 KB, 1024-byte aligned), ready for tma_store_2d.
//
// add_swizzled is the reverse direction (ldmatrix) for a tile loaded into such boxes.
// stmatrix.x4 stores four 8 x 8 matrices from the same per-thread fragment that an
// accumulator pair has (row lane/4, columns 2(lane%4)..+1), 16 bytes per row address;
// with the swizzle the 8 row addresses of a matrix hit 8 different bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx.cuh"

namespace llmk::detail::sm90 {

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// The byte offset of 16-byte unit `unit` (0-7) of row `row` in a box of 128-byte rows with
// the 128-byte swizzle (the box 1024-byte aligned).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int unit) { return row * 128 + ((unit ^ (row % 8)) * 16); }

// This lane's row address for stmatrix of 16-column group c of the boxes at `boxes`.
__device__ __forceinline__ uint32_t swizzled_row_address(uint32_t boxes, int c) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int matrix = lane / 8;  // this lane gives a row address of matrix `matrix`
  const int row = 16 * warp + (matrix % 2) * 8 + lane % 8;
  const int col = 16 * c + (matrix / 2) * 8;
  return boxes + (col / 64) * 8192 + swizzled_offset(row, (col % 64) / 8);
}

// A warp's 16 x 64 float32 accumulators (d[4j + 2 half + {0,1}]: row 8 half + lane/4, columns
// 8j + 2(lane%4) + {0,1}) into two swizzled boxes of 128-byte rows (32 floats), the second
// `box_stride` bytes after the first at `boxes`, for a TMA store or reduce-add of float32
// boxes. Store k writes column block j = k with lanes 4i, 4i+1 and j = k ^ 2 with lanes 4i+2,
// 4i+3: each half-warp's 16 eight-byte pairs then fill 8 different 16-byte bank groups (with
// j = k for every lane, lanes 4i and 4i+2 meet in one group: two-way conflicts).
__device__ __forceinline__ void store_warp_f32_swizzled(uint32_t boxes, uint32_t box_stride, const float (&d)[32]) {
  const int lane = threadIdx.x % 32;
  const bool swap = (lane & 2) != 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = 8 * half + lane / 4;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int j = swap ? k ^ 2 : k;
      const uint32_t addr =
          boxes + (k / 4) * box_stride + swizzled_offset(row, 2 * (j % 4) + (lane % 4) / 2) + 8 * (lane % 2);
      // A select of two constant indices: d[4 * j] would index registers by lane (local memory).
      const float x = swap ? d[4 * (k ^ 2) + 2 * half] : d[4 * k + 2 * half];
      const float y = swap ? d[4 * (k ^ 2) + 2 * half + 1] : d[4 * k + 2 * half + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
    }
  }
}

// Writes d[0 .. kCols/2) of this thread (warp w of the warpgroup holds rows 16w..16w+15)
// into the boxes at shared address `boxes`, times `lo` in the thread's first row (lane/4)
// and `hi` in its second (lane/4 + 8).
template <class T, int kCols>
__device__ __forceinline__ void store_accumulators_swizzled(uint32_t boxes, const float* d, float lo = 1.0f,
                                                            float hi = 1.0f) {
#pragma unroll
  for (int c = 0; c < kCols / 16; ++c)
    stmatrix_x4(swizzled_row_address(boxes, c), ptx::pack2<T>(d[8 * c] * lo, d[8 * c + 1] * lo),
                ptx::pack2<T>(d[8 * c + 2] * hi, d[8 * c + 3] * hi), ptx::pack2<T>(d[8 * c + 4] * lo, d[8 * c + 5] * lo),
                ptx::pack2<T>(d[8 * c + 6] * hi, d[8 * c + 7] * hi));
}

// The same from accumulators already rounded and packed as wgmma A fragments (a[c]: the 16
// columns of group c, the register order of an m64k16 A fragment is stmatrix's), into the
// boxes' columns from 16 first_group on.
template <int kCols>
__device__ __forceinline__ void store_fragments_swizzled(uint32_t boxes, const uint32_t (&a)[kCols / 16][4],
                                                         int first_group = 0) {
#pragma unroll
  for (int c = 0; c < kCols / 16; ++c)
    stmatrix_x4(swizzled_row_address(boxes, first_group + c), a[c][0], a[c][1], a[c][2], a[c][3]);
}

template <class T>
__device__ __forceinline__ float2 unpack_pair(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

// The inverse of store_accumulators_swizzled: adds the 16-bit values of the boxes (a tile
// TMA loaded there, e.g. a residual) to d in the accumulator layout; ldmatrix reads the
// very fragments stmatrix would write.
template <class T, int kCols>
__device__ __forceinline__ void add_swizzled(uint32_t boxes, float* d) {
#pragma unroll
  for (int c = 0; c < kCols / 16; ++c) {
    uint32_t r[4];
    ptx::ldmatrix_x4(r, swizzled_row_address(boxes, c));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 v = unpack_pair<T>(r[q]);
      d[8 * c + 2 * q] += v.x;
      d[8 * c + 2 * q + 1] += v.y;
    }
  }
}

}  // namespace llmk::detail::sm90
