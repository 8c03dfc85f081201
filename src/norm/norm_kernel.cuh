// Forward kernels of the normalization family: RMSNorm (kCentered = false, optionally
// with a fused residual add, kAdd, or a SiLU gate, kGate) and LayerNorm (kCentered = true):
//   s    = kAdd ? round_T(x + residual) : x         (s is stored to residual_out if kAdd)
//   mean = kCentered ? mean(s) : 0
//   rstd = rsqrt(mean((s - mean)^2) + eps)
//   out  = (s - mean) * rstd * (offset + weight) + bias   fp32 math, one rounding
//   kGate: out = s * rstd * (offset + weight) * silu(gate)  (gate read in the first pass
//   with the row when the weight is, so a decode-sized call still pays one round trip)
// (a missing weight counts as 1, a missing bias as 0).
//
// Algorithm. Three kernels hold the row in registers in its storage dtype (4 registers per
// 16-byte vector) and share one row body (norm_row): one pass reads the row, reductions
// give the statistics (LayerNorm: the mean first, then the centered sum of squares from
// registers, which is exact where E[x^2] - E[x]^2 would cancel), a second pass over the
// registers writes the output: the row is read from memory exactly once.
//  - norm_vec_kernel, the register kernel: one block per row (grid-strided); thread t holds
//    VPT vectors at columns (i * blockDim + t) * N, so each load is coalesced; block
//    reductions (two barriers each). The launcher picks VPT (and so the block size) that
//    keeps the most threads resident per SM, from the compiled kernels' register counts;
//    for a few rows (decode) the most threads per row, for latency. Rows of at most 32
//    vectors share a block (VPT 1: blockDim.y rows of blockDim.x lanes, shuffles within
//    the row's lanes). With VPT <= 4 the weight (and gate) come with the row: a lone row
//    pays one memory round trip. kLean (LayerNorm and the gated form over many rows)
//    prefetches nothing into registers (the gate is read from memory in the output pass, the
//    weight from L1/L2: a second round trip per row, which the doubled resident rows cover;
//    the gated form at VPT 4 and 8 stages both in shared memory instead, below),
//    re-converts the row after each reduction and takes the fast silu: 32-50 registers at
//    VPT 1-4 in bf16 instead of 38-112.
//  - norm_warp_kernel: one warp per row (rows of 33-128 vectors), 8 rows per 256-thread
//    block; each lane holds VPL = 2-4 vectors; reductions are 5 butterfly shuffles (no
//    barrier, no shared memory); the weight and bias come from L1 in the output pass.
//    LayerNorm with weight and bias (kAffine, both known present at compile time):
//    32-40 registers in 16-bit types (48 with fp32 parameters); the gated form 40 (48).
//  - norm_loop_kernel (not a register kernel): each thread strides over the row, which is
//    re-read from L1/L2 for each pass; vectors for RMSNorm over many long rows (32
//    registers, 2048 threads per SM), scalars for rows that are not 16-byte aligned.
//
// Roofline (bf16, rows x d): bytes = 2 * rows * d * 2 (+ 2 * rows * d * 2 with kAdd: read
// residual, write residual_out; + rows * d * 2 with kGate: read the gate) + weight (+ bias);
// FLOPs ~4-6 per element (the gate's exp and division ~8 more), so purely bandwidth bound:
// 8192 x 4096 bf16 moves 134 MB -> 44.7 us (gated: 201 MB -> 67 us), 8192 x 1024 moves
// 33.6 MB -> 11.2 us, at the measured 3.0 TB/s copy rate. What keeps a kernel off that floor is bytes
// in flight per SM (~20 KB at ~1 us latency): the register count sets the resident rows,
// and each row's loads are in flight only until its first reduction.
#pragma once

#include <cstdint>

#include "common/activation_math.cuh"
#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/norm_params.h"

