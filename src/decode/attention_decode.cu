// Launcher of the decode attention: the split-KV choice, the tile of each head dim, and the
// dispatch over q's dtype (fp16, bf16), the cache's (q's or fp8 e4m3), the head dim (64, 96,
// 128, 256) and the query rows per block (16, or the widest tile whose O accumulators fit
// in 128 registers per thread: 64 rows at D = 64, 32 at D = 96 / 128, 16 at D = 256), and
// the 16-row tiles again with the score variants (window, softcap, sinks) compiled in, which
// every call with a variant takes.
// Causal, paging, append, RoPE and GQA are run-time parameters of each kernel.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/dispatch.h"
#include "common/env_path.h"
#include "common/head_dims.h"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "decode/attention_decode_kernel.cuh"

namespace llmk::detail {

namespace {

// Shared memory per block: two blocks per SM up to D = 128, one at D = 256; three for the
// 16-row tiles of an fp8 cache at head dim 96, which convert the stage in shared memory and
// want the warps (12 a SM instead of 8). The fp8 register path (head dims 64 and 128) takes
// the two-per-SM budget: H200, bf16 q, 1 x 8192 1.18x, 1 x 32768 1.07x, 64 x 4096 1.03x,
// 16 x 8192 0.98x of three. (At head dim 64 its 4-stage ring needs only 43 KB and ~150
// registers, so an SM holds three of those blocks where the split choice counts two.)
constexpr int kOnePerSm = 220 * 1024, kTwoPerSm = 110 * 1024, kThreePerSm = 75 * 1024;
constexpr int kMaxSplits = 32 * kMaxSplitWords;  // what the merge kernel takes
constexpr int kMinKeysPerSplit = 128;  // two stages: shorter pieces cost more in the merge than they save
constexpr int kBlockCostKeys = 256;   // a block's fixed cost (ring fill, merge), in keys streamed

constexpr int wide_mtiles(int head_dim) { return head_dim == 64 ? 4 : (head_dim == 256 ? 1 : 2); }
// Calls with a score variant (window, softcap, sinks) take the 16-row tiles, the only ones
// with the variants compiled in (DecodeTile::kVariants).
int mtiles_for(int rows, int head_dim, bool variants) { return rows <= 16 || variants ? 1 : wide_mtiles(head_dim); }
constexpr int blocks_per_sm(int head_dim, bool fp8, int mtiles) {
  return head_dim == 256 ? 1 : (fp8 && mtiles == 1 && !decode_fp8_in_registers(head_dim, mtiles) ? 3 : 2);
}
// The share of its SM's stream one block takes alone (the split choice fills as many
// blocks a SM as that asks): all of it for a 16-row tile over a contiguous cache like q's
// (its ring alone keeps the SM's loads in flight), most of it for the fp8 register path
// (its conversion sits between the loads), an even share of the resident blocks for a
// paged cache (a page table's lookups between the loads) and the other tiles. H200, GQA
// 32/8, head dim 128, cache out of L2, contiguous bf16: 1 x 8192 16 splits 15.2 us (1 block
// a SM) against 33 splits 17.4 (2 a SM), 1 x 32768 40.1 against 42.3, 4 x 8192 4 splits 46.4
// against 8 splits 54.0; fp8: 1 x 8192 15.0 against 17.1, but 1 x 32768 33.2 against 30.8,
// 1 x 131072 104.0 against 82.3, 16 x 8192 1 split 101.3 against 2 splits 78.4 (a share
// between 0.77 and 0.92 fits all four); paged bf16 (page 16, shuffled): 16 x 8192 1 split
// 197.6 against 2 splits ~141, 1 x 32768 16 splits 53.7 against 33 splits ~45.
constexpr double one_block_share(int head_dim, bool fp8, bool paged, int mtiles) {
  if (!paged && mtiles == 1 && !fp8) return 1.0;
  if (!paged && mtiles == 1 && decode_fp8_in_registers(head_dim, mtiles)) return 0.85;
  return 1.0 / blocks_per_sm(head_dim, fp8, mtiles);
}
constexpr int smem_budget(int blocks) { return blocks == 1 ? kOnePerSm : (blocks == 2 ? kTwoPerSm : kThreePerSm); }

template <class T, class Cache, int kHeadDim, int kMTiles, bool kVariants = false>
using TileFor = DecodeTile<T, Cache, kHeadDim, kMTiles,
                           smem_budget(blocks_per_sm(kHeadDim, std::is_same_v<Cache, Fp8E4M3>, kMTiles)), kVariants>;

// Whether `splits` blocks of `kernel` can run as one cluster on the current device: its code
// for the device is sm_90 (the merge is compiled in) and the device can co-schedule them
// (occupancy.h's remembered query).
bool cluster_merge_fits(const void* kernel, int device, int ptx_version, int threads, int smem, int splits) {
  return ptx_version >= 90 && resident_clusters(kernel, threads, static_cast<size_t>(smem), splits, device) > 0;
}

template <class T, class Tile>
void launch(const DecodeParams& params, int row_blocks, cudaStream_t stream) {
  const void* kernel = reinterpret_cast<const void*>(&attention_decode_kernel<T, Tile>);
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const KernelLimits limits = kernel_limits(kernel, device);
  const int most = limits.ptx_version < 90 && limits.max_dynamic_smem > kSm80MaxSmemPerBlock ? kSm80MaxSmemPerBlock
                                                                                               : limits.max_dynamic_smem;
  LLMK_CHECK(Tile::kSmemBytes <= most, "attention_decode: head_dim ", Tile::kHeadDim, " needs ", Tile::kSmemBytes / 1024,
             " KB of shared memory per block; this GPU, with this build's code for it (compute_", limits.ptx_version,
             "), gives ", most / 1024, " KB");
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));

