// Attention backward main kernel on Hopper (sm_90a) for head dim 256: the algorithm and the
// producer of sm90/backward_kernel.cuh (its walk, dq turns and first store through
// sm90/backward_walk.cuh), with the work split between the two consumers by
// columns of D instead of by keys. At D = 256 a consumer's dK + dV over 64 keys and all of D
// would take 256 registers per thread; here each consumer owns the block's 64 keys x 128
// columns of dK and dV (128 registers), so the scores are computed once and shared through
// shared memory:
//
//   block: 64 keys of one (kv head, batch entry); query tiles of 64 rows;
//   warpgroup 0, the producer (24 registers): thread 0 loads K and V once, Q_i into a 2-stage
//     ring and dO_i into one stage (both 32 KB; shared memory has no room for a second dO);
//     warp 1 writes lse_i log2(e) and D_i beside Q's stage; warps 2 and 3 add consumer 0's and
//     1's share of dQ_i to the fp32 accumulator (TMA reduce-adds, two rounds per tile);
//   warpgroups 1 and 2, the consumers (240 registers); consumer c:
//     S^T  = K Q_i^T, dP^T = V dO_i^T for the 64 keys x queries 32c..32c+31 of the tile
//                          (wgmma SS, m64n32, K = 256), dP^T issued before S^T's softmax
//     P^T, dS^T            as the other kernel, rounded and written by stmatrix into the
//                          tile's 64 x 64 P^T and dS^T boxes (128-byte swizzle; two buffers
//                          of each, alternating by tile), then both consumers meet (named
//                          barrier 1): the boxes are whole
//     dV_c += P^T dO_i[:, 128c..]   wgmma SS, m64n128, K = 64 queries; dO MN-major
//     dQ_c  = dS K[:, 128c..]       A = dS^T read MN-major, B = K MN-major
//     dK_c += dS^T Q_i[:, 128c..]   left in flight over the next tile's S^T and dP^T
//     dV and dQ waited for (dO's stage is then free), dQ_c (64 rows x 128 floats) leaves
//     through the consumer's 16 KB of swizzled boxes in two rounds of 64 columns, each added
//     by the producer warp: the first right away, the second held in registers and written
//     while the next tile's S^T and dP^T run.
//   dK (times scale) and dV rounded and stored from registers at the end.
// The double P^T / dS^T buffers need no second barrier: a consumer writes buffer it & 1 only
// after the barrier of tile it - 1, which the other consumer passes after its wait for its
// tile it - 2 GEMMs (dK at the start of tile it - 1).
//
// Descriptors advanced per k-step as in the other kernel (fewer SASS instructions in the loop).
// Registers per consumer thread: dK + dV 128, dQ 64 (from its GEMM to its first round's
// stores; its second round, 32, lives on over the next tile's S^T and dP^T), S^T + dP^T 32.
// Shared memory: K, V 64 KB; Q 2 x 32 KB; dO 32 KB; P^T, dS^T 2 x 16 KB; dQ boxes 32 KB; lse2,
// D 1 KB: 226 KB of sm_90's 227. Roofline: 10 seq_q seq_k D FLOPs per (batch, query head);
// per tile 4 * 64 * 256 bytes of dq reductions for 10.5 MFLOP, 2x head dim 128's ratio (64-key
// blocks). Nsight Compute at 16k tokens: L2 80% (the reductions), shared memory 76%, tensor
// pipe 48% (docs/kernels/attention.md).
#pragma once

#include <type_traits>

#include "attention/sm90/backward_walk.cuh"
#include "common/ptx.cuh"
#include "common/sm90/store_tile.cuh"
#include "common/sm90/wgmma.cuh"

