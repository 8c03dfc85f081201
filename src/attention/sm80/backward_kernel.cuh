// Attention backward on the sm_80 instruction set (mma.sync m16n8k16, ldmatrix, cp.async),
// FlashAttention 2's algorithm, in three kernels per call (four launches at most):
//
//   rows kernel, pre:  D = rowsum(dout * out) per (row, query head), fp32; zeroes the fp32 dq
//                      accumulator rows (not on the deterministic sm_80 path) and, on the
//                      deterministic Hopper path, the turn counters
//   main kernel:       one block per (key tile of kBlockN keys, kv head, batch entry); dk, dv
//                      of the tile in fp32 registers, dq into the accumulator by atomics
//   rows kernel, post: dq = scale * accumulator, rounded to the dtype
//   or, deterministic, the dq kernel: one block per (query tile, query head, batch entry)
//
// Main kernel, per block: K_j and V_j stay in shared memory; the block walks the query heads
// of its kv head's group and, for each, the query tiles that see the key tile (causal: from
// the diagonal on), Q_i and dO_i (with lse_i, D_i) double-buffered by cp.async (one buffer
// at head dim 256):
//
//   S^T  = K_j Q_i^T                 [kBlockN x kBlockM]  (the transpose: rows are keys)
//   P^T  = exp2(S^T * scale log2 e - lse_i log2 e), 0 where masked
//   dP^T = V_j dO_i^T
//   dV  += P^T dO_i
//   dS^T = P^T * (dP^T - D_i)
//   dK  += dS^T Q_i
//   dS^T -> shared memory; dQ_i = dS K_j (all warps' keys), red.global.add into fp32
//
// Computing S^T rather than S gives each band of kAcross warps whole key rows: the band owns
// the same keys of S^T, dP^T, dK and dV. With kAcross 1 (head dim 32) the P^T and dS^T
// fragments a warp computes are the A operands of its own dV and dK rows, with no
// shared-memory round trip; only dS^T goes through shared memory, for dQ, whose sum runs over
// every warp's keys. With kAcross 2 or 4 the warps of a band split its columns, which reads
// fewer shared-memory bytes per mma (the GEMMs are bound by ldmatrix traffic at 16-row warp
// tiles) and leaves the dK/dV accumulators of head dim 256 room in the registers: P^T, then
// dS^T, go through one shared-memory buffer, the band's warps meeting on a named barrier
// between them. The lse of a row that sees no key is -inf (the forward's convention); it is
// read as +inf, so that exp2(s - lse) = 0 and the row adds nothing anywhere (FlashAttention's
// +inf works as it is).
//
// The dq kernel (deterministic) is the same algebra from the query side: a block owns a
// query tile and walks the key tiles it sees (S, P, dP, dS in registers as in the forward)
// and dQ += dS K_j accumulates in registers in a fixed order: no atomics, 3 of the 5 GEMMs
// again (7 in all instead of 5), written once, no accumulator and no post pass.
//
// Roofline (H100 SXM): the backward is 5 GEMMs of seq_q * seq_k * D multiply-adds per (batch,
// query head): 10 * seq_q * seq_k * D FLOPs, 2.5x the forward's, halved by a causal mask;
// mma.sync peaks near 660 TFLOP/s dense bf16. Bytes: q, k, v, out, dout, dq, dk, dv once
// each plus the dq accumulator's atomics, 4 * D bytes per (query row, key tile): at 16k
// tokens (D = 128, 128-key tiles) ~1 GB of L2 reductions per head against ~1 ms of
// tensor-core work per head, ~1 TB/s, which the L2 sustains (FlashAttention 2 does the
// same); the kernel is compute-bound, with more non-GEMM work per FLOP than the forward
// (exp2 and dS on every S^T element, and the atomics). Smaller key tiles would double them.
// Registers and shared memory per head dim: the tile table in sm80/backward.cu.
// Measured on the H100 (bf16, hd 128, 16k tokens): 269 TFLOP/s, about 0.86x FlashAttention
// 2's 311. Beside FlashAttention 2's kernel (same tile and warp grids) the rolled k-loops
// stalled on address arithmetic, which the unrolled mma_ss below removes; ours also stalls on
// the red.global queue (the dq reductions drain at the next tile's start; 16-byte reductions:
// pack_row_tiles) and has excess shared-memory wavefronts where theirs has none (the
// cp.async of Q_i, dO_i into padded rows; swizzled at head dim 256: BackwardTile).
// dQ and its reductions go after dK: issued before it, to drain them during dK's GEMM, they
// were slower.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/attention_params.h"
#include "attention/backward_common.cuh"
#include "common/ptx.cuh"
#include "common/sm80/attention_tiles.cuh"
#include "common/sm80/mma_tiles.cuh"
#include "common/vec.cuh"

