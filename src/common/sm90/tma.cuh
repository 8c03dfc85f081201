// TMA copies (device side) over a map from tma.h, completing on an mbarrier (loads) or
// on the bulk-async group of the issuing thread (stores). One thread issues each copy.
#pragma once

#include <cuda.h>

#include <cuda/ptx>

#include <cstdint>

namespace llmk::detail::sm90 {

// Global -> shared: the box at (row, col) of `map` into `dst` (1024-byte aligned); the
// bytes arrive as transactions on `bar` (whose expected count the caller raised).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t row,
                                            int32_t col) {
  const int32_t coords[2] = {col, row};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords, bar);
}

// A 4-d box at coordinates c (innermost first).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords, bar);
}

// A tile of 64 kChunks columns of a 4-d map with boxes of 64 columns: box ch (columns
// 64 ch..) at dst + ch * chunk_bytes, all on `bar`.
template <int kChunks>
__device__ __forceinline__ void tma_load_4d_chunks(uint8_t* dst, uint32_t chunk_bytes, const CUtensorMap* map,
                                                   uint64_t* bar, int32_t c1, int32_t c2, int32_t c3) {
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) tma_load_4d(dst + ch * chunk_bytes, map, bar, 64 * ch, c1, c2, c3);
}

// As tma_load_2d, the box written at the same shared offset in every block of the
// cluster named in `cta_mask` (bit r: rank r), each block's `bar` at that offset
// receiving the bytes it got.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t row,
                                                      int32_t col, uint16_t cta_mask) {
  const int32_t coords[2] = {col, row};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords, bar,
                                  cta_mask);
}

// Shared -> global: `src` (written by ordinary stores: fence_async_shared() first) into
// the box at (row, col); out-of-bounds elements are skipped.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int32_t row, int32_t col) {
  const int32_t coords[2] = {col, row};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords, src);
}

// Shared -> global: the 4-d box at coordinates c (innermost first) from `src` (written by
// ordinary stores: fence_async_shared() first); out-of-bounds elements are skipped.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, int32_t c2,
                                             int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords, src);
}

// Shared -> global, added: the 4-d box at coordinates c (innermost first) += `src`, element
// by element (float32 add in the L2), out-of-bounds elements skipped; completes on the
// issuing thread's bulk-async group as a store (tma_store_commit, tma_store_wait_read).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1,
                                                  int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_reduce_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, map,
                                         coords, src);
}

// Global -> L2 only: the 4-d box at coordinates c (innermost first), so that a later load
// of it finds it in the L2. Nothing completes, nothing to wait for.
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(map), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3)
               : "memory");
}

// tma_prefetch_4d over the kChunks 64-column boxes of a tile (as tma_load_4d_chunks).
template <int kChunks>
__device__ __forceinline__ void tma_prefetch_4d_chunks(const CUtensorMap* map, int32_t c1, int32_t c2, int32_t c3) {
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) tma_prefetch_4d(map, 64 * ch, c1, c2, c3);
}

__device__ __forceinline__ void tma_store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }

// Waits until the committed stores of this thread have read their shared memory.
__device__ __forceinline__ void tma_store_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }

// Waits until the committed stores of this thread have completed (written global memory).
__device__ __forceinline__ void tma_store_wait_all() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

// Orders this thread's ordinary shared-memory writes before later async-proxy reads
// (TMA store, wgmma).
__device__ __forceinline__ void fence_async_shared() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

}  // namespace llmk::detail::sm90