namespace llmk::detail::sm90 {

struct AttentionBackwardSm90Hd256Tile {
  static constexpr int kHeadDim = 256, kBlockM = 64, kBlockN = 64, kStages = 2, kConsumers = 2;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kChunks = kHeadDim / 64;  // 64-column swizzle chunks of a row
  // K, V, Q and dO tiles alike: 64 rows, kChunks chunks of 64 rows x 128 bytes.
  static constexpr uint32_t kChunkBytes = 64 * 128, kTileBytes = kChunks * kChunkBytes;
  static constexpr uint32_t kK = 0, kV = kTileBytes, kQ = 2 * kTileBytes, kDo = kQ + kStages * kTileBytes;
  // Per buffer: P^T (64 keys x 64 queries, one swizzled box), then dS^T.
  static constexpr uint32_t kBoxBytes = 8192, kPdsBytes = 2 * kBoxBytes, kPds = kDo + kTileBytes;
  // dQ out: per consumer two TMA boxes of 64 rows x 32 floats; warp w writes rows 16w..16w+15.
  static constexpr uint32_t kDqBoxBytes = 8192, kDq = kPds + 2 * kPdsBytes;
  static constexpr uint32_t kRows = kDq + kConsumers * 2 * kDqBoxBytes;
  static constexpr int kDqRounds = kHeadDim / kConsumers / 64;
  // Named barriers as in AttentionBackwardSm90Tile: 1 both consumers, kDqFull + c, kDqEmpty + c;
  // kJointPassBarrier (sm90/backward_walk.cuh) the two dq warps.
  static constexpr int kDqFull = 2, kDqEmpty = 2 + kConsumers;
  static_assert(kDqEmpty + kConsumers <= kJointPassBarrier, "named barriers apart");
  static constexpr uint32_t kBarriers = kRows + 2 * kStages * kBlockM * 4;  // float lse2, D [kStages][kBlockM]
  // kv_full, q_full[kStages], q_empty[kStages], do_full, do_empty.
  static constexpr int kSharedBytes = kBarriers + (3 + 2 * kStages) * 8 + 1024;
  static_assert(kSharedBytes <= kMaxBlockSharedBytes, "the tile's shared memory exceeds sm_90's 227 KB");
};

// grid (ceil(seqlen_k / 64), heads_kv, batch). Writes dk, dv of the block's keys (0 for keys
// no query row sees) and adds its share of dq to bp.dq_accum.
template <class T, bool kVariants>
__global__ void __launch_bounds__(AttentionBackwardSm90Hd256Tile::kThreads, 1)
    attention_backward_sm90_hd256_kernel(const __grid_constant__ AttentionBackwardSm90Maps maps,
                                         const __grid_constant__ AttentionBackwardParams bp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = AttentionBackwardSm90Hd256Tile;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, kCols = Tile::kHeadDim / Tile::kConsumers;
  const AttentionParams& p = bp.fwd;
  // kVariants: the score variants compiled in (window, softcap; the sinks are in the forward's
  // lse already): the plain calls' kernel carries none of it.
  const KeyBlockWalk<M, N, kVariants> walk(bp);
  if (walk.empty()) return;
  const int n_iters = walk.n_iters;

  extern __shared__ uint8_t shared_raw[];
  uint8_t* base = aligned_shared_base(shared_raw);
  float* row_lse2 = reinterpret_cast<float*>(base + Tile::kRows);  // [kStages][M]
  float* row_delta = row_lse2 + Tile::kStages * M;                  // [kStages][M]
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Tile::kBarriers);
  uint64_t* q_full = kv_full + 1;  // Q_i's bytes and warp 1's arrival (lse2, D written)
  uint64_t* q_empty = q_full + Tile::kStages;
  uint64_t* do_full = q_empty + Tile::kStages;
  uint64_t* do_empty = do_full + 1;