namespace llmk::detail {

// The weight of one column as the affine step uses it: offset + w (w = 1 when there is no
// weight; the loop backward's scalar path).
template <class W>
__device__ __forceinline__ float norm_scale(float offset, bool has_weight, W w) {
  return offset + (has_weight ? to_float(w) : 1.0f);
}

// A vector of N copies of v (exact in every dtype for the 0 and 1 it is used with).
template <class W, int N>
__device__ __forceinline__ Vec<W, N> filled_vec(float v) {
  Vec<W, N> out;
#pragma unroll
  for (int j = 0; j < N; ++j) out.v[j] = from_float<W>(v);
  return out;
}

// silu(g) = g / (1 + exp(-g)). kFast (the lean, warp and streaming kernels) divides with
// __fdividef, an approximate reciprocal within 2 ulp (as __expf's own error; 0 for
// denominators over 2^126, where g / (1 + exp(-g)) is below 1e-36): the IEEE division's slow
// path held 7-14 registers more in the gated warp and lean kernels (VPL 4: 57 -> 48, lean
// VPT 2: 46 -> 32 in bf16) and made the gated streaming kernel spill at its 32 registers.
template <bool kFast = false>
__device__ __forceinline__ float silu(float g) {
  if constexpr (kFast) return __fdividef(g, 1.0f + __expf(-g));
  else return ActivationMath<Activation::silu>::value(g);
}

// This thread's part of a row sum: the elements of its register vectors that lie in the row
// (in_row(i): vector i does). The caller reduces it over the row's threads.
template <class T, int N, int VPT, class InRow>
__device__ __forceinline__ float thread_row_sum(const Vec<T, N> (&v)[VPT], InRow in_row) {
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    if (in_row(i))
#pragma unroll
      for (int j = 0; j < N; ++j) total += to_float(v[i].v[j]);
  return total;
}

// A row's sum: over the row's lanes when a block may hold several short rows, else the block.
template <bool kShortRows>
__device__ __forceinline__ float norm_sum(float v) {
  if constexpr (kShortRows) return row_sum(v);
  else return block_sum(v);
}

// The lean gated block kernel at VPT 4 and 8 stages the output pass's weight and gate in
// shared memory: thread t copies its vectors of the weight once per block (the grid is the
// resident blocks, each walking many rows) and of each row's gate beside its first-pass loads
// of the row (cp.async), and the output pass reads them back from there. Loaded in the output
// pass (the other lean kernels), each vector's weight and gate loads come after the previous
// vector's store, which may alias them: VPT dependent memory round trips per row (8 at
// Llama-3-8B's 14336 columns), which kept the kernel well off the copy rate. Registers
// (bf16): VPT 4 52, VPT 8 95, so rows of 1025-2048 vectors take VPT 4, two 448-512-thread
// blocks per SM. VPT 16 (rows of
// 32k-64k bf16 columns) is not staged: 128 KB per block at 512 threads.
template <bool kLean, bool kGate, int VPT>
inline constexpr bool kNormStagesOperands = kLean && kGate && (VPT == 4 || VPT == 8);

// LayerNorm's lean kernels with parameters no wider than the row (16-bit rows and parameters,
// or fp32 both) issue every memory load of a row before its first use:
//  - the block kernel at VPT 2 reads out-of-row vectors as zeros, so the mean needs no
//    per-vector branch (under one, ptxas issued vector i + 1's load after vector i's sum: two
//    DRAM round trips per row instead of one; VPT 4 and 8 already issued theirs together);
//    32 -> 40 registers in bf16, so rows of 256+ vectors take VPT 2 over VPT 1's blocks of
//    256-512 threads (norm_launch.cuh);
//  - the warp kernel loads the weight and bias with the row (kAffine): in the output pass each
//    vector's loads came after the previous vector's store, which may alias them, VPL dependent
//    L1/L2 round trips per row (bf16: VPL 4 takes more registers and half the blocks per SM,
//    and is still faster).
// Faster on the shapes measured but the small 2048 x 2048, where 12 blocks per SM of 128
// threads instead of 16 leave 2048 rows two waves (docs/history/layernorm.md).
template <class T, class W, bool kLean, bool kCentered>
inline constexpr bool kNormLoadsFirst = kLean && kCentered && sizeof(W) <= sizeof(T);

// The staging's dynamic shared memory: per thread VPT vectors of the gate (T) and the weight (W).
template <class T, class W, int N, int VPT, bool kLean, bool kGate>
constexpr size_t norm_stage_bytes(int threads) {
  return kNormStagesOperands<kLean, kGate, VPT> ? size_t{VPT} * threads * (sizeof(Vec<T, N>) + sizeof(Vec<W, N>))
                                                  : 0;
}

// The staging's slots in the dynamic shared memory: VPT * lanes vectors of the gate, then as
// many of the weight; thread t's vector i is slot i * lanes + t of each.
template <class T, class W, int N, int VPT>
struct NormStageSlots {
  Vec<T, N>* gate;
  Vec<W, N>* weight;
  __device__ explicit NormStageSlots(int lanes) {
    extern __shared__ __align__(16) uint8_t norm_stage[];
    gate = reinterpret_cast<Vec<T, N>*>(norm_stage);
    weight = reinterpret_cast<Vec<W, N>*>(gate + VPT * lanes);
  }
};

// One vector of N elements from global `src` into shared `dst` by 16-byte cp.async copies.
template <class E, int N>
__device__ __forceinline__ void stage_vec(Vec<E, N>* dst, const E* src) {
  static_assert(sizeof(Vec<E, N>) % 16 == 0, "whole 16-byte copies");
  const uint32_t to = ptx::smem_address(dst);
#pragma unroll
  for (int c = 0; c < static_cast<int>(sizeof(Vec<E, N>) / 16); ++c)
    ptx::cp_async_16(to + 16 * c, reinterpret_cast<const uint8_t*>(src) + 16 * c, true);
}

// A staged vector read back where the output pass uses it: the asm's memory clobber keeps the
// compiler from hoisting the reads to the top of the pass (bf16, VPT 4: 52 registers with it,
// 58 with plain reads).
template <class E, int N>
__device__ __forceinline__ Vec<E, N> read_staged(const Vec<E, N>* src) {
  Vec<E, N> out;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
  const uint32_t from = ptx::smem_address(src);
#pragma unroll
  for (int c = 0; c < static_cast<int>(sizeof(Vec<E, N>) / 16); ++c)
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(words[4 * c]), "=r"(words[4 * c + 1]), "=r"(words[4 * c + 2]), "=r"(words[4 * c + 3])
                 : "r"(from + 16 * c)
                 : "memory");
  return out;
}

