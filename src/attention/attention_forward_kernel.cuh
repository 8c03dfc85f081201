// Attention forward on the sm_80 instruction set (mma.sync m16n8k16, ldmatrix, cp.async),
// FlashAttention 2's algorithm. One block computes kBlockM query rows of one (batch, head):
//
//   load Q [kBlockM, D] and K_0 into shared memory (cp.async)
//   for each key block j of kBlockN keys the rows may see:
//     wait for K_j; start loading V_j                    (V_j lands during S and softmax)
//     S = Q K_j^T             (each warp: its kBlockM / kWarps rows, fp32 accumulators)
//     mask the sequence end and the causal diagonal (only blocks that cross them)
//     online softmax: P = exp(S * scale - running max), O *= exp(old max - new max)
//     wait for V_j; start loading K_{j+1}                (K_{j+1} lands during P V)
//     O += P V_j              (P stays in registers: the accumulators are A fragments)
//   O /= row sum; stage O through shared memory; 16-byte stores; lse = max + log(sum)
//
// Rows of a warp never mix with another warp's, so no reduction crosses warps. Causal
// blocks skip the key blocks above the diagonal, and the grid runs the longest rows first.
// Shared memory rows are padded by 16 bytes (kPitch), so the 8 row addresses of each
// ldmatrix fall in distinct banks without a swizzle, for every head dim.
//
// Roofline (H100 SXM): 4 * seq_q * seq_k * D FLOPs per (batch, head), halved by the causal
// mask; the bytes (q, k, v, out, read or written once per block row) are ~1% of the
// time, so the bound is the tensor cores: mma.sync reaches ~660 TFLOP/s dense bf16 on H100
// (wgmma ~990). The tile sizes, register and shared-memory budgets and the measured rates
// are in docs/kernels/attention.md.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/attention_softmax.cuh"
#include "common/ptx.cuh"

namespace llmk::detail {

__host__ __device__ constexpr int prev_power_of_two(int n) { return n < 2 ? 1 : 2 * prev_power_of_two(n / 2); }

// The tile shape of one head dim: kBlockM query rows per block, kBlockN keys per
// iteration, kWarps warps (each owning kBlockM / kWarps rows as 16-row mma tiles).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct ForwardTile {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kBlockM / (16 * kWarps);  // 16-row tiles per warp
  static constexpr int kNTiles = kBlockN / 8;              // 8-key tiles of S
  static constexpr int kDTiles = kHeadDim / 8;             // 8-column tiles of O
  static constexpr int kPitch = kHeadDim + 8;              // shared row, elements (+16 bytes)
  static constexpr int kSmemElems = (kBlockM + 2 * kBlockN) * kPitch;
  static_assert(kBlockM % (16 * kWarps) == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0);
};

// Rows [0, kRows) of a [rows, D] tile into shared memory, 16 bytes per cp.async; rows at
// and past `valid_rows` are zero-filled (a zero key scores 0 and is then masked; a zero
// value row keeps 0 * garbage from ever reaching O). A pass covers kRowsPerPass whole rows
// (a power of two), so each loading thread keeps one column and walks its rows with one
// pointer increment per pass: few live registers in the mainloop, which the Q K^T loop
// needs to prefetch its fragments. At D = 96 (12 chunks a row) 96 of the 128 threads load.
// kSwizzled: the shared rows are kHeadDim elements (a multiple of 64: whole 128-byte lines,
// the tile 128-byte aligned) and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of
// its line (read back through LaneAddress, attention_backward_kernel.cuh); a pass covers a
// multiple of 8 rows, so a thread's chunk moves the same way in every pass.
template <class T, class Tile, int kRows, bool kSwizzled = false>
__device__ __forceinline__ void load_rows(T* smem, const T* gmem, int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = Tile::kHeadDim / 8;
  constexpr int kRowsPerPass = prev_power_of_two(Tile::kThreads / kChunksPerRow);
  constexpr int kPitch = kSwizzled ? Tile::kHeadDim : Tile::kPitch;
  static_assert(kRows % kRowsPerPass == 0);
  static_assert(!kSwizzled || (Tile::kHeadDim % 64 == 0 && kRowsPerPass % 8 == 0),
                "whole 128-byte lines, whole swizzle periods");
  const int tid = static_cast<int>(threadIdx.x);
  if (kRowsPerPass * kChunksPerRow < Tile::kThreads && tid >= kRowsPerPass * kChunksPerRow) return;
  const int row0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  const T* src = gmem + row0 * row_stride + col;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  const uint32_t dst = ptx::smem_address(smem + row0 * kPitch + (kSwizzled ? col ^ (row0 % 8) * 8 : col));
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const bool valid = row0 + i * kRowsPerPass < valid_rows;
    ptx::cp_async_16(dst + i * kRowsPerPass * kPitch * sizeof(T), valid ? src : gmem, valid);
    src += pass_stride;
  }
}

