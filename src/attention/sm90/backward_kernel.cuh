// Attention backward main kernel on Hopper (sm_90a): TMA + wgmma, warp-specialized. The
// algorithm is the sm_80 main kernel's (sm80/backward_kernel.cuh: the same rows kernel
// before it for D = rowsum(dO * O), the same dq conversion after it); one block owns
// kBlockN = 128 keys of one (kv head, batch entry) and walks the query tiles of every query
// head of the kv head's group that see them:
//
//   warpgroup 0, the producer (24 registers; 40 persistent at D = 64): thread 0 loads K_j and V_j,
//     then Q_i and dO_i of each query tile into a 2-stage ring (Q and dO on their own barriers);
//     warp 1 writes lse_i log2(e) and D_i of the tile's rows beside them (+inf and 0 past the
//     sequence end, so those columns of P and dS are 0 without a mask) and arrives on Q's barrier;
//     warps 2 and 3 add consumer 0's and 1's share of each tile's dQ to the fp32 accumulator (two
//     TMA reduce-adds, cp.reduce.async.bulk.tensor) once the consumer has written it to shared
//     memory, and tell the consumer when the reduction has read it (named barriers: the consumers
//     neither issue nor wait for the bulk operations);
//   warpgroups 1 and 2, the consumers (240 registers; 232 persistent at D = 64), 64 keys each:
//     S^T  = K Q_i^T        wgmma SS, m64 n(kBlockM), both K-major
//     dP^T = V dO_i^T       wgmma SS, issued before S^T's softmax so the two overlap
//     P^T  = exp2(S^T scale log2 e - lse_i log2 e), masked at the sequence end and diagonal
//     dS^T = P^T (dP^T - D_i), to shared memory (stmatrix, swizzled)
//     the GEMMs issued in this order, dV and dQ waited for, dK left running:
//     dV  += P^T dO_i       wgmma RS (P^T is the accumulator of S^T: already an A fragment),
//                           dO_i MN-major
//     dQ_i = dS K            after both consumers meet (named barrier): wgmma SS, A = dS^T
//                           read MN-major, B = K MN-major; each consumer takes 64 x 64 of
//                           the kBlockM x D tile; each warp writes its 16 rows into the
//                           consumer's two swizzled fp32 boxes while dK runs and arrives
//                           on the producer warp's barrier
//     dK  += dS^T Q_i       wgmma RS; at D = 128 still running over the next tile's S^T
//                           and dP^T (kDkAcrossTiles), at D = 64 waited for at the tile's end
//   kDqOfPreviousTile (D = 64, long walks): the consumers never meet; each issues dQ_{i-1}
//     after dV_i, behind an mbarrier on the other's half of dS^T_{i-1} (a second mbarrier frees
//     a dS^T buffer for its next use), and the last tile's dQ after the walk;
//   dK (times scale) and dV rounded and stored from registers at the end.
// Every GEMM forms its wgmma descriptors once and moves them on by a 32-bit add per k-step
// (descriptor_advanced), where ptxas rebuilt them from the address each step: fewer SASS
// instructions in the key-block loop; faster at D = 64 on long walks, even at D = 128.
// The key block's K and V stay in shared memory for the whole walk; Q_i/dO_i of the next
// tile load while this one computes. The consumers run ahead by one tile (the dQ boxes'
// empty barrier).
//
// Persistent grid (kPersistent: dense non-causal calls at D = 64, 96 and 128, as
// sm90/backward.cu's persistent_grid picks them): one CTA per SM walks units (a key
// block of a kv head and batch entry) at a stride. Each role walks the same units; the Q/dO ring
// and the dS^T buffers' phases go on across units, a kv_empty mbarrier passes K and V to the
// next unit once the last GEMMs of the unit before completed, and the dQ boxes' last wait runs
// once after the CTA's last unit. It hides the stores, the next unit's first Q/dO loads and the
// launch of a block (a fixed cost per block, large beside a tile's). The next unit's K/V
// load waits for those GEMMs; a second K buffer that hid it did not pay
// (docs/history/attention.md).
//
// Deterministic (bp.dq_ordered): the producer warps add each tile's dQ in a fixed order of
// its key blocks, with a turn counter per (tile, consumer half) in the workspace (one per tile,
// passed jointly, where the consumers split its columns: reduce_dq_shares):
//   non-causal, key block n after key blocks 0..n-1 of the same kv head; or, where the
//     sequence's key blocks fit the SMs (rotate_walk), each block's walk starts at its own
//     share of the tiles and wraps around, and the turns follow the order in which the blocks
//     reach a tile. Unrotated, every block waits on the same tile at the start and block n
//     stays n turns behind for the whole walk (rotated, the walk comes closer to the
//     default path's speed);
//   causal, from the tile's last key block down, with the grid's key blocks dispatched last
//     first.
// Unrotated, a block only waits on blocks dispatched before it (running or done), provided
// blocks are dispatched in blockIdx order (x fastest), which CUDA does not document but
// FlashAttention 3's deterministic backward relies on too; rotated, it may wait on a block of
// its sequence dispatched after it, which the same order dispatches as long as the
// sequence's key blocks fit the SMs. The default path rotates its non-causal walks only
// with the first store (below; rotation alone does not pay), so that each tile's first
// block is a step ahead of the next.
//
// First store (bp.dq_first_store, attention_backward_sm90_plan): where every row of the
// accumulator lies in some key block's tiles (dense calls with keys; causal, seqlen_q <=
// seqlen_k) and the walks are short (up to 4096 keys causal, 1024 non-causal), the rows
// kernel does not zero the accumulator: a tile's rank-0 block (the first turn; default path,
// the rotated walk's first arrival or, causal, the tile's highest key block: both reach the
// tile no later than any other block) stores its dQ share with a TMA store, waits for it to
// complete and sets the tile's counter to 1; the other blocks wait for that before adding.
//
// The ring's barriers order warp 1's ordinary stores of lse and D against the consumers' reads
// (release by mbarrier arrive, acquire by its wait; every consumer warp arrives on `empty`).
// compute-sanitizer racecheck does not follow mbarrier ordering and reports these accesses as
// hazards; staging them in the consumers instead, ordered by __syncwarp or a named barrier
// that racecheck follows, was slower.
//
// Tiles: kBlockM = 128 query rows at D = 64, 64 at D = 96 and 128 (FlashAttention 3's shapes).
// D = 96 runs D = 128's tile on rows of two 64-column swizzle chunks, the second's columns
// past 96 zero-filled by TMA (the maps' rows are 96 wide): S^T and dP^T take 6 k-steps, dV and
// dK are m64n96, consumer 1's dQ share (columns 64-127) computes zeros past 96, which its
// producer warp does not add (reduce_dq_shares skips the box past the accumulator's rows).
// Registers per consumer thread: dK + dV D, S^T + dP^T kBlockM, dQ 32. Shared memory: K, V
// 2 x 128 x 64 x ceil(D / 64) x 2 bytes; Q, dO 2 stages x 2 x kBlockM x 64 x ceil(D / 64) x 2;
// dS^T 2 buffers x 128 x kBlockM x 2; dQ out 32 KB: 192 KB at D = 64, 96 and 128. Roofline: 10 seq_q seq_k D FLOPs per (batch,
// query head) (2.5x the forward), tensor-bound; wgmma's dense bf16 peak ~990 TFLOP/s, with exp2
// and dS on every S^T element and 4 D bytes of dq reductions per (query row, key block).
#pragma once

