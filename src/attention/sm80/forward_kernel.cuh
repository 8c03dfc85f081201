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
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/sm80/attention_tiles.cuh"

namespace llmk::detail {

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