// One row normalized by `lanes` threads: thread t holds VPT 16-byte vectors of the row at
// columns (i * lanes + t) * N, so each of the VPT loads is coalesced across the threads.
// `sum(v)` returns the row's total of v over those threads; `writer` is the one thread that
// stores the row's statistics. kLean holds only the row across the reductions (no weight or
// gate prefetch, each pass converts the row from its storage dtype again): the fewest
// registers, for many rows; otherwise the weight (and gate) come with the row when VPT <= 4,
// so that a lone row (decode) pays one memory round trip instead of two.
template <class T, class W, int N, int VPT, bool kAdd, bool kCentered, bool kGate, bool kLean, bool kAffine,
          int kLanes, class RowSum>
__device__ __forceinline__ void norm_row(const NormParams& p, int64_t row, int t, bool writer, RowSum sum) {
  const int lanes = kLanes > 0 ? kLanes : static_cast<int>(blockDim.x);
  constexpr bool kPrefetchWeight = !kLean && VPT <= 4;
  constexpr bool kRowLoadsFirst = kNormLoadsFirst<T, W, kLean, kCentered> && kLanes == 0 && VPT == 2;
  constexpr bool kPrefetchAffine = kNormLoadsFirst<T, W, kLean, kCentered> && kAffine && kLanes > 0;
  const int d = static_cast<int>(p.d);
  const float inv_d = 1.0f / static_cast<float>(d);
  // Vector i of this thread is at column col(i) of the row. With lanes known at compile
  // time (the warp kernel) the thread's first column is folded into the row pointers
  // once and each vector is an immediate offset from them, at(i); the block kernel
  // indexes by column (fewer registers when lanes is blockDim.x).
  const int first = kLanes > 0 ? t * N : 0;
  auto col = [&](int i) { return (i * lanes + t) * N; };
  auto at = [&](int i) { return col(i) - first; };
  auto in_row = [&](int i) { return col(i) < d; };
  const W* weight = static_cast<const W*>(p.weight) + first;
  const W* bias = static_cast<const W*>(p.bias) + first;
  // RMSNorm always has a weight and never a bias, and kAffine (LayerNorm with both, as
  // nn.LayerNorm calls it) has both: known at compile time, so those kernels spend no
  // registers or branches on the optional parameters (8-12 registers in the warp kernel).
  const bool has_weight = !kCentered || kAffine || p.weight != nullptr;
  const bool has_bias = kCentered && (kAffine || p.bias != nullptr);
  const T* x = static_cast<const T*>(p.x) + row * p.x_stride + first;
  const T* gate = kGate ? static_cast<const T*>(p.gate) + row * p.gate_stride + first : nullptr;
  Vec<T, N> s[VPT];
  Vec<W, N> w[kPrefetchWeight ? VPT : 1];
  Vec<T, N> z[kGate && kPrefetchWeight ? VPT : 1];
  Vec<W, N> wa[kPrefetchAffine ? VPT : 1], ba[kPrefetchAffine ? VPT : 1];
  constexpr bool kStage = kNormStagesOperands<kLean, kGate, VPT> && kLanes == 0;
  const NormStageSlots<T, W, N, VPT> staged(lanes);
  auto slot = [&](int i) { return i * lanes + t; };
  float sum_sq = 0.0f;  // RMSNorm: accumulated as the row arrives
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if constexpr (kRowLoadsFirst) s[i] = filled_vec<T, N>(0.0f);
    if (in_row(i)) {
      s[i] = load_vec<T, N>(x + at(i));
      if constexpr (kStage) {
        stage_vec(&staged.gate[slot(i)], gate + at(i));
      }
      if constexpr (kPrefetchAffine) {
        wa[i] = load_vec<W, N>(weight + at(i));
        ba[i] = load_vec<W, N>(bias + at(i));
      }
      if constexpr (kPrefetchWeight) {
        w[i] = has_weight ? load_vec<W, N>(weight + at(i)) : filled_vec<W, N>(1.0f);
        if constexpr (kGate) z[i] = load_vec<T, N>(gate + at(i));
      }
      if constexpr (kAdd) {
        const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride + first;
        const Vec<T, N> rv = load_vec<T, N>(res + at(i));
#pragma unroll
        for (int j = 0; j < N; ++j) s[i].v[j] = from_float<T>(to_float(s[i].v[j]) + to_float(rv.v[j]));
        store_vec(static_cast<T*>(p.residual_out) + row * p.residual_out_stride + first + at(i), s[i]);
      }
      if constexpr (!kCentered)
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float v = to_float(s[i].v[j]);
          sum_sq += v * v;
        }
    }
  }
  float mean = 0.0f, r;
  if constexpr (kCentered) {
    // The mean first, then the centered sum of squares from registers: exact where
    // E[x^2] - E[x]^2 would cancel (rows far from zero, outliers).
    mean = sum(kRowLoadsFirst ? thread_row_sum(s, [](int) { return true; }) : thread_row_sum(s, in_row)) * inv_d;
    float m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (in_row(i)) {
        if constexpr (kLean) opaque(s[i]);  // no fp32 copy of the row across the reduction
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float c = to_float(s[i].v[j]) - mean;
          m2 += c * c;
        }
      }
    r = rsqrtf(sum(m2) * inv_d + p.eps);
  } else {
    r = rsqrtf(sum(sum_sq) / static_cast<float>(d) + p.eps);
  }
  if constexpr (kStage) {
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();  // this thread's copies (and the weight's): it reads only its own slots
  }
  if (writer) {
    if (p.rstd != nullptr) p.rstd[row] = r;
    if constexpr (kCentered)
      if (p.mean != nullptr) p.mean[row] = mean;
  }
  T* out = static_cast<T*>(p.out) + row * p.out_stride + first;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (in_row(i)) {
      opaque(s[i]);
      // A missing weight reads as ones and a missing bias as zeros, so that both stay
      // packed until used (a conditionally loaded vector was unpacked into one register
      // per element: 16 more registers for the LayerNorm warp kernel).
      // The prefetched weight and bias are opaque here too, so that ptxas does not convert
      // them to fp32 across the reductions (VPL 4: 117 registers instead of 76).
      Vec<W, N> wv, bv;
      if constexpr (kPrefetchAffine) {
        opaque(wa[i]);
        opaque(ba[i]);
      }
      if constexpr (kPrefetchWeight) wv = w[i];
      else if constexpr (kPrefetchAffine) wv = wa[i];
      else if constexpr (kStage) wv = read_staged(&staged.weight[slot(i)]);
      else wv = has_weight ? load_vec<W, N>(weight + at(i)) : filled_vec<W, N>(1.0f);
      if constexpr (kPrefetchAffine) bv = ba[i];
      else bv = has_bias ? load_vec<W, N>(bias + at(i)) : filled_vec<W, N>(0.0f);
      Vec<T, N> zv;
      if constexpr (kGate) {
        if constexpr (kPrefetchWeight) zv = z[i];
        else if constexpr (kStage) zv = read_staged(&staged.gate[slot(i)]);
        else zv = load_vec<T, N>(gate + at(i));
      }
      Vec<T, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float v = to_float(s[i].v[j]);
        if constexpr (kCentered)
          y.v[j] = from_float<T>((v - mean) * r * (p.offset + to_float(wv.v[j])) + to_float(bv.v[j]));
        else if constexpr (kGate)
          y.v[j] = from_float<T>(v * r * (p.offset + to_float(wv.v[j])) * silu<kLean>(to_float(zv.v[j])));
        else
          y.v[j] = from_float<T>(v * r * (p.offset + to_float(wv.v[j])));
      }
      store_vec(out + at(i), y);
    }
  }
}

