// Attention forward on Hopper (sm_90a): TMA + wgmma, warp-specialized, FlashAttention 3's
// schedule. A persistent block walks tiles of kBlockM = 64 x kConsumers query rows of one
// (batch, head) (AttentionSchedule): 192 at D = 64 (but causal below 8192 query rows), else
// 128 (AttentionSm90Tile); per tile:
//
//   warpgroup 0, the producer (one thread, 24 registers; its first warp for keys from a KV
//     cache, cache_loads.cuh): Q [kBlockM, D], then the key
//     blocks of kBlockN keys (128; 64 at D = 256) the rows may see, in the order the
//     consumers use them: K_0, then K_j and V_{j-1} for j = 1.., then the last V. K and V
//     have their own full and empty barriers in a 2-stage ring, so K_{j+1} loads as soon as
//     S_{j-1} is done with its stage, a block ahead of V;
//   warpgroups 1.. kConsumers, the consumers (240 registers; 160 with 3), 64 query rows
//     each, for key block j:
//     S_j = Q K_j^T        wgmma m64nNk16 (N = kBlockN), both operands in shared memory
//                          (K-major), issued before ...
//     O += P_{j-1} V_{j-1} wgmma m64nDk16, P from registers, V MN-major (D contiguous),
//     then, while both run: mask S_j where the block crosses the sequence end or the causal
//     diagonal, the online softmax of S_j (common/online_softmax.cuh: a warp's accumulator is
//     the mma.sync fragment of its 16 rows); after O's wgmma: P_j = S_j rounded to 16
//     bits, O rescaled where a row max grew.
//   O /= row sum; lse = max + log(sum). O goes by stmatrix into shared memory and a TMA
//     store per warp at D = 96, 128 and 256 (kTmaOut; a varlen sequence's last partial 16
//     rows from registers), from registers at D = 64.
// Intra-warpgroup overlap: the exp2/MUFU work of block j runs beside the tensor work of S_j
// and P_{j-1} V_{j-1}; with 2 consumers across tiles too (kCrossTile): a tile's last P V is
// issued with the next tile's S_0, and its output stored once both are done (the tile stays
// `pending` until then); with 3 each tile ends with its last P V alone.
// Pingpong (D <= 128): the consumers take turns issuing their GEMMs, round their ring,
// ordered by a named barrier each, so their softmaxes run while another's GEMMs do (FA3
// leaves it off at D = 256, where the O accumulators take half the registers).
// Causal blocks skip the key blocks above the diagonal. The grid is persistent (one block
// per SM walking the tiles; causal tiles in pairs of equal total work, AttentionSchedule),
// and the next tile's Q and first keys load while this one finishes (Q double-buffered at
// D <= 128; at D = 256 once this tile's last S GEMM is done, from the L2 where a dense
// non-causal tile of two or more key blocks prefetched it).
//
// Shared memory (128-byte swizzle, 64-column chunks of rows x 128 bytes): Q D/64 chunks of
// kBlockM rows, each stage K and V D/64 chunks of kBlockN rows, O's TMA-store boxes: D = 64:
// 2 x 16 + 2 x 32 = 96 KB (2 x 24 + 2 x 32 = 112 KB with 3 consumers); D = 96 (two chunks,
// the second's last 32 columns zeros, AttentionSm90Tile::kChunks) and D = 128: 2 x 32 + 2 x 64
// + 32 = 224 KB; D = 256 (64-key blocks): 64 + 2 x 64 + 32 = 224 KB.
// Registers per consumer thread: O D/2, S_j kBlockN/2, P_{j-1} kBlockN/4 (D = 128: 160).
// Roofline as the sm_80 kernel's (sm80/forward_kernel.cuh): 4 seq_q seq_k D FLOPs per
// (batch, head), tensor-bound; wgmma's dense bf16 peak is ~990 TFLOP/s.
#pragma once

#include <cuda.h>

#include "attention/attention_params.h"
#include "attention/sm90/cache_loads.cuh"
#include "attention/sm90/schedule.h"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/store_tile.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/warpgroup.cuh"
#include "common/sm90/wgmma.cuh"

