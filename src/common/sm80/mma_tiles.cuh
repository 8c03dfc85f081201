// The warp-level mma.sync m16n8k16 GEMM pieces of the sm_80 kernels (attention's backward
// today; any kernel that multiplies tiles of shared memory on the sm_80 instruction set):
// ldmatrix lane addresses (padded or load_rows' swizzled rows), one warp's share of a GEMM
// with both operands from shared memory (mma_ss) or A from the accumulators of an earlier
// GEMM (mma_rs), the accumulators rounded into shared memory (store_acc) or zeroed, and the
// 4-byte cp.async. Accumulator fragments are float [kMT][kNT][4]: kMT 16-row x kNT 8-column
// tiles, a thread holding rows lane / 4 and lane / 4 + 8, columns 2 (lane % 4) + {0, 1}.
// Namespace bwd: the names the attention backward has always called them by.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

namespace llmk::detail::bwd {

// ldmatrix_x4 row addresses (element offsets) for a 16 x 16 block of 2 x 2 8x8 matrices
// stored with `pitch` elements per row, the four matrices taken in column-major order
// ((0,0), (1,0), (0,1), (1,1) in 8-row, 8-column blocks) or in row-major order.
__device__ __forceinline__ int lane_blocks_col_major(int lane, int pitch) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * pitch + (lane >> 4) * 8;
}
__device__ __forceinline__ int lane_blocks_row_major(int lane, int pitch) {
  return ((lane & 7) + (lane >> 4) * 8) * pitch + ((lane >> 3) & 1) * 8;
}

template <bool kTrans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans) ptx::ldmatrix_x4_trans(r, addr);
  else ptx::ldmatrix_x4(r, addr);
}

// A lane's ldmatrix address in a [rows][cols] tile of kRowBytes per row, stepped by 16-row and
// 16-column (32-byte) blocks. kSwizzled (load_rows' layout; the tile 128-byte aligned, the
// lane's row r at a multiple of 8 rows from it): the chunk c of row r is stored at c ^ (r % 8),
// so the lane's address is XOR-ed with (r % 8) * 16 once and each column step j XOR-s its
// low two bits (j % 4) * 32 and adds whole lines (j / 4) * 128. That is the swizzled address
// of chunk c + 2j as long as the lane's own chunk and 2 (j % 4) share no bit (the lane's
// chunk is 0 or 1 past a column offset that is a multiple of the steps' span: BackwardTile).
// The 8 rows of an 8x8 matrix then read 8 different 16-byte bank groups.
template <uint32_t kRowBytes, bool kSwizzled>
struct LaneAddress {
  uint32_t base;
  __device__ __forceinline__ LaneAddress(uint32_t address, int row)
      : base(kSwizzled ? address ^ ((row % 8) << 4) : address) {}
  __device__ __forceinline__ uint32_t at(int rows16, int cols16) const {
    if constexpr (kSwizzled) return (base ^ ((cols16 % 4) << 5)) + rows16 * 16 * kRowBytes + (cols16 / 4) * 128;
    else return base + rows16 * 16 * kRowBytes + cols16 * 32;
  }
};

// The B operand's lane address (a pair of 8-column tiles per ldmatrix_x4): `b` points at
// B(0, 0), stored [n][k] (Q of K Q^T), or, kBTrans, [k][n] (dO of P^T dO); a pair of B
// fragments is the blocks of [n][k] in row-major order, of [k][n] transposed in column-major
// order.
template <class T, bool kBTrans, int kBPitch, bool kBSwizzled>
__device__ __forceinline__ LaneAddress<kBPitch * sizeof(T), kBSwizzled> b_lane_address(const T* b, int lane) {
  const int offset = kBTrans ? lane_blocks_col_major(lane, kBPitch) : lane_blocks_row_major(lane, kBPitch);
  return {ptx::smem_address(b + offset), lane % 8};  // both orders put the lane in row lane % 8 of 8
}

// acc += A B over k-step ks of 16: A as kMT fragments, B as kNT / 2 fragment pairs read by
// ldmatrix at `b` (b_lane_address: B [n][k] steps n by rows, [k][n] by columns).
template <class T, bool kBTrans, int kMT, int kNT, class BLane>
__device__ __forceinline__ void mma_k_step(float (&acc)[kMT][kNT][4], const uint32_t (&af)[kMT][4], const BLane& b,
                                           int ks) {
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t bf[4];
    ldmatrix<kBTrans>(bf, kBTrans ? b.at(ks, np) : b.at(np, ks));
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      ptx::mma_16x8x16<T>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
      ptx::mma_16x8x16<T>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
    }
  }
}