#include "attention/sm90/backward_walk.cuh"
#include "common/ptx.cuh"
#include "common/sm90/store_tile.cuh"
#include "common/sm90/wgmma.cuh"

namespace llmk::detail::sm90 {

template <int kHeadDim_, bool kPersistent_ = false>
struct AttentionBackwardSm90Tile {
  static constexpr int kHeadDim = kHeadDim_;
  // kPersistent: one CTA per SM walks units (key blocks) at a stride (persistent_ctas in
  // sm90/backward.cu), dense non-causal calls at head dims 64, 96 and 128. At 64 its
  // producer warps hold the unit's walk in registers (40; 24 spilled ~200 bytes) and the
  // consumers fit 232 (kWideProducer). Else the producer keeps 24 and the consumers 240: head
  // dim 128's consumers need them (its persistent producer spills ~220 bytes, outside the GEMM
  // loop; 96's alike), and the wide producer slowed head dim 64's one-block-per-unit causal
  // calls.
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kBlockN = 128, kBlockM = kHeadDim <= 64 ? 128 : 64, kStages = 2, kConsumers = 2;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  // dK += dS^T Q stays in flight over the next tile's S^T and dP^T at D = 96 and 128; at D = 64 the
  // 128-row tile's dS^T fragments (32 registers) beside S^T and dP^T (64 each) spilled and
  // serialized the wgmmas, so there it is waited for at the end of its tile.
  static constexpr bool kDkAcrossTiles = kHeadDim >= 96;
  static constexpr bool kWideProducer = kPersistent && kHeadDim == 64;
  static constexpr int kProducerRegisters = kWideProducer ? 40 : 24, kConsumerRegisters = kWideProducer ? 232 : 240;
  static constexpr int kChunks = (kHeadDim + 63) / 64;  // 64-column swizzle chunks of a row (D = 96: 2)
  static constexpr uint32_t kKvChunkBytes = kBlockN * 128, kKvBytes = kChunks * kKvChunkBytes;
  static constexpr uint32_t kQChunkBytes = kBlockM * 128, kQBytes = kChunks * kQChunkBytes;
  // dS^T: per consumer (64 keys), kBlockM / 64 boxes of 64 keys x 64 query columns.
  static constexpr uint32_t kDsHalfBytes = (kBlockM / 64) * 8192, kDsBytes = 2 * kDsHalfBytes;
  static constexpr uint32_t kK = 0, kV = kKvBytes, kQ = 2 * kKvBytes, kDo = kQ + kStages * kQBytes;
  static constexpr uint32_t kDs = kDo + kStages * kQBytes;  // two buffers
  // dQ out: per consumer, its 64 rows x 64 float columns as two TMA boxes of 64 rows x 32
  // floats (128 bytes, swizzled), 8 KB each; warp w writes rows 16w..16w+15 of both.
  static constexpr uint32_t kDqBoxBytes = 8192, kDq = kDs + 2 * kDsBytes;
  static constexpr uint32_t kRows = kDq + kConsumers * 2 * kDqBoxBytes;
  // Named barriers: 1 both consumers (dS^T written); per consumer c, kDqFull + c (its dQ in
  // the boxes: consumer c arrives, producer warp 2 + c waits) and kDqEmpty + c (the
  // reduction read the boxes: the producer warp arrives, the consumer waits), each among
  // the consumer's 128 threads and the producer warp.
  static constexpr int kDqFull = 2, kDqEmpty = 2 + kConsumers;
  static_assert(kDqEmpty + kConsumers <= kJointPassBarrier, "named barriers apart");
  static constexpr uint32_t kBarriers = kRows + 2 * kStages * kBlockM * 4;  // float lse2, D [kStages][kBlockM]
  static constexpr int kSharedBytes = kBarriers + (2 + 3 * kStages + 4) * 8 + 1024;
  static_assert(kSharedBytes <= kMaxBlockSharedBytes, "the tile's shared memory exceeds sm_90's 227 KB");
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128, "D = 64, 96 or 128: dK + dV in registers");
};

// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), one block per unit, or with kPersistent
// fewer CTAs walking the units at a stride (for_each_key_block). Writes dk, dv of each unit's
// keys (0 for keys no query row sees) and adds its share of dq to bp.dq_accum.
// kDqOfPreviousTile: each tile's dQ GEMM is issued during the next tile, after the consumer's
// dV, behind an mbarrier on the other consumer's half of that tile's dS^T, so the consumers
// never meet (head dim 64, long walks: dq_of_previous_tile in sm90/backward.cu); else
// the consumers meet at a named barrier before this tile's dQ.
template <class T, int kHeadDim, bool kDqOfPreviousTile, bool kPersistent, bool kVariants>
__global__ void __launch_bounds__(AttentionBackwardSm90Tile<kHeadDim, kPersistent>::kThreads, 1)
    attention_backward_sm90_kernel(const __grid_constant__ AttentionBackwardSm90Maps maps,
                                   const __grid_constant__ AttentionBackwardParams bp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = AttentionBackwardSm90Tile<kHeadDim, kPersistent>;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, D = kHeadDim;
  // kVariants: the score variants compiled in (window, softcap; the sinks are in the forward's
  // lse already), one-block-per-unit walks only: the plain calls' kernels carry none of it.
  static_assert(!kVariants || !kPersistent, "the score variants' kernels walk one unit per block");
  using Walk = KeyBlockWalk<M, N, kVariants>;
  const AttentionParams& p = bp.fwd;
  // One unit per block: its walk, computed here for every role (within the producer's 24
  // registers its computation spilled); persistent: each role walks the CTA's units.
  const Walk block_walk(bp);
  if (!kPersistent && block_walk.empty()) return;
  auto for_each_unit = [&](auto&& f) {
    if constexpr (kPersistent) for_each_key_block<M, N>(bp, f);
    else f(block_walk);
  };

  extern __shared__ uint8_t shared_raw[];
  uint8_t* base = aligned_shared_base(shared_raw);
  float* row_lse2 = reinterpret_cast<float*>(base + Tile::kRows);  // [kStages][M]
  float* row_delta = row_lse2 + Tile::kStages * M;                  // [kStages][M]
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Tile::kBarriers);
  uint64_t* kv_empty = kv_full + 1;  // kPersistent: the unit's last GEMMs that read K and V completed
  uint64_t* q_full = kv_empty + 1;   // Q_i's bytes and warp 1's arrival (lse2, D written)
  uint64_t* do_full = q_full + Tile::kStages;
  uint64_t* q_empty = do_full + Tile::kStages;
  // kDqOfPreviousTile, dS^T buffer b: ds_full[b] both consumers' halves written, ds_free[b]
  // both consumers' dQ GEMMs that read it completed (every consumer warp arrives on each).
  uint64_t* ds_full = q_empty + Tile::kStages;
  uint64_t* ds_free = ds_full + 2;

  if (threadIdx.x == 0) {
    mbarrier_init(kv_full, 1);
    if constexpr (kPersistent) mbarrier_init(kv_empty, Tile::kConsumers * 4);  // every consumer warp
    for (int s = 0; s < Tile::kStages; ++s) {
      mbarrier_init(&q_full[s], 2);
      mbarrier_init(&do_full[s], 1);
      mbarrier_init(&q_empty[s], Tile::kConsumers * 4);
    }
    if constexpr (kDqOfPreviousTile) {
      for (int b = 0; b < 2; ++b) {
        mbarrier_init(&ds_full[b], Tile::kConsumers * 4);
        mbarrier_init(&ds_free[b], Tile::kConsumers * 4);
      }
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // Consumer c's share of a tile's dQ: 64 rows x 64 columns of the kBlockM x D tile.
  auto dq_row0 = [](int c) { return M == 128 ? 64 * c : 0; };
  auto dq_col0 = [](int c) { return M == 128 ? 0 : 64 * c; };

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<Tile::kProducerRegisters>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (warp == 1) {
      RingState<Tile::kStages> ring;
      for_each_unit([&](const Walk& walk) {
        write_row_stats<Tile::kStages>(walk, bp, row_lse2, row_delta, q_full, q_empty, ring);
      });
    }
    if (warp == 2 || warp == 3) {
      const int c = warp - 2;
      // One joint turn per tile where the consumers split its columns (M = 64: head dims 96,
      // 128); at M = 128 (head dim 64) each consumer's rows take their own turns.
      for_each_unit([&](const Walk& walk) {
        reduce_dq_shares<1, M == 64>(walk, bp, &maps.dq_accum, base + Tile::kDq + c * 2 * Tile::kDqBoxBytes,
                                     Tile::kDqBoxBytes, c, dq_row0(c), dq_col0(c), Tile::kDqFull + c,
                                     Tile::kDqEmpty + c);
      });
    }
    if (threadIdx.x == 0) {
      RingState<Tile::kStages> ring;
      uint32_t kv_phase = 0;
      for_each_unit([&](const Walk& walk) {
        if (walk.n_iters == 0) return;
        // The unit's K and V once the consumers' last GEMMs of the unit before have read theirs.
        if constexpr (kPersistent) {
          mbarrier_wait(kv_empty, kv_phase ^ 1u);
          kv_phase ^= 1u;
        }
        load_key_block<Tile::kChunks>(walk, maps, base + Tile::kK, base + Tile::kV, Tile::kKvChunkBytes, kv_full);
        for (int it = 0; it < walk.n_iters; ++it) {
          int head, m0;
          walk.tile(it, head, m0);
          const int32_t q_row = static_cast<int32_t>(walk.seq.q_start + m0);
          mbarrier_wait(&q_empty[ring.stage], ring.phase ^ 1u);
          mbarrier_arrive_expect_tx(&q_full[ring.stage], Tile::kQBytes);
          tma_load_4d_chunks<Tile::kChunks>(base + Tile::kQ + ring.stage * Tile::kQBytes, Tile::kQChunkBytes,
                                            &maps.q, &q_full[ring.stage], q_row, head, walk.map_batch);
          mbarrier_arrive_expect_tx(&do_full[ring.stage], Tile::kQBytes);
          tma_load_4d_chunks<Tile::kChunks>(base + Tile::kDo + ring.stage * Tile::kQBytes, Tile::kQChunkBytes,
                                            &maps.dout, &do_full[ring.stage], q_row, head, walk.map_batch);
          ring.advance();
        }
      });
    }
    return;
  }

  warpgroup_claim_registers<Tile::kConsumerRegisters>();
  const int consumer = wg - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(base));
  const uint32_t k_addr = smem + Tile::kK, v_addr = smem + Tile::kV;
  const int dq_row0_c = dq_row0(consumer), dq_col0_c = dq_col0(consumer);

  // Every consumer warp arrives (warp_arrive), after its wait: on q_empty[s] once both
  // consumers' GEMMs that read stage s (Q, dO) completed and their warps read its lse2 and D; on
  // kv_empty once the unit's GEMMs that read K and V completed; on ds_full, ds_free.
  // dQ = dS K over the 128 keys of one tile's dS^T buffer: k16 step kk is in consumer kk / 4's
  // half.
  auto issue_dq = [&](float(&dq)[32], uint32_t ds_addr) {
    wgmma_fence();
    const uint64_t a0 = smem_descriptor(ds_addr + (dq_row0_c / 64) * 8192, 8192, 1024);
    const uint64_t b0 = smem_descriptor(k_addr + (dq_col0_c / 64) * Tile::kKvChunkBytes, Tile::kKvChunkBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      const uint64_t a = descriptor_advanced(a0, (kk / 4) * Tile::kDsHalfBytes + 2048 * (kk % 4));
      const uint64_t b = descriptor_advanced(b0, 2048 * kk);
      wgmma_m64n64k16<1, 1>(WgmmaTag<T>{}, dq, a, b, kk > 0);
    }
    wgmma_commit();
  };
  // The warp's 16 rows of dQ into the consumer's boxes once the previous round's reduction has
  // read them (boxes_used: this unit's rounds before; with kPersistent, an earlier unit's too);
  // producer warp 2 + consumer adds them to the accumulator (rows past the sequence end carry
  // exact zeros, their P and dS are 0; past the tensor's rows TMA skips them) while dK runs.
  bool earlier_units_wrote_dq = false;
  auto write_dq = [&](const float(&dq)[32], bool boxes_used) {
    write_dq_round(smem + Tile::kDq + consumer * 2 * Tile::kDqBoxBytes + warp * 2048, Tile::kDqBoxBytes, dq,
                   boxes_used || earlier_units_wrote_dq, Tile::kDqFull + consumer, Tile::kDqEmpty + consumer);
  };
  RingState<Tile::kStages> ring;
  uint32_t kv_phase = 0;
  int tiles_before = 0;  // the CTA's tiles in its units before this one: the dS^T buffers' uses
  for_each_unit([&](const Walk& walk) {
    const int n0 = walk.n0, n_iters = walk.n_iters;
    const SequenceBounds& seq = walk.seq;
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;
    // dS^T as the A fragments of dK += dS^T Q: that GEMM is still running when the next
    // tile's S^T and dP^T are issued, so the fragments live across iterations.
    uint32_t dsa[M / 16][4];
    if (n_iters > 0) mbarrier_wait(kv_full, kv_phase);
    for (int it = 0; it < n_iters; ++it) {
      int head, m0;
      walk.tile(it, head, m0);
      const uint32_t q_addr = smem + Tile::kQ + ring.stage * Tile::kQBytes;
      const uint32_t do_addr = smem + Tile::kDo + ring.stage * Tile::kQBytes;
      const float* lse2 = row_lse2 + ring.stage * M;
      const float* delta = row_delta + ring.stage * M;

      // S^T = K Q^T and dP^T = V dO^T for the consumer's 64 keys, K-major operands.
      float s[1][M / 8][4], dp[1][M / 8][4];
      auto& s_flat = reinterpret_cast<float(&)[M / 2]>(s);
      auto& dp_flat = reinterpret_cast<float(&)[M / 2]>(dp);
      auto scores = [&](float(&acc)[M / 2], uint32_t rows_addr, uint32_t cols_addr) {
        const uint64_t a0 = smem_descriptor(rows_addr + consumer * 64 * 128, 16, 1024);
        const uint64_t b0 = smem_descriptor(cols_addr, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint64_t a = descriptor_advanced(a0, kmajor_step_bytes(kk, Tile::kKvChunkBytes));
          const uint64_t b = descriptor_advanced(b0, kmajor_step_bytes(kk, Tile::kQChunkBytes));
          if constexpr (M == 128) wgmma_m64n128k16<0, 0>(WgmmaTag<T>{}, acc, a, b, kk > 0);
          else wgmma_m64n64k16<0, 0>(WgmmaTag<T>{}, acc, a, b, kk > 0);
        }
        wgmma_commit();
      };
      mbarrier_wait(&q_full[ring.stage], ring.phase);
      wgmma_fence();
      scores(s_flat, k_addr, q_addr);
      mbarrier_wait(&do_full[ring.stage], ring.phase);
      wgmma_fence();  // dP^T's accumulators: else ptxas injects the fence itself (C7519)
      scores(dp_flat, v_addr, do_addr);
      // The previous tile's dK and this S^T are done: that tile's stage (Q read by dK) is free.
      wgmma_wait<1>();
      wgmma_fence_operands(s_flat);
      if constexpr (Tile::kDkAcrossTiles) {
        wgmma_fence_operands(dk);
        wgmma_fence_operands(dsa);
      }
      static_assert(Tile::kStages == 2, "the previous tile's stage is ring.stage ^ 1");
      if (Tile::kDkAcrossTiles && it > 0) warp_arrive(&q_empty[ring.stage ^ 1], lane);

      const int key0 = n0 + 64 * consumer + 16 * warp;  // the warp's first key
      const bool causal = !kPersistent && p.causal;  // persistent calls are non-causal
      // A sliding window (kVariants, causal): key j is left of query m0 + col's window where j <=
      // m0 + col + shift - window; the warp's tile needs the mask where its first key is left of
      // its last query's.
      const int window = kVariants ? p.variants.window : 0;
      const bool need_mask = key0 + 16 > seq.seqlen_k || (causal && key0 + 15 > m0 + walk.shift) ||
                             (window > 0 && key0 <= m0 + M - 1 + walk.shift - window);
      auto lse2_of = [&](int, int nt, int i) { return lse2[nt * 8 + 2 * (lane % 4) + (i & 1)]; };
      auto masked = [&](int row, int col) {
        const int j = key0 + row;
        return j >= seq.seqlen_k || (causal && j > m0 + col + walk.shift) ||
               (window > 0 && j <= m0 + col + walk.shift - window);
      };
      const float softcap = kVariants ? p.variants.softcap : 0.0f;
      bwd::probabilities(s, p.scale_log2, lane, lse2_of, need_mask, masked, softcap > 0.0f ? softcap / p.scale : 0.0f,
                         softcap > 0.0f ? p.scale / softcap : 0.0f);

      // dS^T = P^T (dP^T - D); P^T and dS^T rounded and packed as the A fragments of dV += P^T
      // dO and dK += dS^T Q (B = dO, Q [kBlockM rows][D], MN-major). Issuing dV before the wait
      // for dP^T keeps P^T's fragments live beside S^T, dP^T, dK and dV: it spilled and ran
      // slower.
      auto add_product = [&](float(&acc)[D / 2], const uint32_t(&a)[M / 16][4], uint32_t b_addr) {
        wgmma_fence();
        const uint64_t b0 = smem_descriptor(b_addr, Tile::kQChunkBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < M / 16; ++kk) {
          const uint64_t b = descriptor_advanced(b0, 2048 * kk);
          if constexpr (D == 128) wgmma_m64n128k16_rs<1>(WgmmaTag<T>{}, acc, a[kk], b, true);
          else if constexpr (D == 96) wgmma_m64n96k16_rs<1>(WgmmaTag<T>{}, acc, a[kk], b, true);
          else wgmma_m64n64k16_rs<1>(WgmmaTag<T>{}, acc, a[kk], b, true);
        }
        wgmma_commit();
      };
      wgmma_wait<0>();
      wgmma_fence_operands(dp_flat);
      bwd::score_gradients(dp, s, [&](int, int nt, int i) { return delta[nt * 8 + 2 * (lane % 4) + (i & 1)]; });
      if (softcap > 0.0f) bwd::softcap_gradients(dp, s, lse2_of, softcap * 1.4426950408889634f);
      uint32_t pa[M / 16][4];
      accumulators_as_a<T>(pa, s);
      accumulators_as_a<T>(dsa, dp);

      // Order dV, dQ, dK: dQ's write-out then runs beside dK, which at D = 128 also stays in
      // flight over the next tile's S^T and dP^T. dQ is this tile's once both consumers meet, or
      // with kDqOfPreviousTile the previous tile's; the first tile then issues a stand-in on the
      // other buffer and drops it, as no wgmma may sit under a branch (ptxas would serialize them
      // all). dq lives in this scope (declared beside dk and dv, ptxas spilled 264-396 bytes).
      {
        // Without kDqOfPreviousTile, a unit's first tile may take either buffer: the other
        // consumer left the unit before only after its last dQ GEMM (kv_empty).
        const int t = kDqOfPreviousTile ? tiles_before + it : it, b = t & 1;
        const uint32_t ds_addr = smem + Tile::kDs + b * Tile::kDsBytes;
        // The buffer was last read by both consumers' dQ GEMMs of tile t - 2 (without
        // kDqOfPreviousTile the consumers met after those completed).
        if constexpr (kDqOfPreviousTile) mbarrier_wait(&ds_free[b], ((t >> 1) & 1) ^ 1u);
        store_fragments_swizzled<M>(ds_addr + consumer * Tile::kDsHalfBytes, dsa);
        fence_async_shared();
        if constexpr (kDqOfPreviousTile) warp_arrive(&ds_full[b], lane);
        add_product(dv, pa, do_addr);
        if constexpr (!kDqOfPreviousTile) named_barrier_sync(1, Tile::kConsumers * kWarpgroupThreads);
        else if (it > 0) mbarrier_wait(&ds_full[b ^ 1], ((t - 1) >> 1) & 1);
        float dq[32];
        issue_dq(dq, kDqOfPreviousTile ? smem + Tile::kDs + (b ^ 1) * Tile::kDsBytes : ds_addr);
        add_product(dk, dsa, q_addr);
        wgmma_wait<1>();  // dV and dQ
        wgmma_fence_operands(dq);
        wgmma_fence_operands(dv);
        wgmma_fence_operands(pa);
        if constexpr (!kDqOfPreviousTile) {
          write_dq(dq, it > 0);
        } else if (it > 0) {
          warp_arrive(&ds_free[b ^ 1], lane);
          write_dq(dq, it > 1);
        }
      }
      if constexpr (!Tile::kDkAcrossTiles) {
        wgmma_wait<0>();
        wgmma_fence_operands(dk);
        wgmma_fence_operands(dsa);
        warp_arrive(&q_empty[ring.stage], lane);
      }
      ring.advance();
    }
    // Once the unit's last GEMMs completed, K and V are free for the CTA's next unit, and at
    // D = 128 (kDkAcrossTiles) the last tile's Q stage, which its dK read (at D = 64 each tile
    // freed its own).
    auto release_key_block = [&] {
      if constexpr (kPersistent) {
        if (n_iters > 0) {
          warp_arrive(kv_empty, lane);
          if constexpr (Tile::kDkAcrossTiles) warp_arrive(&q_empty[ring.stage ^ 1], lane);
          kv_phase ^= 1u;
        }
      }
    };
    // The last tile's dK, and with kDqOfPreviousTile its dQ (a dropped stand-in on an empty walk).
    const int last = tiles_before + n_iters - 1;
    if constexpr (kDqOfPreviousTile) {
      if (n_iters > 0) mbarrier_wait(&ds_full[last & 1], (last >> 1) & 1);
      float dq[32];
      issue_dq(dq, smem + Tile::kDs + (n_iters > 0 ? last & 1 : 1) * Tile::kDsBytes);
      wgmma_wait<0>();
      wgmma_fence_operands(dq);
      release_key_block();
      if (n_iters > 0) {
        warp_arrive(&ds_free[last & 1], lane);
        write_dq(dq, n_iters > 1);
      }
    } else {
      wgmma_wait<0>();
      release_key_block();
    }
    wgmma_fence_operands(dk);
    wgmma_fence_operands(dsa);
    if (n_iters > 0) {
      // The last reduction has read the boxes (every arrival of the producer warp is matched);
      // persistent: once after the last unit, so that the CTA goes on to the next unit without
      // waiting (it pays deterministic). One block per unit waits here: at head dim 128 the
      // wait after the dk and dv stores ran slower.
      if constexpr (kPersistent) earlier_units_wrote_dq = true;
      else named_barrier_sync(Tile::kDqEmpty + consumer, kDqBarrierThreads);
    }
    if constexpr (kPersistent && kDqOfPreviousTile) tiles_before += n_iters;

    // dk = scale * sum dS^T Q and dv, rounded, stored from registers: the consumer's 64 keys.
    store_key_rows<T, D>(bp.dk, dk, p.scale, walk, 64 * consumer, 0);
    store_key_rows<T, D>(bp.dv, dv, 1.0f, walk, 64 * consumer, 0);
  });
  if (kPersistent && earlier_units_wrote_dq) named_barrier_sync(Tile::kDqEmpty + consumer, kDqBarrierThreads);
#endif
}

}  // namespace llmk::detail::sm90