namespace llmk::detail {

// The most dynamic shared memory one block may opt into on sm_80 (the A100: 163 KB).
inline constexpr int kAmpereMaxBlockSharedBytes = 166912;

// The tile of the main kernel: kBlockN keys per block, kBlockM query rows per step, 8 warps.
// The warps split the keys into 8 / kAcross bands of kBandRows; the kAcross warps of a band
// split the columns of its rows of S^T, dP^T [keys x kBlockM] and of dK, dV [keys x D]. dQ
// [kBlockM x D] splits on its own grid, (8 / kQWarpsD) x kQWarpsD warps.
// kAcross == 1 (kPInRegisters): a warp owns whole key rows, so its P^T and dS^T accumulators
// are the A fragments of its own dV and dK. kAcross > 1: P^T, then dS^T, pass through one
// shared-memory buffer; the rows a band writes are read back by that band alone (for dV, dK),
// so only its warps wait on each other there; dQ reads every key's dS^T after a block
// barrier. Wider warp tiles read fewer bytes of shared memory per mma: a 16 x 64 tile (S^T at
// D = 128, kAcross 1) 320 B per m16n8k16, 32 x 32 256 B, 32 x 64 (dK, dV at D = 128, 256)
// 192 B.
// kStages: buffers of Q_i, dO_i (2: the next tile loads during this one's GEMMs; 1: after dK,
// during dQ, only on the kAcross > 1 path, whose barriers free them).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kAcross_, int kQWarpsD_, int kStages_>
struct BackwardTile {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kPitch = kHeadDim + 8;  // K, V rows in shared memory (+16 bytes)
  static constexpr int kSPitch = kBlockM + 8;  // P^T, dS^T rows: [kBlockN][kBlockM]
  // Q_i, dO_i rows: swizzled (load_rows) at head dim 256, else padded as K, V. Every tile
  // reloads them, and cp.async into rows padded by 16 bytes writes each 128-byte line of
  // global memory into two lines of shared memory; the swizzle keeps a line whole and
  // ldmatrix conflict-free, for a few more registers (its column steps' XOR-ed addresses).
  // It pays at head dim 256; at 64 and 128 those registers spill (reloaded on every tile's dQ
  // reduction) and it gains nothing.
  // The layout holds for any head dim of whole 128-byte lines on the kAcross > 1 path.
  static constexpr bool kSwizzleQ = kHeadDim == 256;
  static constexpr int kQPitch = kSwizzleQ ? kHeadDim : kPitch;

  static constexpr int kAcross = kAcross_, kBands = kWarps / kAcross, kBandRows = kBlockN / kBands;
  static constexpr int kSCols = kBlockM / kAcross, kKvCols = kHeadDim / kAcross;
  static constexpr int kMTiles = kBandRows / 16, kSNTiles = kSCols / 8, kKvNTiles = kKvCols / 8;

  static constexpr int kQWarpsD = kQWarpsD_, kQWarpsM = kWarps / kQWarpsD;
  static constexpr int kQRows = kBlockM / kQWarpsM, kQCols = kHeadDim / kQWarpsD;
  static constexpr int kQMTiles = kQRows / 16, kQNTiles = kQCols / 8;

  static constexpr bool kPInRegisters = kAcross == 1;

  // Shared memory, in elements of T: K, V [kBlockN][kPitch]; Q, dO [kStages][kBlockM][kQPitch]
  // (at a multiple of 128 bytes); dS^T (and before it P^T, unless kPInRegisters)
  // [kBlockN][kSPitch]; then float lse, D [kStages][kBlockM].
  static constexpr int kSmemElems = 2 * kBlockN * kPitch + 2 * kStages * kBlockM * kQPitch + kBlockN * kSPitch;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kStages * kBlockM * 4;

