// Launcher of the Hopper attention backward main kernels (sm90/backward_kernel.cuh at
// head dims 64, 96 and 128, sm90/backward_hd256_kernel.cuh at 256): which calls they
// take, the TMA maps over q, k, v, dout and the dq accumulator, the grid. The rows kernels
// before and after them are the sm_80 path's (sm80/backward.cu); the deterministic path
// is the same kernels with their dq reductions in key-block order.
//
// Instantiations (the only list): {bf16, fp16} x head dim {64 (both dQ orders), 96, 128, each
// on a grid of one block per unit and on a persistent grid; 256}, and {bf16, fp16} x {64, 96,
// 128, 256} with the score variants compiled in (one block per unit, the consumers meeting for
// dQ), which every call with a window or softcap takes (scores_vary). Head dim 32 (rows of half a
// 128-byte swizzle chunk), head dims LLMK_HEAD_DIMS leaves out, and strides TMA cannot address
// take the sm_80 main kernel.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/attention_params.h"
#include "attention/sm90/backward_hd256_kernel.cuh"
#include "attention/sm90/backward_kernel.cuh"
#include "attention/sm90/maps.h"
#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "common/sm90/kernel_support.h"
#include "common/sm90/tma.h"

namespace llmk::detail {

namespace {

// Whether the call's scores differ from the plain ones (a window or a softcap): those calls take
// the kernels with the variants compiled in. Sinks alone need nothing of the kernels (the
// forward's lse holds them).
bool scores_vary(const AttentionParams& p) { return p.variants.window > 0 || p.variants.softcap > 0.0f; }

template <int kHeadDim>
using TileOf = std::conditional_t<kHeadDim == 256, sm90::AttentionBackwardSm90Hd256Tile,
                                  sm90::AttentionBackwardSm90Tile<kHeadDim>>;

template <class T, int kHeadDim, bool kDqOfPreviousTile = false, bool kPersistent = false, bool kVariants = false>
const void* kernel_for() {
  if constexpr (kHeadDim == 256) {
    return reinterpret_cast<const void*>(sm90::attention_backward_sm90_hd256_kernel<T, kVariants>);
  } else {
    return reinterpret_cast<const void*>(
        sm90::attention_backward_sm90_kernel<T, kHeadDim, kDqOfPreviousTile, kPersistent, kVariants>);
  }
}

// Head dim 64 issues each tile's dQ during the next tile (the consumers never meet) where the
// longest walk has at least 16 query tiles (32 causal, whose walks average half of it): the
// overlap pays on long walks and costs on short ones, where the first tile's stand-in GEMM is
// a large share. At head dim 128 it does not pay.
bool dq_of_previous_tile(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  if (p.head_dim != 64 || scores_vary(p)) return false;  // the variants' kernels: the consumers meet
  const int64_t tiles = (int64_t{p.seqlen_q} + TileOf<64>::kBlockM - 1) / TileOf<64>::kBlockM * p.group;
  return tiles >= (p.causal ? 32 : 16);
}

// Dense non-causal calls at head dims 64, 96 and 128 run on a persistent grid: one CTA per SM
// walking units (key blocks) at a stride, so that a unit's K, V and first Q and dO load while
// the unit before finishes and stores dk, dv: with one block per unit each wave of blocks
// costs a fixed start beyond its tiles, a large share of a short walk. Causal units differ (a
// static stride would give the longest to the same CTAs), varlen ones too; head dim 256's
// kernel walks one unit per block. At head dim 96 the default path loses from 8192 keys, so
// there it persists only when deterministic.
bool persistent_grid(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const bool long_walk_at_96 = p.head_dim == 96 && !bp.dq_ordered && p.seqlen_k > 4096;
  return p.head_dim != 256 && !p.causal && p.cu_seqlens_q == nullptr && !long_walk_at_96 && !scores_vary(p);
}

// The persistent grid's CTAs: the SMs, or where blocks wait on each other (dq turns, the first
// store) and a sequence's key blocks fit the SMs, a multiple of those key blocks, so that each
// sequence's units run at once (a turn may wait on a unit of its sequence later in the order).
int64_t persistent_ctas(const AttentionBackwardParams& bp, int key_blocks, int64_t units) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = sm_count_of(device);
  const bool waits = bp.dq_ordered || bp.dq_first_store;
  const int ctas = waits && key_blocks <= sms ? sms / key_blocks * key_blocks : sms;
  return std::min<int64_t>(ctas, units);
}

// The key block of the kernel that takes head dim `head_dim` (64 keys at 256, else 128).
int block_n_of(int head_dim) { return head_dim == 256 ? TileOf<256>::kBlockN : TileOf<128>::kBlockN; }

template <class T, int kHeadDim>
void launch(const AttentionBackwardParams& bp, DType dtype, cudaStream_t stream) {
  using Tile = TileOf<kHeadDim>;
  const AttentionParams& p = bp.fwd;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  if (rows_k == 0 || bp.heads_kv == 0 || p.batch == 0) return;
  sm90::AttentionBackwardSm90Maps maps{};
  maps.k = attention_tma_map(p.k, dtype, kHeadDim, bp.heads_kv, rows_k, batch, Tile::kBlockN);
  maps.v = attention_tma_map(p.v, dtype, kHeadDim, bp.heads_kv, rows_k, batch, Tile::kBlockN);
  // Without query rows no block loads Q or dO (it only writes dk = dv = 0): k's map stands
  // in for theirs, as TMA has no map of 0 rows.
  maps.q = rows_q > 0 ? attention_tma_map(p.q, dtype, kHeadDim, p.heads_q, rows_q, batch, Tile::kBlockM) : maps.k;
  maps.dout =
      rows_q > 0 ? attention_tma_map(bp.dout, dtype, kHeadDim, p.heads_q, rows_q, batch, Tile::kBlockM) : maps.k;
  // The accumulator (lse's layout times D) for the dq reductions; without query rows no tile
  // reduces (k's map stands in).
  maps.dq_accum = maps.k;
  if (rows_q > 0) {
    sm90::TmaShape s{};
    s.base = bp.dq_accum;
    s.dtype = DType::f32;
    s.rank = 4;
    s.dims[0] = kHeadDim;
    s.dims[1] = static_cast<uint64_t>(rows_q);
    s.dims[2] = static_cast<uint64_t>(p.heads_q);
    s.dims[3] = static_cast<uint64_t>(batch);
    s.strides[1] = kHeadDim;
    s.strides[2] = static_cast<uint64_t>(p.lse_head_stride) * kHeadDim;
    s.strides[3] = static_cast<uint64_t>(p.lse_batch_stride) * kHeadDim;
    s.box[0] = 32;
    s.box[1] = 64;
    s.box[2] = 1;
    s.box[3] = 1;
    maps.dq_accum = sm90::make_tma("attention_backward", s);
  }
  // One unit per key block, kv head and batch entry, key blocks in order: causal blocks with
  // the first keys see the most query tiles and start first (deterministic causal calls
  // reverse it: KeyBlockWalk maps the unit). The persistent grid is one-dimensional: fewer
  // CTAs than units, each walking several (persistent_ctas).
  const bool previous = dq_of_previous_tile(bp);
  const void* kernel = scores_vary(p) ? kernel_for<T, kHeadDim, false, false, true>()
                       : previous       ? kernel_for<T, kHeadDim, kHeadDim == 64>()
                                        : kernel_for<T, kHeadDim>();
  const int key_blocks = sm90::grid_key_blocks<Tile::kBlockN>(bp);
  dim3 grid(key_blocks, bp.heads_kv, p.batch);
  int shared_bytes = Tile::kSharedBytes;
  if constexpr (kHeadDim != 256) {
    if (persistent_grid(bp)) {
      kernel = previous ? kernel_for<T, kHeadDim, kHeadDim == 64, true>() : kernel_for<T, kHeadDim, false, true>();
      shared_bytes = sm90::AttentionBackwardSm90Tile<kHeadDim, true>::kSharedBytes;  // the persistent tile's
      const int64_t units = sm90::key_block_units<Tile::kBlockN>(bp);
      LLMK_CHECK(units <= INT32_MAX, "attention_backward: more than 2^31 - 1 key blocks x kv heads x batch entries");
      grid = dim3(static_cast<unsigned>(persistent_ctas(bp, key_blocks, units)));
    }
  }
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  void* args[] = {&maps, const_cast<AttentionBackwardParams*>(&bp)};
  LLMK_CUDA_CHECK(cudaLaunchKernel(kernel, grid, dim3(Tile::kThreads), args, shared_bytes, stream));
}

// A compiled kernel, to ask whether the device runs this build's sm_90a code.
template <int kDim = first_sm90_head_dim()>
const void* any_kernel() {
  if constexpr (kDim == 0) return nullptr;
  else return kernel_for<__nv_bfloat16, kDim>();
}

}  // namespace