// The staged kernels' weight: thread t's VPT vectors (at columns (i * blockDim.x + t) * N) into
// its slots (NormStageSlots), once per block; the first row's wait covers them.
template <class T, class W, int N, int VPT>
__device__ __forceinline__ void stage_weight(const NormParams& p) {
  const int t = static_cast<int>(threadIdx.x), lanes = static_cast<int>(blockDim.x);
  const NormStageSlots<T, W, N, VPT> staged(lanes);
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    if ((i * lanes + t) * N < p.d)
      stage_vec(&staged.weight[i * lanes + t], static_cast<const W*>(p.weight) + (i * lanes + t) * N);
}

// The register kernel: one block per row (grid-strided), or with VPT = 1 and !kLean
// blockDim.y rows of blockDim.x <= 32 lanes per block. kLean, kAffine: see norm_row.
template <class T, class W, int N, int VPT, bool kAdd, bool kCentered, bool kGate, bool kLean = false,
          bool kAffine = false>
__global__ void __launch_bounds__(512) norm_vec_kernel(NormParams p) {
  // Only VPT 1 serves short rows: the row-group reductions cost the VPT-4 kernel 16
  // registers.
  constexpr bool kShortRows = !kLean && VPT == 1;
  const int rows_per_block = kShortRows ? blockDim.y : 1;
  // A block without a row exits before the wait, on a test that reads a field of each
  // 64-byte line of the parameter block (x, rows, eps; the host passes no null x and no eps
  // <= 0): see common/pdl_launch.h on the parameter block's first reads.
  if (int64_t{blockIdx.x} * rows_per_block >= p.rows || p.x == nullptr || !(p.eps > 0.0f)) return;
  ptx::pdl_start();
  if constexpr (kNormStagesOperands<kLean, kGate, VPT>) stage_weight<T, W, N, VPT>(p);
  for (int64_t row = int64_t{blockIdx.x} * rows_per_block + (kShortRows ? threadIdx.y : 0); row < p.rows;
       row += int64_t{gridDim.x} * rows_per_block)
    norm_row<T, W, N, VPT, kAdd, kCentered, kGate, kLean, kAffine, 0>(p, row, threadIdx.x, threadIdx.x == 0,
                                                                   [](float v) { return norm_sum<kShortRows>(v); });
}

