// What the Hopper attention backward kernels share (sm90/backward_kernel.cuh at head
// dims 64 and 128, sm90/backward_hd256_kernel.cuh at 256): the TMA maps, a key
// block's walk over the query tiles that see it with the dq turns, and the producer
// warpgroup's warps 1-3 (lse and D beside each Q stage; the dq reduce-adds). The turns and
// the first store are described in sm90/backward_kernel.cuh.
#pragma once

#include <cuda.h>

#include "attention/attention_params.h"
#include "attention/backward_common.cuh"
#include "common/ptx.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/store_tile.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/turns.cuh"
#include "common/sm90/warpgroup.cuh"

namespace llmk::detail::sm90 {

// Maps over q, dout (boxes of kBlockM rows) and k, v (kBlockN rows) as 4-d [batch, heads,
// rows, D] (dense) or [1, heads, total, D] (varlen), 64 columns per box.
// dq_accum: the float32 accumulator as 4-d [batch, heads, rows, D] (its layout is lse's
// times D), boxes of 64 rows x 32 columns, added to by TMA reductions.
struct AttentionBackwardSm90Maps {
  CUtensorMap q, k, v, dout, dq_accum;
};

// The dynamic shared memory rounded up to 1024 bytes (the 128-byte swizzle's period) by
// pointer arithmetic on the shared array: an integer round trip would lose the address space,
// and lse2 and D were then read with generic loads.
__device__ __forceinline__ uint8_t* aligned_shared_base(uint8_t* raw) {
  return raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 1023u)) & 1023u);
}

// The grid's key blocks of kBlockN keys per (kv head, batch entry): the longest sequence's.
template <int kBlockN>
__host__ __device__ inline int grid_key_blocks(const AttentionBackwardParams& bp) {
  return (bp.fwd.seqlen_k + kBlockN - 1) / kBlockN;
}

// The grid's units of work, one per (key block of kBlockN keys, kv head, batch entry), the key
// block fastest: the order in which a grid of one unit per block dispatches them.
template <int kBlockN>
__host__ __device__ inline int64_t key_block_units(const AttentionBackwardParams& bp) {
  return int64_t{grid_key_blocks<kBlockN>(bp)} * bp.heads_kv * bp.fwd.batch;
}

// The walk of unit `unit`'s kBlockN keys (key block, kv head, batch entry) over the query tiles
// of kBlockM rows that see them, for every query head of the kv head's group: step it visits
// tile u = (it + walk_start) mod n_iters (rotate_walk: non-causal, every block sees every
// tile), query head kv_head * group + u / per_head, query tile m_begin + u % per_head.
// kWindow: the kernels of the score variants, whose sliding window (p.variants.window) ends the
// walk at the last tile that still sees the block (bwd::query_tiles_seeing).
template <int kBlockM_, int kBlockN_, bool kWindow = false>
struct KeyBlockWalk {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_;
  const AttentionParams& p;
  const bool rotate;
  SequenceBounds seq;
  int kv_head, batch, n_block, n0, shift, m_begin, per_head, n_iters, key_blocks, walk_start;
  int32_t map_batch;  // the maps' batch coordinate (varlen maps have one entry)