  // The merge of the splits: in a cluster where it fits (2-8 splits, sm_90), else by the
  // merge kernel over the workspace, else (no workspace) one split. The three-per-SM tiles
  // (fp8 converted in shared memory, 16 rows: head dim 96) merge in a cluster only when the
  // grid has at most one block per SM: clusters of their blocks filled the SMs worse (H200,
  // fp8 16 x 8192: 109.7 -> 162.2 us, 64 x 4096: 218 -> 261), where the two-per-SM tiles
  // gained (bf16 16 x 8192 136.1 -> 132.4, 1 x 1024 8.1 -> 7.5).
  // LLMK_DECODE_MERGE=kernel: the merge kernel wherever a workspace is given; =cluster: every
  // split call merges in a cluster, more than 8 pieces capped at 8 (an error where no cluster
  // fits).
  DecodeParams p = params;
  const int merge = env_path("attention_decode", "LLMK_DECODE_MERGE", {"auto", "kernel", "cluster"});
  if (merge == 2 && p.splits > kDecodeClusterMaxSplits) p.splits = kDecodeClusterMaxSplits;
  const int64_t blocks = int64_t{p.splits} * p.heads_kv * row_blocks * p.batch;
  const bool packs_well = Tile::kMinBlocks != 3 || blocks <= sm_count_of(device) || merge == 2;
  const bool in_cluster = p.splits > 1 && p.splits <= kDecodeClusterMaxSplits && !(merge == 1 && p.partial_out) &&
                          packs_well &&
                          cluster_merge_fits(kernel, device, limits.ptx_version, Tile::kThreads, Tile::kSmemBytes, p.splits);
  LLMK_CHECK(merge != 2 || p.splits == 1 || in_cluster, "attention_decode: LLMK_DECODE_MERGE=cluster, but ", p.splits,
             " splits cannot merge in a cluster on this GPU and build");
  p.cluster_merge = in_cluster;
  if (!in_cluster && p.partial_out == nullptr) p.splits = 1;

  const dim3 grid(p.splits, p.heads_kv * row_blocks, p.batch);
  if (in_cluster) {
    void* args[] = {&p};
    return launch_cluster(kernel, grid, dim3(Tile::kThreads), Tile::kSmemBytes, stream, args,
                          static_cast<unsigned>(p.splits));
  }
  attention_decode_kernel<T, Tile><<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  if (p.splits > 1) {
    const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len * p.heads_q;
    launch_pdl(attention_decode_merge_kernel<T, Tile::kHeadDim, Tile::kVariants>,
               dim3(static_cast<unsigned>((rows + 3) / 4)), dim3(128), 0, stream, p);
  }
}