// The warp kernel: one warp per row, kNormWarpRows rows per block, grid-strided over rows.
// Rows of 33..VPL * 32 vectors: each lane holds VPL vectors (4 registers each), the
// reductions are 5 butterfly shuffles each (no barrier, no shared memory), and the weight,
// bias and gate come in the output pass from L1 (kLean). A block-per-row launch of such a
// row had one vector per thread, two barriers per reduction and one 16-byte load in flight
// per thread; here each lane has VPL in flight and the kernel stays near 32 registers.
inline constexpr int kNormWarpRows = 8;

// Blocks per SM the warp kernel is compiled for (0: no bound, the other ops' kernels as
// they were). Left free, ptxas hoists the gated form's output-pass weight and gate loads
// of all VPL vectors: 48 registers at bf16 VPL 4 (5 blocks per SM), 56-64 with fp32
// parameters for 16-bit x (4); bounded, 40 (6 blocks) and 48 (5) without spilling (fp32
// parameters spilled at 40).
template <class T, class W, bool kGate>
constexpr int norm_warp_min_blocks() {
  if constexpr (!kGate) return 0;
  else return sizeof(W) <= sizeof(T) ? 6 : 5;
}

template <class T, class W, int N, int VPL, bool kAdd, bool kCentered, bool kGate, bool kAffine = false>
__global__ void __launch_bounds__(kNormWarpRows * 32, (norm_warp_min_blocks<T, W, kGate>()))
    norm_warp_kernel(NormParams p) {
  ptx::pdl_start();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t row = int64_t{blockIdx.x} * kNormWarpRows + threadIdx.x / 32; row < p.rows;
       row += int64_t{gridDim.x} * kNormWarpRows)
    norm_row<T, W, N, VPL, kAdd, kCentered, kGate, true, kAffine, 32>(p, row, lane, lane == 0,
                                                                      [](float v) { return warp_sum(v); });
}