  // A grid of one block per unit, (key block, kv head, batch entry) = blockIdx.
  __device__ explicit KeyBlockWalk(const AttentionBackwardParams& bp)
      : KeyBlockWalk(bp, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)) {}
  // Unit `unit` of key_block_units (a persistent grid).
  __device__ KeyBlockWalk(const AttentionBackwardParams& bp, int unit)
      : KeyBlockWalk(bp, unit % grid_key_blocks<kBlockN>(bp), unit / grid_key_blocks<kBlockN>(bp) % bp.heads_kv,
                     unit / grid_key_blocks<kBlockN>(bp) / bp.heads_kv) {}
  __device__ KeyBlockWalk(const AttentionBackwardParams& bp, int x, int kv_head_, int batch_)
      : p(bp.fwd), rotate(bp.rotate_walk), kv_head(kv_head_), batch(batch_) {
    const int grid_blocks = grid_key_blocks<kBlockN>(bp);
    // Deterministic causal calls dispatch the last key blocks first: their dq turns run from
    // the last key block down (turn below).
    n_block = p.causal && bp.dq_ordered ? grid_blocks - 1 - x : x;
    seq = sequence_bounds(p, batch);
    n0 = n_block * kBlockN;
    shift = seq.seqlen_k - seq.seqlen_q;  // causal: row i sees key j <= i + shift
    const bwd::QueryTiles tiles =
        bwd::query_tiles_seeing(seq, p.causal, n0, kBlockM, kWindow ? p.variants.window : 0, kBlockN);
    m_begin = tiles.begin;
    per_head = tiles.count();
    n_iters = per_head * p.group;
    map_batch = p.cu_seqlens_q != nullptr ? 0 : batch;
    // The sequence's key blocks, as far as the grid reaches (see turn).
    key_blocks = min((seq.seqlen_k + kBlockN - 1) / kBlockN, grid_blocks);
    walk_start = rotate && key_blocks > 0 ? static_cast<int>(static_cast<int64_t>(n_block) * n_iters / key_blocks) : 0;
  }
  // No key of the sequence in this block: it writes nothing.
  __device__ bool empty() const { return n0 >= seq.seqlen_k; }
  __device__ int index(int it) const { return it + walk_start < n_iters ? it + walk_start : it + walk_start - n_iters; }
  __device__ void tile(int it, int& head, int& m0) const {
    const int u = index(it);
    head = kv_head * p.group + u / per_head;
    m0 = (m_begin + u % per_head) * kBlockM;
  }
  // A tile's first row in lse's layout (that of D, and of the turn counters' row pairs).
  __device__ int64_t lse_row(int head, int m0) const { return p.lse_offset(batch, head) + seq.q_start + m0; }
  // This block's rank among the key blocks that add to tile step `it` (first row m0). Unrotated,
  // that of their dispatch, so that a block only waits on blocks running or done: every key
  // block below this one sees each query tile this one sees, so the turn is the block's index
  // (non-causal), or, causal, the tile's last key block (the highest that sees it) goes first
  // and the turn is the distance from it, the order in which the blocks reach the tile from
  // their diagonals. Rotated, the blocks reach tile u in the order of their steps to it: first
  // those whose walks start at or before u (g of them, the latest start first), then the
  // others (the latest start first); a block may then wait on one dispatched after it, which
  // in-order dispatch reaches while the sequence's key blocks fit the SMs
  // (attention_backward_sm90_plan rotates, and stores first on the default path, only then).
  // A varlen sequence longer than max_seqlen_q / max_seqlen_k breaks the API's contract: its
  // tiles from max_seqlen_q on (whose counters the rows kernel does not zero) add in any
  // order, and its key blocks past the grid do not exist (the turns count from the last one
  // that does), so that no block waits forever.
  __device__ int turn(int it, int m0) const {
    if (p.causal) return min(key_blocks - 1, (m0 + kBlockM + shift - 1) / kBlockN) - n_block;
    if (!rotate) return n_block;
    const int64_t u = index(it);
    const int g = static_cast<int>(min(int64_t{key_blocks}, ((u + 1) * key_blocks + n_iters - 1) / n_iters));
    return n_block < g ? g - 1 - n_block : g + key_blocks - 1 - n_block;
  }
};

// Calls f(walk) for each unit of this CTA that holds keys: blockIdx.x and every gridDim.x-th
// unit after it (a persistent grid of fewer CTAs than units walks several; every role of the
// block calls this and sees the same units).
template <int kBlockM, int kBlockN, class F>
__device__ __forceinline__ void for_each_key_block(const AttentionBackwardParams& bp, F&& f) {
  const int units = static_cast<int>(key_block_units<kBlockN>(bp));
  for (int unit = static_cast<int>(blockIdx.x); unit < units; unit += static_cast<int>(gridDim.x)) {
    const KeyBlockWalk<kBlockM, kBlockN> walk(bp, unit);
    if (!walk.empty()) f(walk);
  }
}

// Every warp of the caller arrives once on `bar` (from `lane` 0, threadIdx.x % 32), after all
// its lanes got here (the barrier's count is the arriving warps).
__device__ __forceinline__ void warp_arrive(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier_arrive(bar);
}

// The dq named barriers' threads: a consumer warpgroup and its producer warp (reduce_dq_shares).
inline constexpr int kDqBarrierThreads = kWarpgroupThreads + 32;