namespace llmk::detail::sm90 {

// kBlockN keys per block: 128 for D <= 128; 64 for D = 256, whose O accumulators take 128
// registers per thread and whose Q tile takes 64 KB. One kernel of 128 serves causal and
// non-causal at D = 128: FA3's 176-key blocks (one Q buffer to fit 208 KB) gain little on
// long non-causal rows and lose on short causal ones.
template <int kHeadDim_, int kConsumers_>
struct AttentionSm90Tile {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 256, "head dims 64, 96, 128, 256");
  // Consumers of 64 query rows each. 3 at D = 64 (tiles of 192 rows, as FlashAttention 3
  // and ThunderKittens take there), where the softmax's MUFU work per key block equals the
  // tensor work, so a third warpgroup's softmax fills the tensor pipe's gaps; but 2 for
  // causal calls below 8192 query rows, where the 192-row tiles compute key blocks wholly
  // above a consumer's diagonal and overhang short sequences (the launcher's rule,
  // sm90/forward.cu). 2 at D = 128 and 256, whose O accumulators need the
  // registers of 240 per thread.
  static constexpr int kConsumers = kConsumers_;
  static_assert(kConsumers == 2 || (kConsumers == 3 && kHeadDim == 64), "3 consumers fit D = 64 only");
  static constexpr int kBlockM = 64 * kConsumers, kBlockN = kHeadDim <= 128 ? 128 : 64, kStages = 2;
  // setmaxnreg counts: the producer gives its registers to the consumers (64K per SM).
  static constexpr int kProducerRegisters = 24, kConsumerRegisters = kConsumers == 3 ? 160 : 240;
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
                "setmaxnreg counts over the register file");
  // Pingpong over the ring of consumers, with 3 as with 2: it pays for both.
  static constexpr bool kPingpong = kHeadDim <= 128;
  // A tile's last P V issued with the next tile's S_0, with 2 consumers: it beats the
  // tile-by-tile loop at every head dim. With 3 the pending tile's state spills within 160
  // registers and the step loses.
  static constexpr bool kCrossTile = kConsumers == 2;
  // Every kExp2FmaEvery-th n-tile's exponentials on the FMA pipe (exp2_fma) instead of the
  // special-function unit, where the tensor work per score is smallest (D = 64), with 2
  // consumers only: 1 in 8 n-tiles pays, more moved to the FMA pipe lose; with 3, whose issue
  // slots are the tighter limit, every fraction lost (docs/history/attention.md, v12).
  static constexpr int kExp2FmaEvery = kHeadDim == 64 && kConsumers == 2 ? 8 : 0;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  // 64-column swizzle chunks. At D = 96 the second holds columns 64-95 and zeros: the maps'
  // rows are 96 wide, and TMA fills the box's columns past them with zeros (and counts their
  // bytes), which no GEMM reads (S's k-steps stop at 96, P V's N is 96).
  static constexpr int kChunks = (kHeadDim + 63) / 64;
  static constexpr uint32_t kQChunkBytes = kBlockM * 128;        // rows x 128 bytes
  static constexpr uint32_t kKvChunkBytes = kBlockN * 128;
  static constexpr uint32_t kQBytes = kChunks * kQChunkBytes;
  // Two Q buffers let the producer load the next tile's Q during this one (one at D = 256,
  // where a second 64 KB does not fit: there the next Q loads once this tile's last S GEMM
  // is done).
  static constexpr int kQBuffers = kHeadDim <= 128 ? 2 : 1;
  static constexpr uint32_t kKvBytes = kChunks * kKvChunkBytes;  // one key block of K (or V)
  static constexpr uint32_t kStageBytes = 2 * kKvBytes;
  static constexpr uint32_t kRingOffset = kQBuffers * kQBytes;
  // O leaves through shared memory (stmatrix) and TMA stores at D = 128, where it beats
  // register stores: per consumer two boxes of 64 rows x 64 columns, each warp storing its
  // 16 rows. At D = 256 the same 32 KB of boxes take O in two rounds of 128 columns (224 KB
  // in all); it beats register stores there once the S descriptors are advanced instead of
  // rebuilt (kAdvanceDescriptors; docs/history/attention.md, v10). D = 96
  // takes D = 128's boxes and stores the second from its first 32 columns: its out map's rows
  // are 96 wide, so the TMA store skips the box's columns past them. D = 64 stays on register
  // stores: staging lost there, with 2 consumers or 3. With the cross-tile step the staging
  // must not sit in a branch of its own (a TMA path and a register path): ptxas then
  // serialized every wgmma of the kernel (C7520, a compiler-inserted warpgroup.arrive in a
  // divergent path); every warp stages its rows and only the stores branch (store_output).
  static constexpr bool kTmaOut = attention_sm90_stages_output(kHeadDim);
  // The wgmma descriptors of S and P V formed once per GEMM and moved on by a 32-bit add per
  // k-step (descriptor_advanced), not rebuilt from the address each step, at D = 256 only;
  // there the shared addresses are broadcast from lane 0 first (warp_uniform), so that ptxas
  // keeps the adds in uniform registers (no R2UR per wgmma operand; fewer SASS instructions
  // in the key-block loop). At D = 64 advancing lost and at D = 128 it spilled: both rebuild,
  // where ptxas already does the descriptor math on the uniform datapath
  // (docs/history/attention.md, v10, v11).
  static constexpr bool kAdvanceDescriptors = kHeadDim == 256;
  static constexpr uint32_t kOutOffset = kRingOffset + kStages * kStageBytes;
  // Per consumer kOutBoxes boxes of 64 rows x 64 columns (8 KB): at D = 256 O leaves through
  // them in kOutRounds rounds of 128 columns, kOutGroups 16-column groups each (D = 96: 6).
  static constexpr int kOutBoxes = 2, kOutRounds = kChunks / kOutBoxes;
  static constexpr int kOutGroups = kHeadDim / 16 < 4 * kOutBoxes ? kHeadDim / 16 : 4 * kOutBoxes;
  static constexpr uint32_t kOutConsumerBytes = kTmaOut ? kOutBoxes * 8192 : 0;
  static constexpr uint32_t kBarrierOffset = kOutOffset + kConsumers * kOutConsumerBytes;
  static constexpr int kSharedBytes = kBarrierOffset + (2 * kQBuffers + 4 * kStages) * 8 + 1024;
  static_assert(kSharedBytes <= kMaxBlockSharedBytes, "the tile's shared memory exceeds sm_90's 227 KB");
};

