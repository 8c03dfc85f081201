// Launcher of the Hopper attention forward (kernel in sm90/forward_kernel.cuh):
// which calls it takes, which tile, the TMA maps over q, k, v, the grid.
//
// Instantiations (the only list): {bf16, fp16} x {head dim 64 with 2 and 3 consumers, 96,
// 128, 256}, and the 2-consumer tiles again with the score variants (window, softcap, sinks)
// and the loads from a KV cache (attention_over_cache) compiled in. Head dim 32 (rows of half a 128-byte swizzle chunk), head dims LLMK_HEAD_DIMS
// leaves out, and strides TMA cannot address take the sm_80 kernel (sm80/forward.cu).
#include <numeric>

#include "attention/attention_params.h"
#include "attention/sm90/forward_kernel.cuh"
#include "attention/sm90/maps.h"
#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "common/sm90/kernel_support.h"

namespace llmk::detail {

namespace {

template <class T, int kHeadDim, int kConsumers, bool kVariants>
const void* kernel_for() {
  return reinterpret_cast<const void*>(sm90::attention_forward_sm90_kernel<T, kHeadDim, kConsumers, kVariants>);
}

template <class T, int kHeadDim, int kConsumers, bool kVariants>
void launch(const AttentionParams& p, DType dtype, cudaStream_t stream) {
  using Tile = sm90::AttentionSm90Tile<kHeadDim, kConsumers>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int heads_kv = p.heads_q / p.group;
  sm90::AttentionSm90Maps maps{};
  const int batch = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  if (rows_q == 0) return;
  maps.q = attention_tma_map(p.q, dtype, kHeadDim, p.heads_q, rows_q, batch, Tile::kBlockM);
  AttentionParams kp = p;
  if (p.cache_seqlens) {  // K and V over the cache's pages, boxes of whole swizzle atoms of a page
    kp.kv_box_rows = p.block_table ? std::gcd(p.page_size, Tile::kBlockN) : Tile::kBlockN;
    maps.k = attention_tma_map(p.k, dtype, kHeadDim, heads_kv, p.page_size, p.num_pages, kp.kv_box_rows);
    maps.v = attention_tma_map(p.v, dtype, kHeadDim, heads_kv, p.page_size, p.num_pages, kp.kv_box_rows);
  } else {
    // Without keys no block reads K or V (n_blocks is 0): q's map stands in for theirs, as
    // TMA has no map of 0 rows.
    maps.k = rows_k > 0 ? attention_tma_map(p.k, dtype, kHeadDim, heads_kv, rows_k, batch, Tile::kBlockN) : maps.q;
    maps.v = rows_k > 0 ? attention_tma_map(p.v, dtype, kHeadDim, heads_kv, rows_k, batch, Tile::kBlockN) : maps.q;
  }
  maps.tma_out = Tile::kTmaOut && attention_sm90_tma_out(p);
  if (maps.tma_out) maps.out = attention_tma_map(p.out, dtype, kHeadDim, p.heads_q, rows_q, batch, 16);
  const void* kernel = kernel_for<T, kHeadDim, kConsumers, kVariants>();
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes));
  // Persistent: one block per SM walks the work units (AttentionSchedule). Causal tiles
  // go in pairs of equal total work (within one key block for 192-row tiles): a static
  // stride over single causal tiles left some SMs with twice the work, and an order of all
  // heads' longest tiles first, dealt in rounds of alternating direction, was balanced but
  // lost the L2 sharing of K and V between the blocks running at once. The pairs beat one
  // block per tile on short causal sequences (the next tile's Q and first keys load during
  // this one) and lose a little on long ones (the last round's units leave SMs idle where
  // the hardware balanced single tiles).
  const int m_blocks = (p.seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const sm90::AttentionSchedule schedule = sm90::attention_schedule(m_blocks, Tile::kBlockM, p.heads_q, p.batch, p.causal);
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const int64_t sms = sm_count_of(device);
  const int grid = static_cast<int>(schedule.units < sms ? schedule.units : sms);
  sm90::attention_forward_sm90_kernel<T, kHeadDim, kConsumers, kVariants>
      <<<grid, Tile::kThreads, Tile::kSharedBytes, stream>>>(maps, kp, schedule);
}

// A compiled kernel, to ask whether the device runs this build's sm_90a code.
template <int kDim = first_sm90_head_dim()>
const void* any_kernel() {
  if constexpr (kDim == 0) return nullptr;
  else return kernel_for<__nv_bfloat16, kDim, 2, false>();
}

}  // namespace

bool attention_sm90_takes(const AttentionParams& p, DType dtype, int device, const char** why) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (dtype != DType::f16 && dtype != DType::bf16) return *why = "the dtype is not float16 or bfloat16", false;
  if (!attention_sm90_head_dim(p.head_dim))
    return *why = "this build's Hopper kernel does not take the head dim (llmk::attention_sm90_head_dims)", false;
  if (!attention_tma_ok(p.q, varlen) || !attention_tma_ok(p.k, varlen) || !attention_tma_ok(p.v, varlen))
    return *why = "q, k and v need 16-byte aligned data pointers and strides for TMA", false;
  if (reinterpret_cast<uintptr_t>(p.out.data) % 4 != 0 || p.out.row_stride % 2 != 0)
    return *why = "out needs 4-byte aligned rows", false;
  if (!sm90::sm90a_kernel_runs(any_kernel<>(), device)) return *why = "the device is not sm_90 or this build has no sm_90a code", false;
  return true;
}

// O through shared memory and TMA stores at head dims 96, 128 and 256 (the kernel's kTmaOut).
bool attention_sm90_tma_out(const AttentionParams& p) {
  return attention_sm90_stages_output(p.head_dim) && attention_tma_ok(p.out, p.cu_seqlens_q != nullptr);
}

// Causal calls at head dim 64 take 192-row tiles from 8192 query rows: below, they lose to
// 128-row tiles, computing key blocks wholly above a consumer's diagonal.
int attention_sm90_consumers(const AttentionParams& p) {
  // The score variants and the calls over a KV cache run on the 2-consumer tiles only (the
  // 3-consumer one has no register left for the window's mask: 100 bytes of spills with it;
  // the kernel's kVariants).
  return p.head_dim == 64 && (!p.causal || p.seqlen_q >= 8192) && !p.variants.any() && !p.cache_seqlens ? 3 : 2;
}

void attention_forward_sm90(const AttentionParams& p, DType dtype, cudaStream_t stream) {
  const char* op = "attention_forward_sm90_kernel";
  // Keys from a cache are read by the variant kernels of head dims 64-128 only (the others
  // would read the cache's pages as rows of a dense tensor); attention_over_cache_takes says so.
  LLMK_CHECK(p.cache_seqlens == nullptr || (p.head_dim <= 128 && p.cu_seqlens_q == nullptr),
             "attention over a cache: head dim ", p.head_dim, " (64-128 taken), dense batches only");
  auto with_type = [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    // The head dims LLMK_HEAD_DIMS builds (attention_sm90_takes turned the others away).
    for_compiled_head_dim("attention", p.head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if constexpr (attention_sm90_head_dim(D)) {
        if constexpr (D == 64)
          if (attention_sm90_consumers(p) == 3) return launch<T, D, 3, false>(p, dtype, stream);
        if (p.variants.any() || p.cache_seqlens) return launch<T, D, 2, true>(p, dtype, stream);
        launch<T, D, 2, false>(p, dtype, stream);
      }
    });
  };
  if (dtype == DType::bf16) with_type(DTypeTag<DType::bf16>{});
  else with_type(DTypeTag<DType::f16>{});
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