template <class Cache>
struct CacheTag {
  using type = Cache;
};

}  // namespace

int decode_splits_for(int batch, int heads_kv, int q_len, int group, int head_dim, bool fp8_cache, bool paged,
                      bool variants, int capacity, int device) {
  const int rows = q_len * group, mtiles = mtiles_for(rows, head_dim, variants), row_rows = 16 * mtiles;
  const int64_t pairs = static_cast<int64_t>(batch) * heads_kv * ((rows + row_rows - 1) / row_rows);
  const int64_t sms = sm_count_of(device);
  const int resident = blocks_per_sm(head_dim, fp8_cache, mtiles);
  const double share = one_block_share(head_dim, fp8_cache, paged, mtiles);
  const int most = capacity / kMinKeysPerSplit < kMaxSplits ? capacity / kMinKeysPerSplit : kMaxSplits;
  // Time ~ the busiest SM's blocks x (keys per piece + a block's fixed cost in keys: the
  // ring's fill and the merge of its partial rows) / the rate its resident blocks stream at;
  // ties go to fewer pieces.
  auto cost = [&](int s) {
    const int64_t per_sm = (pairs * s + sms - 1) / sms;
    const double rate = std::min(1.0, static_cast<double>(std::min<int64_t>(per_sm, resident)) * share);
    return static_cast<double>(per_sm) * (static_cast<double>(capacity) / s + kBlockCostKeys) / rate;
  };
  int best = 1;
  for (int s = 2; s <= most; ++s)
    if (cost(s) < cost(best) * (1 - 1e-9)) best = s;
  return best;
}

void attention_decode_cuda(const DecodeParams& p, DType dtype, DType cache_dtype, cudaStream_t stream) {
  const char* op = "attention_decode_kernel";
  LLMK_CHECK(dtype == DType::f16 || dtype == DType::bf16, "attention_decode: dtype ", dtype_name(dtype),
             " is not float16 or bfloat16");
  LLMK_CHECK(cache_dtype == dtype || cache_dtype == DType::f8e4m3, "attention_decode: cache dtype ",
             dtype_name(cache_dtype), " is neither q's nor float8_e4m3fn");
  const int rows = p.q_len * p.group;
  const bool variants = p.variants.any();
  const int mtiles = mtiles_for(rows, p.head_dim, variants);
  const int row_blocks = (rows + 16 * mtiles - 1) / (16 * mtiles);
  LLMK_CHECK(p.splits >= 1 && p.splits <= kMaxSplits, "attention_decode: ", p.splits, " splits, at most ", kMaxSplits);
  LLMK_CHECK(static_cast<int64_t>(p.heads_kv) * row_blocks <= 65535 && p.batch <= 65535 && p.splits <= 65535,
             "attention_decode: heads_kv x ", row_blocks, " query row blocks or batch ", p.batch,
             " exceeds the grid (65535)");
  dispatch_dtype(dtype, op, [&](auto tag) {
    if constexpr (decltype(tag)::value != DType::f32) {
      using T = device_type_t<decltype(tag)>;
      auto with_cache = [&](auto cache) {
        using Cache = typename std::decay_t<decltype(cache)>::type;
        for_compiled_head_dim("attention_decode", p.head_dim, [&](auto dim) {
          constexpr int D = decltype(dim)::value;
          constexpr int kWide = wide_mtiles(D);
          if constexpr (!head_dim_from_64(D)) {
            throw_error("attention_decode: head_dim ", D, " is not supported (",
                        head_dim_words(head_dims_where(head_dim_from_64)), ")");
          } else {
            if (variants) return launch<T, TileFor<T, Cache, D, 1, true>>(p, row_blocks, stream);
            if (mtiles == 1) return launch<T, TileFor<T, Cache, D, 1>>(p, row_blocks, stream);
            if constexpr (kWide > 1) return launch<T, TileFor<T, Cache, D, kWide>>(p, row_blocks, stream);
          }
        });
      };
      if (cache_dtype == DType::f8e4m3) with_cache(CacheTag<Fp8E4M3>{});
      else with_cache(CacheTag<T>{});
    }
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