// Maps over q, k, v as 4-d [batch, heads, rows, D] (dense) or [1, heads, total, D]
// (varlen), D innermost; boxes of kBlockM (q) or kBlockN (k, v) rows x 64 columns. out:
// the same over the output, boxes of 16 rows x 64 columns, used where tma_out
// (Tile::kTmaOut and out TMA-addressable).
struct AttentionSm90Maps {
  CUtensorMap q, k, v, out;
  bool tma_out;
};

// Calls body(tile, next_tile) for each tile of the block's units (sm90/schedule.h), in
// order; next_tile() is the tile after it in the block's walk, computed only when called
// (m_block -1 where there is none, or where the next unit has no tiles: a varlen pair past
// its sequence's end).
template <class F>
__device__ __forceinline__ void walk_attention_tiles(const AttentionParams& p, const AttentionSchedule& s, F&& body) {
  for (int64_t u = blockIdx.x; u < s.units; u += gridDim.x) {
    const AttentionUnit unit = attention_unit(p, s, u);
    for (int t = 0; t < unit.count; ++t) {
      body(unit.tile(t), [&]() {
        if (t + 1 < unit.count) return unit.tile(t + 1);
        if (u + gridDim.x < s.units) {
          const AttentionUnit after = attention_unit(p, s, u + gridDim.x);
          if (after.count > 0) return after.tile(0);
        }
        return AttentionTileCoord{-1, 0, 0};
      });
    }
  }
}

// Calls body(tile) for each tile of the block's units, in order.
template <class F>
__device__ __forceinline__ void for_each_attention_tile(const AttentionParams& p, const AttentionSchedule& s, F&& body) {
  walk_attention_tiles(p, s, [&](const AttentionTileCoord& c, auto) { body(c); });
}