// The streaming kernel: N-element vectors (N = 1: rows that are not 16-byte aligned),
// each thread striding over the row; the row is re-read for the output (and LayerNorm's
// centered pass) from L2, where it still is: a few rows per SM are in flight. It holds no
// row, so 32 registers and blocks of up to 1024 threads keep every SM full.
//
// Each pass walks the row in steps of kSteps vectors per thread whose loads are issued
// together: a step's vectors past the row re-read the thread's first vector of the step
// (its own, so an in-place call races with no other thread) and are left out. Before, under
// a loop unrolled 4 times with a row-end test between its vectors, ptxas issued each load
// after the previous vector's use (first pass) or store (output pass, whose store may alias
// the next load): one 16-byte load in flight per thread. Rows are addressed as arrays of
// vectors (VecRow), so that every access is one 16-byte instruction: stores through
// T pointers plus a run-time offset were split into 16-bit stores.
// One step of the streaming kernel's walk over a row: the row indices of a thread's kSteps
// vectors and which of them lie in the row.
template <int kSteps>
struct StreamStep {
  int64_t at[kSteps];
  bool in[kSteps];
};

// A step's vectors of a row, every load issued before any is used.
template <int kSteps, class V>
__device__ __forceinline__ void load_step(const V* src, const StreamStep<kSteps>& st, V (&vs)[kSteps]) {
#pragma unroll
  for (int k = 0; k < kSteps; ++k) vs[k] = src[st.at[k]];
}