bool attention_backward_sm90_takes(const AttentionBackwardParams& bp, DType dtype, int device, const char** why) {
  const AttentionParams& p = bp.fwd;
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (dtype != DType::f16 && dtype != DType::bf16) return *why = "the dtype is not float16 or bfloat16", false;
  if (!attention_sm90_head_dim(p.head_dim))
    return *why = "this build's Hopper backward does not take the head dim (llmk::attention_sm90_head_dims)", false;
  if (!attention_tma_ok(p.q, varlen) || !attention_tma_ok(p.k, varlen) || !attention_tma_ok(p.v, varlen) ||
      !attention_tma_ok(bp.dout, varlen))
    return *why = "q, k, v and dout need 16-byte aligned data pointers and strides for TMA", false;
  if (reinterpret_cast<uintptr_t>(bp.dq_accum) % 16 != 0)
    return *why = "the workspace needs a 16-byte aligned pointer for TMA", false;
  for (const AttentionTensor* t : {&bp.dk, &bp.dv})
    if (reinterpret_cast<uintptr_t>(t->data) % 4 != 0 || t->row_stride % 2 != 0)
      return *why = "dk and dv need 4-byte aligned rows", false;
  if (!sm90::sm90a_kernel_runs(any_kernel<>(), device))
    return *why = "the device is not sm_90 or this build has no sm_90a code", false;
  return true;
}