// grid: min(units, SMs) blocks.
template <class T, int kHeadDim, int kConsumers, bool kVariants>
__global__ void __launch_bounds__(AttentionSm90Tile<kHeadDim, kConsumers>::kThreads, 1)
    attention_forward_sm90_kernel(const __grid_constant__ AttentionSm90Maps maps,
                                  const __grid_constant__ AttentionParams p,
                                  const AttentionSchedule schedule) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = AttentionSm90Tile<kHeadDim, kConsumers>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // The score variants (window, softcap, sinks) are compiled into kernels of their own (the
  // plain calls' carry none of their instructions), of the 2-consumer tiles only:
  // attention_sm90_consumers never sends a call with one to the 3-consumer tile.
  static_assert(!kVariants || kConsumers == 2, "the score variants run on the 2-consumer tiles only");
  // A tile's sequence, first row and key blocks [j0, n_blocks) (n_blocks 0: nothing to load;
  // j0 > 0 with a sliding window: the blocks wholly left of every row's window are skipped,
  // not masked).
  auto tile_work = [&](const AttentionTileCoord& c, SequenceBounds& seq, int& m0, int& j0, int& n_blocks) {
    seq = sequence_bounds(p, c.batch);
    m0 = c.m_block * Tile::kBlockM;
    const int key_end = m0 < seq.seqlen_q ? static_cast<int>(visible_keys(seq, p.causal, m0 + Tile::kBlockM - 1)) : 0;
    n_blocks = (key_end + Tile::kBlockN - 1) / Tile::kBlockN;
    j0 = kVariants && p.variants.window > 0 && n_blocks > 0
             ? static_cast<int>(first_visible_key(seq, p.causal, p.variants.window, m0)) / Tile::kBlockN
             : 0;
  };

  extern __shared__ uint8_t shared_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  auto q_smem = [&](int b) { return base + b * Tile::kQBytes; };
  // Stage s of the ring holds K (part 0) then V (part 1).
  auto kv_smem = [&](int s, int part) { return base + Tile::kRingOffset + s * Tile::kStageBytes + part * Tile::kKvBytes; };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + Tile::kBarrierOffset);
  uint64_t* q_empty = q_full + Tile::kQBuffers;
  uint64_t* k_full = q_empty + Tile::kQBuffers;
  uint64_t* v_full = k_full + Tile::kStages;
  uint64_t* k_empty = v_full + Tile::kStages;
  uint64_t* v_empty = k_empty + Tile::kStages;

  if (threadIdx.x == 0) {
    for (int b = 0; b < Tile::kQBuffers; ++b) {
      mbarrier_init(&q_full[b], 1);
      mbarrier_init(&q_empty[b], Tile::kConsumers);
    }
    for (int s = 0; s < Tile::kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], Tile::kConsumers);
      mbarrier_init(&v_empty[s], Tile::kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // Keys from a KV cache (the variant kernels, D <= 128: at D = 256 the cache walk cost the
  // variant kernel 212 bytes of spills): the producer's whole first warp loads them
  // (cache_loads.cuh), lane 0 alone issues Q and arrives.
  const bool from_cache = kVariants && kHeadDim <= 128 && p.cache_seqlens != nullptr;
  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<Tile::kProducerRegisters>();
    if (threadIdx.x >= (from_cache ? 32u : 1u)) return;
    const int lane = threadIdx.x;
    RingState<Tile::kStages> k_ring, v_ring;
    RingState<Tile::kQBuffers> q_ring;
    // The walk, compiled once for loads from k and v and once from a cache (kCache: the
    // warp's loads; the plain walk's code stays the one-thread loop it was).
    auto produce = [&](auto cache_tag) {
      constexpr bool kCache = decltype(cache_tag)::value;
      walk_attention_tiles(p, schedule, [&](const AttentionTileCoord& c, auto next_tile) {
        SequenceBounds seq;
        int m0, j0, n_blocks;
        tile_work(c, seq, m0, j0, n_blocks);
        if (n_blocks == 0) return;
        const int kv_head = c.head / p.group;
        const int32_t map_batch = varlen ? 0 : c.batch;
        mbarrier_wait(&q_empty[q_ring.stage], q_ring.phase ^ 1u);
        if (!kCache || lane == 0) {
          mbarrier_arrive_expect_tx(&q_full[q_ring.stage], Tile::kQBytes);
          tma_load_4d_chunks<Tile::kChunks>(q_smem(q_ring.stage), Tile::kQChunkBytes, &maps.q, &q_full[q_ring.stage],
                                            static_cast<int32_t>(seq.q_start + m0), c.head, map_batch);
        }
        q_ring.advance();
        // One Q buffer (D = 256): the next tile's Q loads only once this tile's last S GEMM
        // is done, so in dense non-causal calls it goes to the L2 halfway through this tile
        // (tiles of two or more key blocks; it pays on long sequences). Causal, varlen and
        // cache walks do not prefetch: computing their next tile spills the producer's 24
        // registers, which costs short sequences more than the prefetch gains. Dense
        // coordinates: a tile's rows start at m_block * kBlockM, its map batch is its batch.
        auto prefetch_next_q = [&]() {
          const AttentionTileCoord next = next_tile();
          if (next.m_block >= 0)
            tma_prefetch_4d_chunks<Tile::kChunks>(&maps.q, next.m_block * Tile::kBlockM, next.head, next.batch);
        };
        // Key block j of K (or V) into the next stage of its ring, once every consumer left it;
        // from a cache, `page` is this lane's box page of block j (cache_box_page).
        auto load_block = [&](int j, RingState<Tile::kStages>& ring, int part, const CUtensorMap* map, uint64_t* full,
                              uint64_t* empty, int page) {
          mbarrier_wait(&empty[ring.stage], ring.phase ^ 1u);
          if constexpr (kCache) {
            load_cache_block<T, Tile>(kv_smem(ring.stage, part), map, &full[ring.stage], part == 0 ? p.k : p.v, p,
                                      c.batch, kv_head, j * Tile::kBlockN, seq.seqlen_k, lane, page);
          } else {
            mbarrier_arrive_expect_tx(&full[ring.stage], Tile::kKvBytes);
            tma_load_4d_chunks<Tile::kChunks>(kv_smem(ring.stage, part), Tile::kKvChunkBytes, map, &full[ring.stage],
                                              static_cast<int32_t>(seq.k_start + j * Tile::kBlockN), kv_head,
                                              map_batch);
          }
          ring.advance();
        };
        // A cache's block table is read a block ahead, behind a block's loads, and block j's
        // pages serve its K and then its V (read for each as its stage came free, paged calls ran
        // 0.73-0.78x a contiguous cache's speed; a block ahead 0.81-0.85x).
        auto box_page = [&](int j) {
          return kCache && j < n_blocks ? cache_box_page<Tile>(p, c.batch, j * Tile::kBlockN, seq.seqlen_k, lane) : -1;
        };
        int page = box_page(j0), next_page = box_page(j0 + 1);
        load_block(j0, k_ring, 0, &maps.k, k_full, k_empty, page);
        for (int j = j0 + 1; j < n_blocks; ++j) {
          const int page_j = next_page;
          next_page = box_page(j + 1);
          load_block(j, k_ring, 0, &maps.k, k_full, k_empty, page_j);
          load_block(j - 1, v_ring, 1, &maps.v, v_full, v_empty, page);
          page = page_j;
          if (!kCache && Tile::kQBuffers == 1 && j == (j0 + n_blocks) / 2 && !schedule.paired && !varlen)
            prefetch_next_q();
        }
        load_block(n_blocks - 1, v_ring, 1, &maps.v, v_full, v_empty, page);
      });
    };
    if (from_cache) produce(std::true_type{});
    else produce(std::false_type{});
    return;
  }

  warpgroup_claim_registers<Tile::kConsumerRegisters>();
  const int consumer = wg - 1;
  const bool leader = threadIdx.x % kWarpgroupThreads == 0;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row_in_tile = 64 * consumer + 16 * warp + lane / 4;  // the thread's first row
  constexpr int kDTiles = kHeadDim / 8, kNTiles = Tile::kBlockN / 8;
  constexpr int kPairThreads = 2 * kWarpgroupThreads;
  // Pingpong: consumer c issues its GEMMs after named barrier 1 + c completes, then lets
  // the next one (c + 1, round the ring of consumers) go. Consumer 0 goes first: the last
  // consumer arrives for it once up front.
  const int next_turn = 1 + (consumer + 1) % Tile::kConsumers;
  if (Tile::kPingpong && consumer == Tile::kConsumers - 1) named_barrier_arrive(1, kPairThreads);
  RingState<Tile::kStages> k_ring, v_ring;
  RingState<Tile::kQBuffers> q_ring;
  // The tile in flight: O, P_{j-1} as the A fragments of the 16-key steps of P V, the
  // online softmax. With the cross-tile step a tile's last P V is issued beside the next
  // tile's first S GEMM, so a finished tile stays `pending` (its 1 / row sum and lse
  // computed, where its rows go) until then; without it (kCrossTile off) the tile is
  // flushed at its end.
  float o[1][kDTiles][4];
  auto& o_flat = reinterpret_cast<float(&)[kHeadDim / 2]>(o);
  uint32_t pa[Tile::kBlockN / 16][4];
  OnlineSoftmax<1> softmax;
  struct Rows {
    T* out;      // the (batch, head)'s first output row
    float* lse;  // its first lse entry, or null
    int first, end;  // the thread's first row; the sequence's rows
    int32_t map_row, head, map_batch;  // out's map coordinates of the warp's first row
  } pending_rows{};
  bool pending = false;
  float inv_sum[1][2] = {}, row_lse[1][2] = {};  // set by softmax.finish before any store

  // The descriptor of the k-step `step` bytes past addr, whose step-0 descriptor is desc0:
  // advanced from desc0 or rebuilt from the address (kAdvanceDescriptors).
  auto step_descriptor = [](uint64_t desc0, uint32_t addr, uint32_t step, uint32_t stride_bytes) {
    return Tile::kAdvanceDescriptors ? descriptor_advanced(desc0, step) : smem_descriptor(addr + step, stride_bytes, 1024);
  };
  // A shared address, marked warp-uniform where kAdvanceDescriptors (its note says why).
  auto descriptor_address = [&](uint32_t addr) { return Tile::kAdvanceDescriptors ? warp_uniform(addr) : addr; };
  // S_j = Q K_j^T issued (not waited for) into s.
  auto issue_scores = [&](float (&s)[1][kNTiles][4], uint32_t q_addr) {
    auto& s_flat = reinterpret_cast<float(&)[Tile::kBlockN / 2]>(s);
    const uint32_t q_at = descriptor_address(q_addr);
    const uint32_t k_addr = descriptor_address(static_cast<uint32_t>(__cvta_generic_to_shared(kv_smem(k_ring.stage, 0))));
    mbarrier_wait(&k_full[k_ring.stage], k_ring.phase);
    if (from_cache) fence_async_shared();  // a block cp.async wrote (cache_loads.cuh)
    wgmma_fence();  // after the wait: else ptxas injects the fence itself (C7519)
    const uint64_t a0 = smem_descriptor(q_at, 16, 1024), b0 = smem_descriptor(k_addr, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint64_t a = step_descriptor(a0, q_at, kmajor_step_bytes(kk, Tile::kQChunkBytes), 16);
      const uint64_t b = step_descriptor(b0, k_addr, kmajor_step_bytes(kk, Tile::kKvChunkBytes), 16);
      if constexpr (Tile::kBlockN == 128) wgmma_m64n128k16<0, 0>(WgmmaTag<T>{}, s_flat, a, b, kk > 0);
      else wgmma_m64n64k16<0, 0>(WgmmaTag<T>{}, s_flat, a, b, kk > 0);
    }
    wgmma_commit();
  };
  // O += P_{j-1} V_{j-1} issued. A stand-in (a tile's S_0 with no pending tile) multiplies
  // whatever O and P hold by K_0's stage (full: S_0 waited for it): its result is discarded,
  // and it keeps the S_0 step one straight line of wgmma groups (see below). K_0's stage is
  // then released only once the stand-in is done.
  auto issue_pv = [&](bool stand_in = false) {
    const uint32_t v_addr = descriptor_address(static_cast<uint32_t>(
        __cvta_generic_to_shared(stand_in ? kv_smem(k_ring.stage, 0) : kv_smem(v_ring.stage, 1))));
    if (!stand_in) mbarrier_wait(&v_full[v_ring.stage], v_ring.phase);
    if (from_cache) fence_async_shared();
    wgmma_fence();  // after the wait: else ptxas injects the fence itself (C7519)
    const uint64_t b0 = smem_descriptor(v_addr, Tile::kKvChunkBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
      const uint64_t b = step_descriptor(b0, v_addr, 2048 * kk, Tile::kKvChunkBytes);
      if constexpr (kHeadDim == 256) wgmma_m64n256k16_rs<1>(WgmmaTag<T>{}, o_flat, pa[kk], b, true);
      else if constexpr (kHeadDim == 128) wgmma_m64n128k16_rs<1>(WgmmaTag<T>{}, o_flat, pa[kk], b, true);
      else if constexpr (kHeadDim == 96) wgmma_m64n96k16_rs<1>(WgmmaTag<T>{}, o_flat, pa[kk], b, true);
      else wgmma_m64n64k16_rs<1>(WgmmaTag<T>{}, o_flat, pa[kk], b, true);
    }
    wgmma_commit();
  };
  auto release = [&](uint64_t* empty, RingState<Tile::kStages>& ring) {
    if (leader) mbarrier_arrive(&empty[ring.stage]);
    ring.advance();
  };
  // After the P V in flight: V's stage is free.
  auto pv_done = [&]() {
    wgmma_wait<0>();
    wgmma_fence_operands(o_flat);
    wgmma_fence_operands(pa);
    release(v_empty, v_ring);
  };
  // O / row sum rounded to 16 bits once for either store path, as the A fragments of
  // m64k16 steps (whose register order is stmatrix's).
  uint32_t o_packed[kHeadDim / 16][4];
  auto pack_output = [&]() {
    OnlineSoftmax<1>::rescale(o, inv_sum);
    accumulators_as_a<T>(o_packed, o);
  };
  // The packed O and lse to the rows of `rows`. With kTmaOut (D = 96 and 128; D = 256 in
  // kOutRounds rounds of 128 columns) every warp writes its 16 rows into its part of the
  // consumer's boxes (after its previous store read them) on every path, kTmaOut's note
  // says why; a warp whose rows TMA can store (all in the sequence, or past the tensor's end
  // where TMA skips them) stores those, the others (a varlen sequence's last partial rows,
  // an out TMA cannot address) store from registers.
  const uint32_t out_boxes =
      static_cast<uint32_t>(__cvta_generic_to_shared(base + Tile::kOutOffset)) + consumer * Tile::kOutConsumerBytes;
  auto store_output = [&](const Rows& rows) {
    const int warp_first = rows.first - lane / 4;
    const bool tma = Tile::kTmaOut && maps.tma_out && (!varlen || warp_first + 16 <= rows.end);
    if constexpr (Tile::kTmaOut) {
#pragma unroll
      for (int round = 0; round < Tile::kOutRounds; ++round) {
        if (lane == 0) tma_store_wait_read();
        __syncwarp();
        constexpr int kGroups = Tile::kOutGroups;
        store_fragments_swizzled<16 * kGroups>(
            out_boxes, reinterpret_cast<const uint32_t(&)[kGroups][4]>(o_packed[kGroups * round]));
        fence_async_shared();
        __syncwarp();
        if (tma && lane == 0 && warp_first < rows.end) {
#pragma unroll
          for (int c = 0; c < Tile::kOutBoxes; ++c)
            tma_store_4d(&maps.out,
                         base + Tile::kOutOffset + consumer * Tile::kOutConsumerBytes + c * 8192 + 2048 * warp,
                         64 * (Tile::kOutBoxes * round + c), rows.map_row, rows.head, rows.map_batch);
          tma_store_commit();
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = rows.first + 8 * half;
      if (row >= rows.end) continue;
      if (!tma) {
        T* out_row = rows.out + row * p.out.row_stride + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
          *reinterpret_cast<uint32_t*>(out_row + 8 * dt) = o_packed[dt / 2][2 * (dt % 2) + half];
      }
      if (rows.lse && lane % 4 == 0) rows.lse[row] = row_lse[0][half];
    }
  };
  // The pending tile's last P V alone (no next S GEMM to ride with), then its output.
  auto flush_pending = [&]() {
    if (!pending) return;
    wgmma_fence();
    issue_pv();
    pv_done();
    pack_output();
    store_output(pending_rows);
    pending = false;
  };

  for_each_attention_tile(p, schedule, [&](const AttentionTileCoord& c) {
    SequenceBounds seq;
    int m0, j0, n_blocks;
    tile_work(c, seq, m0, j0, n_blocks);
    if (m0 >= seq.seqlen_q) return;
    const int causal_shift = seq.seqlen_k - seq.seqlen_q;
    // The head's sink in log2 units (-inf: none), read where a row finishes (not held across
    // the loop: the 3-consumer tile has no register to spare).
    auto sink_log2 = [&]() { return kVariants && p.variants.sinks ? p.variants.sinks[c.head] * 1.4426950408889634f : -INFINITY; };
    const Rows rows{static_cast<T*>(p.out.data) + c.batch * p.out.batch_stride + c.head * p.out.head_stride +
                        seq.q_start * p.out.row_stride,
                    p.lse ? p.lse + p.lse_offset(c.batch, c.head) + seq.q_start : nullptr,
                    m0 + row_in_tile, seq.seqlen_q,
                    static_cast<int32_t>(seq.q_start + m0 + 64 * consumer + 16 * warp), c.head, varlen ? 0 : c.batch};
    softmax = OnlineSoftmax<1>();
    if (n_blocks == 0) {  // no key to see: O = 0, lse = -inf
      flush_pending();
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) o_flat[i] = 0.0f;
      softmax.finish(inv_sum, row_lse, p.scale_log2, sink_log2());
      pack_output();
      store_output(rows);
      return;
    }
    const int q_buffer = q_ring.stage;
    const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(q_smem(q_buffer))) + consumer * 64 * 128;
    // After the tile's last S GEMM: Q is free for the next tile's.
    auto release_q = [&]() {
      if (leader) mbarrier_arrive(&q_empty[q_buffer]);
      q_ring.advance();
    };
    // The softcap, then the mask of S_j where its block crosses the sequence end, the causal
    // diagonal or the window's left edge of one of this consumer's 64 rows, then the online
    // softmax; returns whether O must be rescaled by `correction`.
    auto softmax_scores = [&](float (&s)[1][kNTiles][4], int j, float (&correction)[1][2]) {
      const int n0 = j * Tile::kBlockN;
      if (kVariants && p.variants.softcap > 0.0f) softcap_scores(s, p.variants.softcap / p.scale, p.scale / p.variants.softcap);
      const bool crosses_end = n0 + Tile::kBlockN > seq.seqlen_k;
      const bool crosses_diagonal = p.causal && n0 + Tile::kBlockN - 1 > m0 + 64 * consumer + causal_shift;
      const int window = kVariants ? p.variants.window : 0;
      const bool crosses_window = window > 0 && m0 + 64 * consumer + 64 + causal_shift - window > n0;
      if (crosses_end || crosses_diagonal || crosses_window)
        mask_scores(s, m0 + row_in_tile - n0, 2 * (lane % 4), seq.seqlen_k - n0, p.causal, causal_shift, window);
      return softmax.template update_scores<Tile::kExp2FmaEvery>(s, correction, p.scale_log2);
    };

    // S_0. With the cross-tile step: beside the pending tile's last P V when there is one
    // (a pingpong turn, as in the loop below), that tile's output stored once its P V is
    // done; without a pending tile a stand-in P V takes its place: ptxas tracks wgmma groups
    // without branch conditions, and a P V issued or waited for on one path only made it
    // serialize every wgmma of the kernel (C7513, C7519).
    // Without the step, S_0 alone.
    mbarrier_wait(&q_full[q_buffer], q_ring.phase);
    {
      float s[1][kNTiles][4], correction[1][2];
      const bool overlap = Tile::kCrossTile && pending;
      const bool stand_in = Tile::kCrossTile && !pending;
      if (Tile::kPingpong && overlap) named_barrier_sync(1 + consumer, kPairThreads);
      wgmma_fence();
      issue_scores(s, q_addr);
      if (Tile::kCrossTile) issue_pv(stand_in);
      if (Tile::kPingpong && overlap) named_barrier_arrive(next_turn, kPairThreads);
      wgmma_wait<Tile::kCrossTile ? 1 : 0>();  // S_0
      wgmma_fence_operands(reinterpret_cast<float(&)[Tile::kBlockN / 2]>(s));
      if (!stand_in) release(k_empty, k_ring);
      if (n_blocks - j0 == 1) release_q();
      softmax_scores(s, j0, correction);  // the first block: nothing to rescale
      wgmma_wait<0>();
      wgmma_fence_operands(o_flat);
      wgmma_fence_operands(pa);
      if (stand_in) release(k_empty, k_ring);
      if (Tile::kCrossTile) pack_output();  // the pending tile's O, or the stand-in's garbage
      if (overlap) {
        release(v_empty, v_ring);
        store_output(pending_rows);
        pending = false;
      }
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) o_flat[i] = 0.0f;
      accumulators_as_a<T>(pa, s);
    }
    for (int j = j0 + 1; j < n_blocks; ++j) {
      float s[1][kNTiles][4], correction[1][2];
      if constexpr (Tile::kPingpong) named_barrier_sync(1 + consumer, kPairThreads);
      wgmma_fence();
      issue_scores(s, q_addr);
      issue_pv();
      if constexpr (Tile::kPingpong) named_barrier_arrive(next_turn, kPairThreads);
      wgmma_wait<1>();
      wgmma_fence_operands(reinterpret_cast<float(&)[Tile::kBlockN / 2]>(s));
      release(k_empty, k_ring);
      if (j == n_blocks - 1) release_q();
      const bool rescale = softmax_scores(s, j, correction);
      pv_done();
      accumulators_as_a<T>(pa, s);
      if (rescale) OnlineSoftmax<1>::rescale(o, correction);
    }
    softmax.finish(inv_sum, row_lse, p.scale_log2, sink_log2());  // no score is added after the last block
    pending_rows = rows;
    pending = true;
    if constexpr (!Tile::kCrossTile) flush_pending();
  });
  flush_pending();
  // The last TMA stores must have read their boxes before the block's shared memory goes.
  if (Tile::kTmaOut && lane == 0) tma_store_wait_read();
#endif
}

}  // namespace llmk::detail::sm90