// s = Q K^T for the warp's rows and all kBlockN keys.
template <class T, class Tile>
__device__ __forceinline__ void scores(float (&s)[Tile::kMTiles][Tile::kNTiles][4], const T* sQ,
                                       const T* sK, int warp_row0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Tile::kNTiles; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
  // ldmatrix row addresses: A (Q) matrices are (rows 0-7 | 8-15) x (k 0-7 | 8-15) in
  // register order a0..a3; B (K) matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15),
  // (keys 8-15, k 0-7), (keys 8-15, k 8-15): b0, b1 of one n-tile, then of the next.
  constexpr uint32_t kRowBytes = Tile::kPitch * sizeof(T);
  const uint32_t q_lane = ptx::smem_address(sQ + (warp_row0 + (lane & 15)) * Tile::kPitch + (lane >> 4) * 8);
  const uint32_t k_lane = ptx::smem_address(sK + ((lane & 7) + (lane >> 4) * 8) * Tile::kPitch + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int ks = 0; ks < Tile::kHeadDim / 16; ++ks) {
    uint32_t a[Tile::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt)
      ptx::ldmatrix_x4(a[mt], q_lane + mt * 16 * kRowBytes + ks * 32);
#pragma unroll
    for (int np = 0; np < Tile::kNTiles / 2; ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, k_lane + np * 16 * kRowBytes + ks * 32);
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt) {
        ptx::mma_16x8x16<T>(s[mt][2 * np], a[mt], b[0], b[1]);
        ptx::mma_16x8x16<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// o += P V, P the probabilities in s (rounded to T), V [kBlockN, D] in shared memory.
template <class T, class Tile>
__device__ __forceinline__ void accumulate_pv(float (&o)[Tile::kMTiles][Tile::kDTiles][4],
                                              const float (&p)[Tile::kMTiles][Tile::kNTiles][4],
                                              const T* sV, int lane) {
  // ldmatrix.trans matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15): b0, b1 of one d-tile, then of the next.
  constexpr uint32_t kRowBytes = Tile::kPitch * sizeof(T);
  const uint32_t v_lane = ptx::smem_address(sV + ((lane & 7) + ((lane >> 3) & 1) * 8) * Tile::kPitch + (lane >> 4) * 8);
#pragma unroll
  for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
    uint32_t a[Tile::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt) {
      a[mt][0] = ptx::pack2<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = ptx::pack2<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = ptx::pack2<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = ptx::pack2<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < Tile::kDTiles / 2; ++dp) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, v_lane + kk * 16 * kRowBytes + dp * 32);
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt) {
        ptx::mma_16x8x16<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
        ptx::mma_16x8x16<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Rows [0, valid_rows) of the [kBlockM, D] tile in shared memory out to global memory,
// 16 bytes per store.
template <class T, class Tile>
__device__ __forceinline__ void store_rows(T* gmem, int64_t row_stride, const T* smem, int valid_rows) {
  constexpr int kChunksPerRow = Tile::kHeadDim / 8;
  constexpr int kChunks = Tile::kBlockM * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < kChunks / Tile::kThreads; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * Tile::kThreads;
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (row < valid_rows)
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + row * Tile::kPitch + col);
  }
}