  if (threadIdx.x == 0) {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < Tile::kStages; ++s) {
      mbarrier_init(&q_full[s], 2);
      mbarrier_init(&q_empty[s], Tile::kConsumers * 4);  // every consumer warp
    }
    mbarrier_init(do_full, 1);
    mbarrier_init(do_empty, Tile::kConsumers * 4);
    mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<24>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (warp == 1) {
      RingState<Tile::kStages> ring;
      write_row_stats<Tile::kStages>(walk, bp, row_lse2, row_delta, q_full, q_empty, ring);
    }
    if (warp == 2 || warp == 3) {
      const int c = warp - 2;
      reduce_dq_shares<Tile::kDqRounds, true>(walk, bp, &maps.dq_accum, base + Tile::kDq + c * 2 * Tile::kDqBoxBytes,
                                              Tile::kDqBoxBytes, c, 0, kCols * c, Tile::kDqFull + c,
                                              Tile::kDqEmpty + c);
    }
    if (threadIdx.x == 0) {
      RingState<Tile::kStages> ring;
      RingState<1> do_ring;
      if (n_iters > 0)
        load_key_block<Tile::kChunks>(walk, maps, base + Tile::kK, base + Tile::kV, Tile::kChunkBytes, kv_full);
      for (int it = 0; it < n_iters; ++it) {
        int head, m0;
        walk.tile(it, head, m0);
        const int32_t q_row = static_cast<int32_t>(walk.seq.q_start + m0);
        mbarrier_wait(&q_empty[ring.stage], ring.phase ^ 1u);
        mbarrier_arrive_expect_tx(&q_full[ring.stage], Tile::kTileBytes);
        tma_load_4d_chunks<Tile::kChunks>(base + Tile::kQ + ring.stage * Tile::kTileBytes, Tile::kChunkBytes, &maps.q,
                                          &q_full[ring.stage], q_row, head, walk.map_batch);
        mbarrier_wait(do_empty, do_ring.phase ^ 1u);
        mbarrier_arrive_expect_tx(do_full, Tile::kTileBytes);
        tma_load_4d_chunks<Tile::kChunks>(base + Tile::kDo, Tile::kChunkBytes, &maps.dout, do_full, q_row, head,
                                          walk.map_batch);
        ring.advance();
        do_ring.advance();
      }
    }
    return;
  }

  warpgroup_claim_registers<240>();
  const int consumer = wg - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(base));
  const uint32_t k_addr = smem + Tile::kK, v_addr = smem + Tile::kV, do_addr = smem + Tile::kDo;
  // The consumer's columns of D: chunks 2c and 2c + 1 of K, Q and dO.
  const uint32_t col_chunk = consumer * (kCols / 64) * Tile::kChunkBytes;

  float dk[kCols / 2], dv[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) dk[i] = dv[i] = 0.0f;
  // dQ_c leaves through the consumer's boxes in kDqRounds rounds of 64 columns, each written
  // once the reduction of the round before has read them (rows past the sequence end carry
  // exact zeros, their P and dS are 0; past the tensor's rows TMA skips them). A tile's first
  // round is written while its dK runs; the second waits in dq_next and is written while the
  // next tile's S^T and dP^T run, so that the consumer does not wait for the reduction to read
  // the first (writing both at once, the consumers stalled on that wait).
  static_assert(Tile::kDqRounds == 2, "one round written at once, one held over");
  const uint32_t boxes = smem + Tile::kDq + consumer * 2 * Tile::kDqBoxBytes + warp * 2048;
  int dq_writes = 0;
  auto write_dq = [&](const float(&round)[32]) {
    write_dq_round(boxes, Tile::kDqBoxBytes, round, dq_writes++ > 0, Tile::kDqFull + consumer,
                   Tile::kDqEmpty + consumer);
  };
  float dq_next[32];
  if (n_iters > 0) mbarrier_wait(kv_full, 0);
  RingState<Tile::kStages> ring;
  RingState<1> do_ring;
  for (int it = 0; it < n_iters; ++it) {
    int head, m0;
    walk.tile(it, head, m0);
    const uint32_t q_addr = smem + Tile::kQ + ring.stage * Tile::kTileBytes;
    const float* lse2 = row_lse2 + ring.stage * M + 32 * consumer;
    const float* delta = row_delta + ring.stage * M + 32 * consumer;

    // S^T = K Q^T and dP^T = V dO^T: the 64 keys x this consumer's 32 queries, K-major.
    float s[1][4][4], dp[1][4][4];
    auto& s_flat = reinterpret_cast<float(&)[16]>(s);
    auto& dp_flat = reinterpret_cast<float(&)[16]>(dp);
    auto scores = [&](float(&acc)[16], uint32_t rows_addr, uint32_t cols_addr) {
      const uint64_t a0 = smem_descriptor(rows_addr, 16, 1024);
      const uint64_t b0 = smem_descriptor(cols_addr + 32 * consumer * 128, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < Tile::kHeadDim / 16; ++kk) {
        const uint32_t step = kmajor_step_bytes(kk, Tile::kChunkBytes);
        const uint64_t a = descriptor_advanced(a0, step);
        const uint64_t b = descriptor_advanced(b0, step);
        wgmma_m64n32k16<0, 0>(WgmmaTag<T>{}, acc, a, b, kk > 0);
      }
      wgmma_commit();
    };
    mbarrier_wait(&q_full[ring.stage], ring.phase);
    wgmma_fence();
    scores(s_flat, k_addr, q_addr);
    mbarrier_wait(do_full, do_ring.phase);
    wgmma_fence();  // dP^T's accumulators: else ptxas injects the fence itself (C7519)
    scores(dp_flat, v_addr, do_addr);
    if (it > 0) write_dq(dq_next);
    // The previous tile's dK and this S^T are done: that tile's Q stage is free.
    wgmma_wait<1>();
    wgmma_fence_operands(s_flat);
    wgmma_fence_operands(dk);
    static_assert(Tile::kStages == 2, "the previous tile's stage is ring.stage ^ 1");
    if (it > 0) warp_arrive(&q_empty[ring.stage ^ 1], lane);

    const int key0 = walk.n0 + 16 * warp, query0 = m0 + 32 * consumer;  // the warp's first key, query
    // A sliding window (kVariants, causal): key j is left of query query0 + col's window where
    // j <= query0 + col + shift - window (the warp's 32 query columns).
    const int window = kVariants ? p.variants.window : 0;
    const bool need_mask = key0 + 16 > walk.seq.seqlen_k || (p.causal && key0 + 15 > query0 + walk.shift) ||
                           (window > 0 && key0 <= query0 + 31 + walk.shift - window);
    auto lse2_of = [&](int, int nt, int i) { return lse2[nt * 8 + 2 * (lane % 4) + (i & 1)]; };
    auto masked = [&](int row, int col) {
      const int j = key0 + row;
      return j >= walk.seq.seqlen_k || (p.causal && j > query0 + col + walk.shift) ||
             (window > 0 && j <= query0 + col + walk.shift - window);
    };
    const float softcap = kVariants ? p.variants.softcap : 0.0f;
    bwd::probabilities(s, p.scale_log2, lane, lse2_of, need_mask, masked, softcap > 0.0f ? softcap / p.scale : 0.0f,
                       softcap > 0.0f ? p.scale / softcap : 0.0f);
    wgmma_wait<0>();
    wgmma_fence_operands(dp_flat);
    bwd::score_gradients(dp, s, [&](int, int nt, int i) { return delta[nt * 8 + 2 * (lane % 4) + (i & 1)]; });
    if (softcap > 0.0f) bwd::softcap_gradients(dp, s, lse2_of, softcap * 1.4426950408889634f);
    uint32_t pa[2][4], dsa[2][4];
    accumulators_as_a<T>(pa, s);
    accumulators_as_a<T>(dsa, dp);
    // This consumer's 32 columns of the tile's P^T and dS^T boxes, visible to the async proxy.
    const uint32_t pt_addr = smem + Tile::kPds + (it & 1) * Tile::kPdsBytes, ds_addr = pt_addr + Tile::kBoxBytes;
    store_fragments_swizzled<32>(pt_addr, pa, 2 * consumer);
    store_fragments_swizzled<32>(ds_addr, dsa, 2 * consumer);
    fence_async_shared();
    named_barrier_sync(1, Tile::kConsumers * kWarpgroupThreads);  // both halves written

    // dV, dQ, dK over the tile's 64 queries (k16 steps of P^T / dS^T columns, of dO / Q rows)
    // and 64 keys (dQ: dS^T rows, K rows).
    // acc (+)= A B for A in shared memory at a_addr (64 rows x 64, K-major, or MN-major with
    // kTransA) and B the consumer's 128 columns of the tile at b_addr (MN-major).
    auto product = [&](auto trans_a, float(&acc)[kCols / 2], uint32_t a_addr, uint32_t b_addr, bool accumulate) {
      constexpr int kTransA = decltype(trans_a)::value;
      const uint64_t a0 = kTransA ? smem_descriptor(a_addr, Tile::kBoxBytes, 1024) : smem_descriptor(a_addr, 16, 1024);
      const uint64_t b0 = smem_descriptor(b_addr + col_chunk, Tile::kChunkBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t a = descriptor_advanced(a0, kTransA ? 2048 * kk : 32 * kk);
        const uint64_t b = descriptor_advanced(b0, 2048 * kk);
        wgmma_m64n128k16<kTransA, 1>(WgmmaTag<T>{}, acc, a, b, accumulate || kk > 0);
      }
      wgmma_commit();
    };
    static_assert(M == 64 && N == 64, "the products' k16 steps: 64 queries (dV, dK), 64 keys (dQ)");
    float dq[kCols / 2];
    wgmma_fence();
    product(std::false_type{}, dv, pt_addr, do_addr, true);
    product(std::true_type{}, dq, ds_addr, k_addr, false);
    product(std::false_type{}, dk, ds_addr, q_addr, true);
    wgmma_wait<1>();  // dV and dQ
    wgmma_fence_operands(dq);
    wgmma_fence_operands(dv);
    warp_arrive(do_empty, lane);  // dP^T and dV have read dO

    write_dq(reinterpret_cast<const float(&)[32]>(dq[0]));
    // Copied by an add of +0 that ptxas keeps: dq_next must not stay in the registers the dQ
    // GEMM wrote, which ptxas would guard with a wait for every wgmma in flight (C7517)
    // before their reads under the next tile's S^T and dP^T.
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("add.f32 %0, %1, 0f00000000;\n" : "=f"(dq_next[i]) : "f"(dq[32 + i]));
    ring.advance();
    do_ring.advance();
  }
  if (n_iters > 0) write_dq(dq_next);
  // The last tile's dK.
  wgmma_wait<0>();
  wgmma_fence_operands(dk);
  // The last reduction has read the boxes (every arrival of the producer warp is matched).
  if (n_iters > 0) named_barrier_sync(Tile::kDqEmpty + consumer, kDqBarrierThreads);

  // dk = scale * sum dS^T Q and dv, rounded, stored from registers: the 64 keys x the
  // consumer's columns.
  store_key_rows<T, kCols>(bp.dk, dk, p.scale, walk, 0, kCols * consumer);
  store_key_rows<T, kCols>(bp.dv, dv, 1.0f, walk, 0, kCols * consumer);
#endif
}

}  // namespace llmk::detail::sm90