template <class T, class W, int N, bool kAdd, bool kCentered, bool kGate>
__global__ void __launch_bounds__(1024, 2) norm_loop_kernel(NormParams p) {
  using VT = Vec<T, N>;
  using VW = Vec<W, N>;
  ptx::pdl_start();
  const VW* weight = static_cast<const VW*>(p.weight);
  const VW* bias = static_cast<const VW*>(p.bias);
  const bool has_weight = !kCentered || weight != nullptr;
  const bool has_bias = kCentered && bias != nullptr;
  const float inv_d = 1.0f / static_cast<float>(p.d);
  const int64_t vectors = p.d / N;
  // Two 16-byte vectors a step, except where the output pass holds three (LayerNorm's bias,
  // the gate) or a parameter vector twice the row's (fp32 weights of 16-bit rows), and for
  // scalars: there two steps spilled at this kernel's 32 registers.
  constexpr int kSteps = N > 1 && !kCentered && !kGate && sizeof(W) <= sizeof(T) ? 2 : 1;
  const int64_t step = int64_t{kSteps} * blockDim.x;
  using Step = StreamStep<kSteps>;
  // The step at vector v0 (this thread's first): each vector's index, v0 past the row, and
  // which of them lie in the row.
  auto step_at = [&](int64_t v0) {
    Step st;
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int64_t v = v0 + int64_t{k} * blockDim.x;
      st.in[k] = k == 0 || v < vectors;
      st.at[k] = st.in[k] ? v : v0;
    }
    return st;
  };
  auto row_of = [&](const void* base, int64_t stride, int64_t row) {
    return reinterpret_cast<const VT*>(static_cast<const T*>(base) + row * stride);
  };
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const VT* x = row_of(p.x, p.x_stride, row);
    VT* residual_out = const_cast<VT*>(row_of(p.residual_out, p.residual_out_stride, row));
    const VT* s_row = kAdd ? residual_out : x;  // the normalized input, for the later passes
    // Each thread revisits exactly the vectors it read (and, with kAdd, wrote) in the
    // first pass, so in-place calls need no barrier between the passes.
    float sum = 0.0f;  // of s (LayerNorm) or of s^2 (RMSNorm)
    for (int64_t v0 = threadIdx.x; v0 < vectors; v0 += step) {
      const Step st = step_at(v0);
      VT s[kSteps];
      load_step(x, st, s);
      if constexpr (kAdd) {
        VT r[kSteps];
        load_step(row_of(p.residual, p.residual_stride, row), st, r);
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
#pragma unroll
          for (int j = 0; j < N; ++j) s[k].v[j] = from_float<T>(to_float(s[k].v[j]) + to_float(r[k].v[j]));
          if (st.in[k]) residual_out[st.at[k]] = s[k];
        }
      }
#pragma unroll
      for (int k = 0; k < kSteps; ++k)
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float f = st.in[k] ? to_float(s[k].v[j]) : 0.0f;
          sum += kCentered ? f : f * f;
        }
    }
    float mean = 0.0f;
    if constexpr (kCentered) {  // a second pass (from L1/L2) for the centered sum of squares
      mean = block_sum(sum) * inv_d;
      sum = 0.0f;
      for (int64_t v0 = threadIdx.x; v0 < vectors; v0 += step) {
        const Step st = step_at(v0);
        VT s[kSteps];
        load_step(s_row, st, s);
#pragma unroll
        for (int k = 0; k < kSteps; ++k)
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float c = st.in[k] ? to_float(s[k].v[j]) - mean : 0.0f;
            sum += c * c;
          }
      }
    }
    const float r = rsqrtf(block_sum(sum) * inv_d + p.eps);
    if (threadIdx.x == 0) {
      if (p.rstd != nullptr) p.rstd[row] = r;
      if constexpr (kCentered)
        if (p.mean != nullptr) p.mean[row] = mean;
    }
    VT* out = const_cast<VT*>(row_of(p.out, p.out_stride, row));
    const VT* gate = kGate ? row_of(p.gate, p.gate_stride, row) : nullptr;
    for (int64_t v0 = threadIdx.x; v0 < vectors; v0 += step) {
      const Step st = step_at(v0);
      VT s[kSteps], z[kSteps];
      VW w[kSteps], b[kSteps];
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        s[k] = s_row[st.at[k]];
        w[k] = has_weight ? weight[st.at[k]] : filled_vec<W, N>(1.0f);
        b[k] = has_bias ? bias[st.at[k]] : filled_vec<W, N>(0.0f);
        if constexpr (kGate) z[k] = gate[st.at[k]];
      }
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        VT y;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float f = (to_float(s[k].v[j]) - mean) * r * (p.offset + to_float(w[k].v[j])) + to_float(b[k].v[j]);
          if constexpr (kGate) f *= silu<(N > 1)>(to_float(z[k].v[j]));
          y.v[j] = from_float<T>(f);
        }
        if (st.in[k]) out[st.at[k]] = y;
      }
    }
  }
}

}  // namespace llmk::detail