  static_assert(kWarps % kAcross == 0 && kBlockN % kBands == 0 && kBlockM % kAcross == 0 && kHeadDim % kAcross == 0 &&
                kWarps % kQWarpsD == 0 && kBlockM % kQWarpsM == 0 && kHeadDim % kQWarpsD == 0,
                "the warp grids cover the tile exactly");
  static_assert(kBandRows % 16 == 0 && kSCols % 16 == 0 && kQRows % 16 == 0);
  static_assert(kKvNTiles % 2 == 0 && kQNTiles % 2 == 0 && kBlockN % 16 == 0 && kBlockM % 16 == 0);
  static_assert(kStages == 2 || (kStages == 1 && !kPInRegisters),
                "one stage only on the kAcross > 1 path, which reloads Q_i, dO_i after dK");
  static_assert(kBlockM <= kThreads / 2, "one thread per lse and per D element of a tile");
  static_assert(kSmemBytes <= kAmpereMaxBlockSharedBytes, "every tile runs on the A100");
  static_assert(!kSwizzleQ || (2 * kBlockN * kPitch * 2) % 128 == 0, "Q, dO start on a 128-byte line (after K, V)");
  // LaneAddress's steps: a warp's column offset into Q_i / dO_i (kv_col0, for dV and dK) is
  // a multiple of kKvCols, whose chunks (a power of two) hold all its 16-column steps.
  static_assert(!kSwizzleQ || (kKvCols & (kKvCols - 1)) == 0, "column blocks of a power of two");
  static_assert(!kSwizzleQ || !kPInRegisters, "mma_rs (the kPInRegisters path) reads Q_i, dO_i in padded rows");
};

// The deterministic dq kernel's tile: kBlockM query rows per block (4 warps of kBlockM / 4
// rows), kBlockN keys per step, K_j and V_j double-buffered.
template <int kHeadDim_, int kBlockM_, int kBlockN_>
struct DqTile {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kMTiles = kBlockM / (16 * kWarps), kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8;
  static constexpr int kPitch = kHeadDim + 8;
  // Q, dO [kBlockM][kPitch], then K, V [2][kBlockN][kPitch].
  static constexpr int kSmemElems = (2 * kBlockM + 4 * kBlockN) * kPitch;
  static constexpr int kSmemBytes = kSmemElems * 2;
  static_assert(kBlockM % (16 * kWarps) == 0 && kBlockN % 16 == 0 && kDTiles % 2 == 0);
};

// A tile of `kRows` rows of a kernel's tile geometry, for load_rows / store_rows.
template <class Tile, int kRows>
struct RowsOf {
  static constexpr int kHeadDim = Tile::kHeadDim, kThreads = Tile::kThreads, kPitch = Tile::kPitch;
  static constexpr int kBlockM = kRows;
  static_assert(kRows * (kHeadDim / 8) % kThreads == 0, "store_rows covers the tile in whole passes");
};

namespace bwd {

// The dQ reductions of a row's values of two adjacent 8-column accumulator tiles (a: columns
// 2q, 2q + 1 of the first, b: of the second, q = lane % 4): pack_row_tiles arranges them in
// v and returns the column of the lane's first one (from the first tile's column 0), then
// add_row_tiles adds v there. Every lane of the warp calls pack_row_tiles.
// - sm_90: one 16-byte reduction a lane. Lanes 2i and 2i + 1 swap halves, so that even
//   lanes hold columns 2q .. 2q + 3 of the first tile and odd lanes 2q - 2 .. 2q + 1 of the
//   second: a warp's instruction covers 64 bytes of each of its 8 rows, where 8-byte
//   reductions covered 32, one L2 sector.
// - sm_80 has no vector reduction: four 4-byte atomics of v as it comes (columns 2q, 2q + 1,
//   2q + 8, 2q + 9), a warp's instruction on 32 contiguous bytes of each row.
__device__ __forceinline__ int pack_row_tiles(float (&v)[4], float a0, float a1, float b0, float b1, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool odd = lane & 1;
  const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
  const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
  v[0] = odd ? r0 : a0;
  v[1] = odd ? r1 : a1;
  v[2] = odd ? b0 : r0;
  v[3] = odd ? b1 : r1;
  return (odd ? 8 : 0) + 2 * (lane & 2);
#else
  v[0] = a0, v[1] = a1, v[2] = b0, v[3] = b1;
  return 2 * (lane % 4);
#endif
}
__device__ __forceinline__ void add_row_tiles(float* p, const float (&v)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
#else
  atomicAdd(p, v[0]);
  atomicAdd(p + 1, v[1]);
  atomicAdd(p + 8, v[2]);
  atomicAdd(p + 9, v[3]);
#endif
}

}  // namespace bwd

// grid (ceil(seqlen_q / 64), heads_q, batch), 128 threads. `post` false: D[row] = dout . out
// and, with an accumulator, its row zeroed (not with dq_first_store) and the row's two
// counters (where the Hopper kernel reads them: dq_ordered or dq_first_store);
// `post` true: dq = scale * accumulator. A row is handled by kLanes threads (a power of two,
// 8 elements each; at D = 96, 16 lanes of which 12 work) so that the dot product reduces by
// xor-shuffles within aligned lane groups.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(128)
    attention_backward_rows_kernel(const __grid_constant__ AttentionBackwardParams bp, bool post) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kLanes = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  constexpr int kRowsPerPass = 128 / kLanes, kRows = 64;
  const AttentionParams& p = bp.fwd;
  const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
  const SequenceBounds seq = sequence_bounds(p, batch);
  const int row0 = static_cast<int>(blockIdx.x) * kRows;
  if (row0 >= seq.seqlen_q) return;
  const int sub = static_cast<int>(threadIdx.x) % kLanes, col = sub * 8;
  const int64_t first = p.lse_offset(batch, head) + seq.q_start;
  auto at = [&](const AttentionTensor& t, int64_t row) {
    return static_cast<T*>(t.data) + batch * t.batch_stride + (seq.q_start + row) * t.row_stride +
           head * t.head_stride + col;
  };
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int row = row0 + pass * kRowsPerPass + static_cast<int>(threadIdx.x) / kLanes;
    const bool valid = row < seq.seqlen_q && sub < kChunks;
    float* accum = bp.dq_accum ? bp.dq_accum + (first + row) * kHeadDim + col : nullptr;
    if (post) {
      if (!valid) continue;
      const float4 lo = reinterpret_cast<const float4*>(accum)[0], hi = reinterpret_cast<const float4*>(accum)[1];
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      Vec<T, 8> out;
#pragma unroll
      for (int c = 0; c < 8; ++c) out.v[c] = from_float<T>(v[c] * p.scale);
      store_vec(at(bp.dq, row), out);
      continue;
    }
    float dot = 0.0f;
    if (valid) {
      const Vec<T, 8> o = load_vec<T, 8>(at(p.out, row)), d = load_vec<T, 8>(at(bp.dout, row));
#pragma unroll
      for (int c = 0; c < 8; ++c) dot = fmaf(to_float(o.v[c]), to_float(d.v[c]), dot);
      if (accum && !bp.dq_first_store) {
        reinterpret_cast<float4*>(accum)[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        reinterpret_cast<float4*>(accum)[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      if (bp.dq_counters != nullptr && (bp.dq_ordered || bp.dq_first_store) && sub < 2)
        bp.dq_counters[2 * (first + row) + sub] = 0;
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (valid && sub == 0) bp.delta[first + row] = dot;
  }
}

// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), Tile::kThreads threads,
// Tile::kSmemBytes of dynamic shared memory. Writes dk, dv of the block's key rows (0 for
// keys no query row sees) and, with bp.dq_accum, adds its share of dq there.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    attention_backward_kernel(const __grid_constant__ AttentionBackwardParams bp) {
  using namespace bwd;
  constexpr int D = Tile::kHeadDim, M = Tile::kBlockM, N = Tile::kBlockN;
  constexpr int kPitch = Tile::kPitch, kSPitch = Tile::kSPitch, kQPitch = Tile::kQPitch;
  constexpr bool kSwz = Tile::kSwizzleQ;
  const AttentionParams& p = bp.fwd;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  T* sK = reinterpret_cast<T*>(smem_bytes);
  T* sV = sK + N * kPitch;
  T* sQ = sV + N * kPitch;                     // [kStages][M][kQPitch]
  T* sdO = sQ + Tile::kStages * M * kQPitch;   // [kStages][M][kQPitch]
  T* sdS = sdO + Tile::kStages * M * kQPitch;  // [N][kSPitch]: dS^T, or first P^T (kPInRegisters false)
  float* sLse = reinterpret_cast<float*>(smem_bytes + Tile::kSmemElems * sizeof(T));  // [kStages][M]
  float* sDelta = sLse + Tile::kStages * M;                                             // [kStages][M]

  const int n_block = static_cast<int>(blockIdx.x), kv_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  const SequenceBounds seq = sequence_bounds(p, batch);
  const int n0 = n_block * N;
  if (n0 >= seq.seqlen_k) return;
  const int kv_rows = min(N, seq.seqlen_k - n0);
  const int shift = seq.seqlen_k - seq.seqlen_q;  // causal: row i sees key j <= i + shift
  const QueryTiles tiles = query_tiles_seeing(seq, p.causal, n0, M);
  const int m_begin = tiles.begin, m_end = tiles.end, per_head = tiles.count();
  const int n_iters = per_head * p.group;
  const bool with_dq = bp.dq_accum != nullptr;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int key_row0 = (warp / Tile::kAcross) * Tile::kBandRows;  // the warp's band: S^T, dP^T, dK, dV
  const int s_col0 = (warp % Tile::kAcross) * Tile::kSCols, kv_col0 = (warp % Tile::kAcross) * Tile::kKvCols;
  // The warps of the band, which write and read back the band's rows of P^T and dS^T (named
  // barrier 1 + band; its id is a register, so ptxas reserves all 16 barriers).
  auto band_sync = [&] { ptx::named_barrier_sync(1 + warp / Tile::kAcross, Tile::kAcross * 32); };
  T* const band_ds = sdS + key_row0 * kSPitch;  // the band's rows of P^T / dS^T
  // The warp's accumulators of P^T or dS^T (its kSCols columns of the band's rows), rounded.
  auto store_band = [&](const float(&acc)[Tile::kMTiles][Tile::kSNTiles][4]) {
    store_acc<T, kSPitch>(band_ds + s_col0, acc, 1.0f, lane);
  };
  const int q_row0 = (warp / Tile::kQWarpsD) * Tile::kQRows, q_col0 = (warp % Tile::kQWarpsD) * Tile::kQCols;

  auto head_offset = [&](const AttentionTensor& t, int head, int64_t row) {
    return batch * t.batch_stride + row * t.row_stride + head * t.head_stride;
  };
  const int64_t k_row0 = seq.k_start + n0;
  // Q_i, dO_i, lse_i and D_i of (query head, first row m0) into buffer `stage`.
  auto load_query_tile = [&](int stage, int head, int m0) {
    const int64_t row = seq.q_start + m0;
    load_rows<T, Tile, M, kSwz>(sQ + stage * M * kQPitch,
                                static_cast<const T*>(p.q.data) + head_offset(p.q, head, row), p.q.row_stride,
                                seq.seqlen_q - m0);
    load_rows<T, Tile, M, kSwz>(sdO + stage * M * kQPitch,
                                static_cast<const T*>(bp.dout.data) + head_offset(bp.dout, head, row),
                                bp.dout.row_stride, seq.seqlen_q - m0);
    if (tid < 2 * M) {
      const int i = tid % M;
      const float* src = (tid < M ? p.lse : bp.delta) + p.lse_offset(batch, head) + row;
      const bool valid = m0 + i < seq.seqlen_q;
      cp_async_4(ptx::smem_address((tid < M ? sLse : sDelta) + stage * M + i), valid ? src + i : src, valid);
    }
  };

  float dk[Tile::kMTiles][Tile::kKvNTiles][4], dv[Tile::kMTiles][Tile::kKvNTiles][4];
  zero(dk);
  zero(dv);
  int head = kv_head * p.group, m_block = m_begin;
  if (n_iters > 0) {
    load_rows<T, Tile, N>(sK, static_cast<const T*>(p.k.data) + head_offset(p.k, kv_head, k_row0), p.k.row_stride,
                          kv_rows);
    load_rows<T, Tile, N>(sV, static_cast<const T*>(p.v.data) + head_offset(p.v, kv_head, k_row0), p.v.row_stride,
                          kv_rows);
    load_query_tile(0, head, m_block * M);
    ptx::cp_async_commit();
  }
  for (int it = 0; it < n_iters; ++it) {
    const int stage = Tile::kStages == 2 ? it & 1 : 0;
    int next_head = head, next_m = m_block + 1;
    if (next_m == m_end) {
      next_m = m_begin;
      ++next_head;
    }
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile `it` visible; every warp is done with tile it - 1 and with dS^T
    if (Tile::kStages == 2 && it + 1 < n_iters) {
      load_query_tile(stage ^ 1, next_head, next_m * M);
      ptx::cp_async_commit();
    }
    const int m0 = m_block * M;
    const T* sQs = sQ + stage * M * kQPitch;
    const T* sdOs = sdO + stage * M * kQPitch;
    const float* lse = sLse + stage * M + s_col0;
    const float* delta = sDelta + stage * M + s_col0;

    // S^T = K Q^T and P^T, the warp's kBandRows keys x kSCols query rows.
    float s[Tile::kMTiles][Tile::kSNTiles][4];
    zero(s);
    mma_ss<T, Tile::kMTiles, Tile::kSNTiles, D / 16, false, kPitch, false, kQPitch, kSwz>(
        s, sK + key_row0 * kPitch, sQs + s_col0 * kQPitch, lane);
    const bool need_mask = n0 + N > seq.seqlen_k || m0 + M > seq.seqlen_q || (p.causal && n0 + N - 1 > m0 + shift);
    probabilities(
        s, p.scale_log2, lane, [&](int, int nt, int i) { return lse_log2(lse[nt * 8 + 2 * (lane % 4) + (i & 1)]); },
        need_mask, [&](int row, int col) {
          const int j = n0 + key_row0 + row, qi = m0 + s_col0 + col;
          return j >= seq.seqlen_k || qi >= seq.seqlen_q || (p.causal && j > qi + shift);
        });

    // dV += P^T dO: with P^T in registers, before dP^T (fewer accumulators live at once);
    // else P^T goes to shared memory and dV waits for the band. dP^T = V dO^T.
    if constexpr (Tile::kPInRegisters) {
      mma_rs<T, Tile::kMTiles, Tile::kKvNTiles, M / 16, true, kQPitch>(dv, s, sdOs, lane);
    } else {
      store_band(s);
    }
    float dp[Tile::kMTiles][Tile::kSNTiles][4];
    zero(dp);
    mma_ss<T, Tile::kMTiles, Tile::kSNTiles, D / 16, false, kPitch, false, kQPitch, kSwz>(
        dp, sV + key_row0 * kPitch, sdOs + s_col0 * kQPitch, lane);
    // dS^T = P^T (dP^T - D); dK += dS^T Q.
    score_gradients(dp, s, [&](int, int nt, int i) { return delta[nt * 8 + 2 * (lane % 4) + (i & 1)]; });
    if constexpr (Tile::kPInRegisters) {
      mma_rs<T, Tile::kMTiles, Tile::kKvNTiles, M / 16, true, kQPitch>(dk, dp, sQs, lane);
      if (with_dq) {
        store_band(dp);
        __syncthreads();  // dS^T visible to every warp
      }
    } else {
      band_sync();  // the band's P^T visible to its warps
      mma_ss<T, Tile::kMTiles, Tile::kKvNTiles, M / 16, false, kSPitch, true, kQPitch, kSwz>(
          dv, band_ds, sdOs + kv_col0, lane);
      band_sync();  // the band is done with its P^T: dS^T takes its place
      store_band(dp);
      __syncthreads();  // dS^T visible to every warp
      mma_ss<T, Tile::kMTiles, Tile::kKvNTiles, M / 16, false, kSPitch, true, kQPitch, kSwz>(
          dk, band_ds, sQs + kv_col0, lane);
      if constexpr (Tile::kStages == 1) {
        __syncthreads();  // every warp is done with Q_i, dO_i
        if (it + 1 < n_iters) {
          load_query_tile(0, next_head, next_m * M);
          ptx::cp_async_commit();
        }
      }
    }
    if (with_dq) {
      // dQ_i = dS K over the tile's keys: dS^T read transposed as the A operand.
      float dq[Tile::kQMTiles][Tile::kQNTiles][4];
      zero(dq);
      mma_ss<T, Tile::kQMTiles, Tile::kQNTiles, N / 16, true, kSPitch, true, kPitch, false>(dq, sdS + q_row0,
                                                                                            sK + q_col0, lane);
      // Two tiles per reduction (pack_row_tiles). With 8-byte ones the kernel made several
      // times FlashAttention 2's L2 reduction requests for the same sectors and filled the LSU
      // queue (lg_throttle).
      float* accum = bp.dq_accum + D * (p.lse_offset(batch, head) + seq.q_start + m0);
#pragma unroll
      for (int mt = 0; mt < Tile::kQMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = q_row0 + mt * 16 + half * 8 + lane / 4;
#pragma unroll
          for (int nt = 0; nt < Tile::kQNTiles; nt += 2) {
            float v[4];
            const int col = q_col0 + nt * 8 +
                            pack_row_tiles(v, dq[mt][nt][2 * half], dq[mt][nt][2 * half + 1], dq[mt][nt + 1][2 * half],
                                           dq[mt][nt + 1][2 * half + 1], lane);
            if (m0 + row < seq.seqlen_q) add_row_tiles(accum + row * D + col, v);
          }
        }
    }
    head = next_head;
    m_block = next_m;
  }

  // dk = scale * sum dS^T Q and dv through shared memory (K and V are no longer read), then
  // 16-byte stores of the tile's keys.
  ptx::cp_async_wait<0>();
  __syncthreads();
  store_acc<T, kPitch>(sK + key_row0 * kPitch + kv_col0, dk, p.scale, lane);
  store_acc<T, kPitch>(sV + key_row0 * kPitch + kv_col0, dv, 1.0f, lane);
  __syncthreads();
  store_rows<T, RowsOf<Tile, N>>(static_cast<T*>(bp.dk.data) + head_offset(bp.dk, kv_head, k_row0), bp.dk.row_stride,
                                 sK, kv_rows);
  store_rows<T, RowsOf<Tile, N>>(static_cast<T*>(bp.dv.data) + head_offset(bp.dv, kv_head, k_row0), bp.dv.row_stride,
                                 sV, kv_rows);
}

// grid (ceil(seqlen_q / kBlockM), heads_q, batch), Tile::kThreads threads, Tile::kSmemBytes
// of dynamic shared memory: dq of one query tile, summed over the key tiles in order.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    attention_backward_dq_kernel(const __grid_constant__ AttentionBackwardParams bp) {
  using namespace bwd;
  constexpr int D = Tile::kHeadDim, M = Tile::kBlockM, N = Tile::kBlockN, kPitch = Tile::kPitch;
  const AttentionParams& p = bp.fwd;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* sQ = reinterpret_cast<T*>(smem_bytes);
  T* sdO = sQ + M * kPitch;
  T* sK = sdO + M * kPitch;  // [2][N][kPitch]
  T* sV = sK + 2 * N * kPitch;  // [2][N][kPitch]

  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest causal rows first
  const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
  const SequenceBounds seq = sequence_bounds(p, batch);
  const int m0 = m_block * M;
  if (m0 >= seq.seqlen_q) return;
  const int rows = min(M, seq.seqlen_q - m0);
  const int kv_head = head / p.group;
  const int shift = seq.seqlen_k - seq.seqlen_q;
  const int key_end = static_cast<int>(visible_keys(seq, p.causal, m0 + M - 1));
  const int n_blocks = (key_end + N - 1) / N;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_row0 = warp * Tile::kMTiles * 16;
  auto at = [&](const AttentionTensor& t, int h, int64_t row) {
    return static_cast<T*>(t.data) + batch * t.batch_stride + row * t.row_stride + h * t.head_stride;
  };
  // The exponent offset and D of each of the thread's rows (+inf and 0 past the end).
  float lse2[Tile::kMTiles][2], delta[Tile::kMTiles][2];
  const int64_t first = p.lse_offset(batch, head) + seq.q_start + m0;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + mt * 16 + half * 8 + lane / 4;
      lse2[mt][half] = row < rows ? lse_log2(p.lse[first + row]) : INFINITY;
      delta[mt][half] = row < rows ? bp.delta[first + row] : 0.0f;
    }

