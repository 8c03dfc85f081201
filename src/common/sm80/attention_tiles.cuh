// The mma.sync tile pieces of attention on the sm_80 instruction set, shared by the sm_80
// forward (attention/sm80/forward_kernel.cuh), the sm_80 backward (attention/sm80/
// backward_kernel.cuh) and decode (decode/decode_tile.cuh, attention_decode_kernel.cuh): the tile shape of a
// block of query rows against a block of keys (ForwardTile), rows of a [rows, D] tile into
// shared memory by cp.async (load_rows, padded or swizzled) and out with 16-byte stores
// (store_rows), S = Q K^T (scores) and O += P V (accumulate_pv) for one warp's rows.
#pragma once

#include <cstdint>

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
// its line (read back through LaneAddress, common/sm80/mma_tiles.cuh); a pass covers a
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

}  // namespace llmk::detail