// grid (ceil(seqlen_q / kBlockM), heads_q, batch), Tile::kThreads threads,
// Tile::kSmemElems * sizeof(T) bytes of dynamic shared memory.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    attention_forward_kernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* sQ = reinterpret_cast<T*>(smem_bytes);
  T* sK = sQ + Tile::kBlockM * Tile::kPitch;
  T* sV = sK + Tile::kBlockN * Tile::kPitch;

  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest causal rows first
  const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
  const SequenceBounds seq = sequence_bounds(p, batch);
  const int m0 = m_block * Tile::kBlockM;
  if (m0 >= seq.seqlen_q) return;
  const int rows = min(Tile::kBlockM, seq.seqlen_q - m0);
  const int kv_head = head / p.group;

  const T* q = static_cast<const T*>(p.q.data) + batch * p.q.batch_stride +
               (seq.q_start + m0) * p.q.row_stride + head * p.q.head_stride;
  const T* k = static_cast<const T*>(p.k.data) + batch * p.k.batch_stride +
               seq.k_start * p.k.row_stride + kv_head * p.k.head_stride;
  const T* v = static_cast<const T*>(p.v.data) + batch * p.v.batch_stride +
               seq.k_start * p.v.row_stride + kv_head * p.v.head_stride;
  T* out = static_cast<T*>(p.out.data) + batch * p.out.batch_stride +
           (seq.q_start + m0) * p.out.row_stride + head * p.out.head_stride;
  float* lse = p.lse ? p.lse + p.lse_offset(batch, head) + seq.q_start + m0
                     : nullptr;

  // Keys [0, key_end) are visible to some row of this block.
  const int causal_shift = seq.seqlen_k - seq.seqlen_q;
  const int key_end = static_cast<int>(visible_keys(seq, p.causal, m0 + Tile::kBlockM - 1));
  const int n_blocks = (key_end + Tile::kBlockN - 1) / Tile::kBlockN;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_row0 = warp * Tile::kMTiles * 16;

  float o[Tile::kMTiles][Tile::kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < Tile::kDTiles; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
  OnlineSoftmax<Tile::kMTiles> softmax;

  if (n_blocks > 0) {
    load_rows<T, Tile, Tile::kBlockM>(sQ, q, p.q.row_stride, rows);
    load_rows<T, Tile, Tile::kBlockN>(sK, k, p.k.row_stride, seq.seqlen_k);
    ptx::cp_async_commit();
  }
  for (int j = 0; j < n_blocks; ++j) {
    const int n0 = j * Tile::kBlockN;
    ptx::cp_async_wait<0>();
    __syncthreads();  // K_j visible to all; every warp is done with V_{j-1}
    load_rows<T, Tile, Tile::kBlockN>(sV, v + n0 * p.v.row_stride, p.v.row_stride, seq.seqlen_k - n0);
    ptx::cp_async_commit();

    float s[Tile::kMTiles][Tile::kNTiles][4];
    scores<T, Tile>(s, sQ, sK, warp_row0, lane);
    const bool crosses_end = n0 + Tile::kBlockN > seq.seqlen_k;
    const bool crosses_diagonal = p.causal && n0 + Tile::kBlockN - 1 > m0 + causal_shift;
    if (crosses_end || crosses_diagonal)
      mask_scores(s, m0 + warp_row0 + lane / 4 - n0, 2 * (lane % 4), seq.seqlen_k - n0, p.causal,
                  causal_shift);
    softmax.update(s, o, p.scale_log2);

    ptx::cp_async_wait<0>();
    __syncthreads();  // V_j visible to all; every warp is done with K_j
    if (j + 1 < n_blocks) {
      load_rows<T, Tile, Tile::kBlockN>(sK, k + (n0 + Tile::kBlockN) * p.k.row_stride, p.k.row_stride,
                                        seq.seqlen_k - n0 - Tile::kBlockN);
      ptx::cp_async_commit();
    }
    accumulate_pv<T, Tile>(o, s, sV, lane);
  }

  // Epilogue: normalized rows into this warp's own rows of sQ (only it read them), then
  // the whole tile out with 16-byte stores.
  float inv_sum[Tile::kMTiles][2], row_lse[Tile::kMTiles][2];
  softmax.finish(inv_sum, row_lse, p.scale_log2);
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + mt * 16 + half * 8 + lane / 4;
#pragma unroll
      for (int dt = 0; dt < Tile::kDTiles; ++dt) {
        const uint32_t packed = ptx::pack2<T>(o[mt][dt][2 * half] * inv_sum[mt][half],
                                              o[mt][dt][2 * half + 1] * inv_sum[mt][half]);
        *reinterpret_cast<uint32_t*>(sQ + row * Tile::kPitch + dt * 8 + 2 * (lane % 4)) = packed;
      }
      if (lse && lane % 4 == 0 && row < rows) lse[row] = row_lse[mt][half];
    }
  }
  __syncthreads();
  store_rows<T, Tile>(out, p.out.row_stride, sQ, rows);
}

}  // namespace llmk::detail