  float dq[Tile::kMTiles][Tile::kDTiles][4];
  zero(dq);
  const T* k = at(p.k, kv_head, seq.k_start);
  const T* v = at(p.v, kv_head, seq.k_start);
  if (n_blocks > 0) {
    load_rows<T, Tile, M>(sQ, at(p.q, head, seq.q_start + m0), p.q.row_stride, rows);
    load_rows<T, Tile, M>(sdO, at(bp.dout, head, seq.q_start + m0), bp.dout.row_stride, rows);
    load_rows<T, Tile, N>(sK, k, p.k.row_stride, seq.seqlen_k);
    load_rows<T, Tile, N>(sV, v, p.v.row_stride, seq.seqlen_k);
    ptx::cp_async_commit();
  }
  for (int j = 0; j < n_blocks; ++j) {
    const int n0 = j * N, stage = j & 1;
    ptx::cp_async_wait<0>();
    __syncthreads();  // K_j, V_j visible; every warp is done with K_{j-1}, V_{j-1}
    if (j + 1 < n_blocks) {
      const int next = n0 + N;
      load_rows<T, Tile, N>(sK + (stage ^ 1) * N * kPitch, k + next * p.k.row_stride, p.k.row_stride,
                            seq.seqlen_k - next);
      load_rows<T, Tile, N>(sV + (stage ^ 1) * N * kPitch, v + next * p.v.row_stride, p.v.row_stride,
                            seq.seqlen_k - next);
      ptx::cp_async_commit();
    }
    const T* sKs = sK + stage * N * kPitch;
    const T* sVs = sV + stage * N * kPitch;
    float s[Tile::kMTiles][Tile::kNTiles][4];
    zero(s);
    mma_ss<T, Tile::kMTiles, Tile::kNTiles, D / 16, false, kPitch, false, kPitch, false>(s, sQ + warp_row0 * kPitch,
                                                                                        sKs, lane);
    const bool need_mask = n0 + N > seq.seqlen_k || (p.causal && n0 + N - 1 > m0 + shift);
    probabilities(
        s, p.scale_log2, lane, [&](int mt, int, int i) { return lse2[mt][i >> 1]; }, need_mask,
        [&](int row, int col) {
          const int qi = m0 + warp_row0 + row, kj = n0 + col;
          return kj >= seq.seqlen_k || (p.causal && kj > qi + shift);
        });
    float dp[Tile::kMTiles][Tile::kNTiles][4];
    zero(dp);
    mma_ss<T, Tile::kMTiles, Tile::kNTiles, D / 16, false, kPitch, false, kPitch, false>(dp, sdO + warp_row0 * kPitch,
                                                                                        sVs, lane);
    score_gradients(dp, s, [&](int mt, int, int i) { return delta[mt][i >> 1]; });
    mma_rs<T, Tile::kMTiles, Tile::kDTiles, N / 16, true, kPitch>(dq, dp, sKs, lane);
  }

  // dq = scale * sum dS K into this warp's own rows of sQ (only this warp read them), then
  // the tile out with 16-byte stores.
  ptx::cp_async_wait<0>();
  __syncwarp();
  store_acc<T, kPitch>(sQ + warp_row0 * kPitch, dq, p.scale, lane);
  __syncthreads();
  store_rows<T, RowsOf<Tile, M>>(at(bp.dq, head, seq.q_start + m0), bp.dq.row_stride, sQ, rows);
}

}  // namespace llmk::detail