// One warp's share of a GEMM: acc (kMT 16-row x kNT 8-column tiles) += A B over kK steps of
// 16, both operands by ldmatrix from shared memory. `a` points at A(0, 0), A stored [rows][k]
// (kATrans false: K of S^T = K Q^T) or [k][rows] (kATrans: dS^T read as dS); `b` at B(0, 0)
// (b_lane_address; kBSwizzled: load_rows' swizzled layout). An A fragment (a0..a3 = rows
// 0-7 | 8-15 x k 0-7 | 8-15) is the blocks of [rows][k] in column-major order, of [k][rows]
// transposed in row-major order.
template <class T, int kMT, int kNT, int kK, bool kATrans, int kAPitch, bool kBTrans, int kBPitch, bool kBSwizzled>
__device__ __forceinline__ void mma_ss(float (&acc)[kMT][kNT][4], const T* a, const T* b, int lane) {
  static_assert(kNT % 2 == 0, "B fragments come in pairs of 8-column tiles");
  constexpr uint32_t kARow = kAPitch * sizeof(T);
  constexpr uint32_t kAStepM = kATrans ? 32 : 16 * kARow, kAStepK = kATrans ? 16 * kARow : 32;
  const uint32_t a_lane = ptx::smem_address(
      a + (kATrans ? lane_blocks_row_major(lane, kAPitch) : lane_blocks_col_major(lane, kAPitch)));
  const auto b_lane = b_lane_address<T, kBTrans, kBPitch, kBSwizzled>(b, lane);
  // Unrolled, with the A fragments of step ks + 1 loaded before step ks's mmas (two fragment
  // sets, the B pairs loaded inside each step): every address is an immediate offset and the
  // loads run one step ahead. A loop left rolled spent a third of the issue slots on address
  // arithmetic and branches and waited on each step's ldmatrix, and ran slower; a
  // plain unrolled one let ptxas hoist every step's fragments and spill 8-52 B. Spills left:
  // the dq kernel at D = 64 (48 B) and 96 (8 B) on sm_90a; on sm_80 the main kernel at D = 64
  // (32 B) and the dq kernel at D = 32 (8 B) and 64 (48 B), not measured on an A100.
  static_assert(kK % 2 == 0, "k-steps in pairs");
  auto load_a = [&](uint32_t(&af)[kMT][4], int ks) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) ldmatrix<kATrans>(af[mt], a_lane + mt * kAStepM + ks * kAStepK);
  };
  uint32_t af0[kMT][4], af1[kMT][4];
  load_a(af0, 0);
#pragma unroll
  for (int ks = 0; ks < kK; ks += 2) {
    load_a(af1, ks + 1);
    mma_k_step<T, kBTrans>(acc, af0, b_lane, ks);
    if (ks + 2 < kK) load_a(af0, ks + 2);
    mma_k_step<T, kBTrans>(acc, af1, b_lane, ks + 1);
  }
}

// As mma_ss with A from the fp32 accumulators `p` of an earlier GEMM of this warp
// (16 kMT rows x 16 kK columns: the accumulators of two adjacent 8-column tiles, rounded to
// T and packed in pairs, are an A fragment), B in padded rows.
template <class T, int kMT, int kNT, int kK, bool kBTrans, int kBPitch>
__device__ __forceinline__ void mma_rs(float (&acc)[kMT][kNT][4], const float (&p)[kMT][2 * kK][4], const T* b,
                                       int lane) {
  static_assert(kNT % 2 == 0, "B fragments come in pairs of 8-column tiles");
  const auto b_lane = b_lane_address<T, kBTrans, kBPitch, false>(b, lane);
#pragma unroll
  for (int ks = 0; ks < kK; ++ks) {
    uint32_t af[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      af[mt][0] = ptx::pack2<T>(p[mt][2 * ks][0], p[mt][2 * ks][1]);
      af[mt][1] = ptx::pack2<T>(p[mt][2 * ks][2], p[mt][2 * ks][3]);
      af[mt][2] = ptx::pack2<T>(p[mt][2 * ks + 1][0], p[mt][2 * ks + 1][1]);
      af[mt][3] = ptx::pack2<T>(p[mt][2 * ks + 1][2], p[mt][2 * ks + 1][3]);
    }
    mma_k_step<T, kBTrans>(acc, af, b_lane, ks);
  }
}

// Accumulators times `scale`, rounded to T, into shared memory at `smem` (the warp's tile
// origin), `kPitch` elements per row: 4-byte stores, conflict-free for pitches of 16k + 8.
template <class T, int kPitch, int kMT, int kNT>
__device__ __forceinline__ void store_acc(T* smem, const float (&acc)[kMT][kNT][4], float scale, int lane) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      T* row = smem + (mt * 16 + half * 8 + lane / 4) * kPitch + 2 * (lane % 4);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        *reinterpret_cast<uint32_t*>(row + nt * 8) =
            ptx::pack2<T>(acc[mt][nt][2 * half] * scale, acc[mt][nt][2 * half + 1] * scale);
    }
}

template <int kMT, int kNT>
__device__ __forceinline__ void zero(float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
}

// 4 bytes global -> shared; `valid` false writes 0 and reads nothing.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

}  // namespace llmk::detail::bwd