void attention_backward_sm90_plan(AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  static_assert(TileOf<64>::kBlockN == TileOf<128>::kBlockN, "one key block size below head dim 256");
  const int block_n = block_n_of(p.head_dim);
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const int key_blocks = (p.seqlen_k + block_n - 1) / block_n;
  // A sequence's key blocks fit the SMs (one block per SM): with blocks dispatched in blockIdx
  // order, a block may then wait on one dispatched after it (the device's SM count: a
  // partition of the GPU with fewer SMs could hang such waits).
  const bool resident = key_blocks <= sm_count_of(device);
  // Every row of the dq accumulator is in some key block's tiles (dense, so no box of a tile
  // reaches into another sequence's rows; with keys; causal, no row without keys).
  const bool covered = p.cu_seqlens_q == nullptr && p.seqlen_k > 0 && (!p.causal || p.seqlen_q <= p.seqlen_k);
  // Where the first store pays: the zeroing it saves is a fixed cost per token, its waits grow
  // with the walk, so it takes short walks (up to 4096 keys causal, 1024 non-causal; the same
  // key counts at head dim 256, whose key blocks are 64).
  const bool short_walks = p.seqlen_k <= (p.causal ? 4096 : 1024);
  // The first store: rank 0 reaches its tile no later than any other block (causal, the
  // tile's highest key block; non-causal, the rotated walk's first arrival), but may be
  // dispatched after them (except deterministic causal, whose grid runs last blocks first),
  // hence `resident`; deterministic non-causal short walks are rotated, so resident too.
  bp.dq_first_store = bp.dq_counters != nullptr && covered && short_walks && (bp.dq_ordered || resident);
  // Non-causal walks rotated where resident: deterministic, its turns then follow the order
  // in which the blocks reach a tile; the default path only with the first store (its first
  // block then reaches each tile a step before the next), since alone it does not pay.
  bp.rotate_walk = !p.causal && resident && (bp.dq_ordered || bp.dq_first_store);
}

void attention_backward_sm90(const AttentionBackwardParams& bp, DType dtype, cudaStream_t stream) {
  auto with_type = [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    // The head dims LLMK_HEAD_DIMS builds (attention_backward_sm90_takes turned the others away).
    for_compiled_head_dim("attention_backward", bp.fwd.head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if constexpr (attention_sm90_head_dim(D)) launch<T, D>(bp, dtype, stream);
    });
  };
  if (dtype == DType::bf16) with_type(DTypeTag<DType::bf16>{});
  else with_type(DTypeTag<DType::f16>{});
  LLMK_CHECK_LAUNCH("attention_backward_sm90 main kernel", stream);
}

}  // namespace llmk::detail
