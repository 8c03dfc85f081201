// Key blocks of the Hopper forward from a KV cache (AttentionParams' cache fields): the
// producer warp of a call over a paged or contiguous cache (attention_over_cache) fills one
// stage of K or V with the block's kBlockN keys.
//
// A block wholly inside the sequence: TMA boxes of kv_box_rows rows (whole 8-row swizzle
// atoms of one page: gcd(page_size, kBlockN), or kBlockN for a contiguous cache), one per
// lane, each at its page's coordinates and at its rows' 1024-byte-aligned offset of the
// stage, so the 128-byte swizzle the consumers' descriptors read is the one a single box
// would write. A block that crosses the sequence's end (its last): cp.async by the warp, 16
// bytes a lane at a time into the swizzled layout, the rows past the end zero-filled (a
// cache's unused slots may hold anything, NaN included: P = 0 there, and 0 x NaN is NaN);
// cp.async.mbarrier.arrive hands their completion to the stage's full barrier. The consumers
// fence the async proxy after the wait (cp.async writes through the generic one).
// Page ids are clamped to the cache's pages: a broken block table never reads outside it.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "common/ptx.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/tma.cuh"

namespace llmk::detail::sm90 {

// The page holding token `token` of sequence `batch` (a contiguous cache: page `batch`).
__device__ __forceinline__ int cache_page(const AttentionParams& p, int batch, int token) {
  if (p.block_table == nullptr) return batch;
  const int page = p.block_table[batch * p.block_table_stride + token / p.page_size];
  return page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
}

// The page of this lane's TMA box of keys [n0, n0 + kBlockN) where the block lies wholly in
// the sequence (lanes past the block's boxes, and blocks that cross its end: -1). The producer
// reads it before waiting for the stage, so the table's latency hides behind the wait.
template <class Tile>
__device__ __forceinline__ int cache_box_page(const AttentionParams& p, int batch, int n0, int seqlen_k, int lane) {
  const int row = lane * p.kv_box_rows;  // kv_box_rows >= 8: at most 16 boxes, one a lane
  return seqlen_k - n0 >= Tile::kBlockN && row < Tile::kBlockN ? cache_page(p, batch, n0 + row) : -1;
}

// Keys [n0, n0 + kBlockN) of `t` (K or V) for kv head `kv_head` of sequence `batch`, whose
// keys end at seqlen_k, into `dst` (the stage), completing on `full`; `page`: this lane's
// cache_box_page. Every lane of the warp calls it after the stage's empty wait.
template <class T, class Tile>
__device__ __forceinline__ void load_cache_block(uint8_t* dst, const CUtensorMap* map, uint64_t* full,
                                                 const AttentionTensor& t, const AttentionParams& p, int batch,
                                                 int kv_head, int n0, int seqlen_k, int lane, int page) {
  const int valid = seqlen_k - n0;
  if (valid >= Tile::kBlockN) {
    if (lane == 0) mbarrier_arrive_expect_tx(full, Tile::kKvBytes);
    __syncwarp();
    const int row = lane * p.kv_box_rows;
    if (page >= 0)
      tma_load_4d_chunks<Tile::kChunks>(dst + row * 128, Tile::kKvChunkBytes, map, full, (n0 + row) % p.page_size,
                                        kv_head, page);
    return;
  }
  // 16-byte pieces of a row: 8 per 64-column chunk (at D = 96 the second chunk's last four
  // are past the row: zeros, as TMA writes there).
  constexpr int kPieces = Tile::kChunks * 8, kRowPieces = Tile::kHeadDim * static_cast<int>(sizeof(T)) / 16;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const T* data = static_cast<const T*>(t.data);
  for (int i = lane; i < Tile::kBlockN * kPieces; i += 32) {
    const int row = i / kPieces, piece = i % kPieces;
    const bool ok = row < valid && piece < kRowPieces;
    const int token = n0 + row;
    const T* from = ok ? data + cache_page(p, batch, token) * t.batch_stride + (token % p.page_size) * t.row_stride +
                             kv_head * t.head_stride + piece * (16 / static_cast<int>(sizeof(T)))
                       : data;
    ptx::cp_async_16(base + (piece / 8) * Tile::kKvChunkBytes + row * 128 + (((piece % 8) ^ (row % 8)) << 4), from,
                     ok);
  }
  cp_async_mbarrier_arrive(full);
  __syncwarp();
  if (lane == 0) mbarrier_arrive(full);
}

}  // namespace llmk::detail::sm90