// Producer thread 0: the block's K and V (kChunks chunks of kBlockN rows x 64 columns each,
// chunk_bytes apart) by TMA onto kv_full.
template <int kChunks, class Walk>
__device__ __forceinline__ void load_key_block(const Walk& walk, const AttentionBackwardSm90Maps& maps, uint8_t* k_dst,
                                               uint8_t* v_dst, uint32_t chunk_bytes, uint64_t* kv_full) {
  mbarrier_arrive_expect_tx(kv_full, 2 * kChunks * chunk_bytes);
  const int32_t k_row = static_cast<int32_t>(walk.seq.k_start + walk.n0);
  tma_load_4d_chunks<kChunks>(k_dst, chunk_bytes, &maps.k, kv_full, k_row, walk.kv_head, walk.map_batch);
  tma_load_4d_chunks<kChunks>(v_dst, chunk_bytes, &maps.v, kv_full, k_row, walk.kv_head, walk.map_batch);
}

// Producer warp 1: lse_i log2(e) and D_i of each tile's kBlockM rows into the Q stage's
// row_lse2[stage][row] and row_delta[stage][row] (+inf and 0 past the sequence end, so those
// columns of P and dS are 0 without a mask), then an arrival on the stage's q_full. `ring`
// goes on across the CTA's units.
template <int kStages, class Walk>
__device__ __forceinline__ void write_row_stats(const Walk& walk, const AttentionBackwardParams& bp, float* row_lse2,
                                                float* row_delta, uint64_t* q_full, uint64_t* q_empty,
                                                RingState<kStages>& ring) {
  constexpr int M = Walk::kBlockM;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int it = 0; it < walk.n_iters; ++it) {
    int head, m0;
    walk.tile(it, head, m0);
    const int64_t first = walk.lse_row(head, m0);
    mbarrier_wait(&q_empty[ring.stage], ring.phase ^ 1u);
    for (int r = lane; r < M; r += 32) {
      const bool valid = m0 + r < walk.seq.seqlen_q;
      row_lse2[ring.stage * M + r] = valid ? bwd::lse_log2(walk.p.lse[first + r]) : INFINITY;
      row_delta[ring.stage * M + r] = valid ? bp.delta[first + r] : 0.0f;
    }
    warp_arrive(&q_full[ring.stage], lane);
    ring.advance();
  }
}

// Producer warp 2 + c: adds consumer c's share of each tile's dQ (rows row0.. +64 of the tile,
// columns col0 ..) to the fp32 accumulator once the consumer has written it to shared memory,
// in kRounds rounds per tile; round r is two TMA reduce-adds of 64 rows x 32 floats from the
// boxes at `boxes` and `boxes + box_bytes`, columns col0 + 64 r + 32 b. The named barriers:
// `full` (the consumer's 128 threads arrive when a round is in the boxes, this warp waits) and
// `empty` (this warp arrives once the reduction has read them, the consumer waits before its
// next round), each among the consumer's 128 threads and this warp.
// With dq_first_store, the tile's rank-0 block stores its share instead, and the other blocks
// wait until that store has completed and the counter reads 1; with dq_ordered
// (deterministic) the key blocks of a tile add in the fixed order of Walk::turn. The turn is
// waited for before the first round and passed after the last has completed. One round, each
// consumer passing its own turn (head dim 64): the boxes are freed after the pass (faster
// than before the wait for completion). Two rounds (head dim 256, whose consumer writes the
// last round only during the next tile): the boxes are freed once read, before that wait, so
// that the consumer's next round does not wait for the pass; one turn per tile, as a turn per
// round, each passed after its round completed, was slower.
// A box wholly past the accumulator's rows (head dim 96: consumer 1's columns 96-127, zeros)
// is not issued: its reduce-add wrote nothing but took its time to complete, which the turns
// wait for.
// kJointPass: the two consumers' warps share one counter per tile (consumer 0's). Each waits
// for its own reduce-adds' completion and frees its boxes, the pair meets at named barrier
// kJointPassBarrier (64 threads: a CTA-scope ordering of both warps' completed writes), and
// consumer 0's warp passes the turn once: one release (MEMBAR.GPU) per tile instead of two.
// It pays at head dims 128 and 256 and not at 64, whose consumers own separate rows and do
// not meet otherwise.
inline constexpr int kJointPassBarrier = 6;
template <int kRounds, bool kJointPass, class Walk>
__device__ __forceinline__ void reduce_dq_shares(const Walk& walk, const AttentionBackwardParams& bp,
                                                 const CUtensorMap* map, uint8_t* boxes, uint32_t box_bytes, int c,
                                                 int row0, int col0, int full, int empty) {
  constexpr bool kFreeFirst = kRounds > 1;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int it = 0; it < walk.n_iters; ++it) {
    int head, m0;
    walk.tile(it, head, m0);
    int* counter = nullptr;
    int rank = 0;
    if ((bp.dq_ordered || bp.dq_first_store) && m0 < walk.p.seqlen_q) {
      counter = bp.dq_counters + 2 * walk.lse_row(head, m0) + (kJointPass ? 0 : c);
      rank = walk.turn(it, m0);
    }
    const bool store = counter != nullptr && bp.dq_first_store && rank == 0;
    const int32_t row = static_cast<int32_t>(walk.seq.q_start + m0 + row0);
    for (int r = 0; r < kRounds; ++r) {
      const bool passes = r == kRounds - 1 && counter != nullptr && (bp.dq_ordered || store);
      named_barrier_sync(full, kDqBarrierThreads);
      if (lane == 0) {
        // Ordered, every block waits for its turn; else, with the first store, the other
        // blocks wait until it has completed (the counter reads 1).
        if (r == 0 && counter != nullptr && (bp.dq_ordered || !store))
          wait_for_turn(counter, bp.dq_ordered ? rank : 1);
        for (int b = 0; b < 2; ++b) {
          const int32_t col = col0 + 64 * r + 32 * b;
          if (col >= walk.p.head_dim) continue;  // head dim 96: consumer 1's second box
          if (store) tma_store_4d(map, boxes + b * box_bytes, col, row, head, walk.map_batch);
          else tma_reduce_add_4d(map, boxes + b * box_bytes, col, row, head, walk.map_batch);
        }
        tma_store_commit();
        if (passes && !kFreeFirst) tma_store_wait_all();
        else tma_store_wait_read();
        if (passes && !kFreeFirst && !kJointPass) pass_turn(counter);
      }
      __syncwarp();
      named_barrier_arrive(empty, kDqBarrierThreads);
      if (passes && kJointPass) {
        if (lane == 0) {
          if (kFreeFirst) tma_store_wait_all();
          cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
        }
        named_barrier_sync(kJointPassBarrier, 64);
        if (lane == 0 && c == 0) pass_turn(counter);
      } else if (passes && kFreeFirst && lane == 0) {
        tma_store_wait_all();
        pass_turn(counter);
      }
    }
  }
}

// A consumer warp's side of reduce_dq_shares: its 16 rows of a dQ round (the wgmma
// accumulator of 64 rows x 64 float columns) into the consumer's two swizzled boxes at `boxes`
// (this warp's rows), once the producer warp's reduction has read the previous round
// (`boxes_used`: a wait on `empty`), then an arrival on `full` for that warp to add them.
__device__ __forceinline__ void write_dq_round(uint32_t boxes, uint32_t box_bytes, const float (&dq)[32],
                                               bool boxes_used, int full, int empty) {
  if (boxes_used) named_barrier_sync(empty, kDqBarrierThreads);
  store_warp_f32_swizzled(boxes, box_bytes, dq);
  fence_async_shared();
  named_barrier_arrive(full, kDqBarrierThreads);
}

// A consumer warpgroup's 64 key rows x kCols columns of dk or dv (the wgmma accumulator layout:
// warp w holds rows 16w..16w+15) times `scale`, rounded, into t's rows of keys walk.n0 + key0
// .. + 63, columns col0 ..; keys past the sequence's are skipped.
template <class T, int kCols, class Walk>
__device__ __forceinline__ void store_key_rows(const AttentionTensor& t, const float (&acc)[kCols / 2], float scale,
                                               const Walk& walk, int key0, int col0) {
  const int warp = static_cast<int>(threadIdx.x / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  T* rows = static_cast<T*>(t.data) + walk.batch * t.batch_stride + walk.kv_head * t.head_stride;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = walk.n0 + key0 + 16 * warp + 8 * half + lane / 4;
    if (key >= walk.seq.seqlen_k) continue;
    T* row = rows + (walk.seq.k_start + key) * t.row_stride + col0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
      *reinterpret_cast<uint32_t*>(row + 8 * j) =
          ptx::pack2<T>(acc[4 * j + 2 * half] * scale, acc[4 * j + 2 * half + 1] * scale);
  }
}

}  // namespace llmk::detail::sm90
