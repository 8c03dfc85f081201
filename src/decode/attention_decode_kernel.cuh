// Decode attention over a (paged) KV cache on the sm_80 instruction set (cp.async,
// ldmatrix, mma.sync; it runs unchanged on Hopper, where the work is memory-bound).
//
// One block = one (sequence b, kv head, split of the keys, block of packed query rows).
// The query rows of a kv head are its q_len tokens x `group` query heads, packed as row
// r = token * group + head-in-group into 16-row mma tiles, so every query head of the
// group (and every speculative token) shares one pass over the kv head's keys and values.
//
//   load Q [kRows, D] (cp.async; RoPE applied in shared memory when asked)
//   a kStages-deep cp.async ring of key blocks: kBlockN = 64 keys of K and V per stage,
//   each key's row found through the block table (any page size, any page order)
//   for each key block: warp w takes keys [16 w, 16 w + 16) of the stage
//     new tokens (append): read from k_new / v_new, rotated, rounded (quantized for fp8),
//       written to the stage and, by the row-block-0 block, into the cache
//     fp8 cache: the warp's 16 K and V rows are converted to q's dtype in registers, straight
//       into the mma fragments (head dims 64, 128, 256; see decode_scores_fp8), or in shared
//       memory (head dim 96, the 64-row tile at 64)
//     S = Q K^T (mma.sync), mask (causal, split end), online softmax, O += P V
//   the 4 warps' (max, sum, O) merged through shared memory; the block writes out and lse
//   directly (one split); or, split over a thread-block cluster (2-8 splits on sm_90), keeps
//   its partial O and lse in shared memory, and after a cluster barrier each block combines a
//   1/C share of the rows from every block's shared memory (no workspace, no second kernel);
//   or (more splits) writes its partial O and lse into the workspace, which
//   attention_decode_merge_kernel combines by lse.
//
// Roofline (H100 SXM, ~3.0 TB/s copy): the bytes are the cache's K and V for the visible
// keys, 2 * seqlen_k * D * bytes per (sequence, kv head); q, out and the partials are
// < 1% of them at q_len <= 16. FLOPs are 4 * rows * seqlen_k * D per kv head, at most
// ~2 FLOP/byte for rows <= 16 (the tensor cores idle). A block keeps (kStages - 1) stages
// (35-70 KB) in flight; two blocks per SM (one at D = 256) give the 30+ KB per SM that
// covering the DRAM latency at 23 GB/s per SM needs. An fp8 cache moves half the bytes
// through the same loop; converted in registers (fp16 mma) it streams 3.3 TB/s of fp8 bytes
// on the H200 at batch 16-64 against the bf16 cache's 4.0 (1.6x the bf16 cache's speed, not
// 2x: per key the warps do the same mma and softmax work on half the bytes, plus the
// conversion). The 16-row fp8 tiles at head dim 96 convert in shared memory and run three
// blocks per SM (a 2-stage ring): 12 warps a SM convert faster than 8. Splits are chosen on the host
// (attention_decode.cu) so that the blocks fill the SMs in about one wave.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/sm80/attention_tiles.cuh"
#include "decode/attention_decode_params.h"
#include "decode/decode_fragments.cuh"
#include "decode/decode_merge.cuh"
#include "decode/decode_tile.cuh"
#include "decode/decode_values.cuh"

namespace llmk::detail {

// grid (splits, heads_kv * row blocks, batch), Tile::kThreads threads, Tile::kSmemBytes of
// dynamic shared memory. The explicit minimum of one block per SM (Tile::kMinBlocks, but for
// the three-per-SM fp8 tiles) lets ptxas use up to 255 registers (two blocks of 128 threads
// still fit); without it ptxas settled at 128 for several variants and spilled 4-36 bytes.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks) attention_decode_kernel(const __grid_constant__ DecodeParams p) {
  if constexpr (!decode_tile_compiled_here<Tile>()) return;
  using Cache = typename Tile::Cache;
  constexpr int D = Tile::kHeadDim, kRows = Tile::kRows, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  unsigned char* ring = smem + Tile::kQBytes;
  T* convert = reinterpret_cast<T*>(ring + kStages * Tile::kStageBytes);
  __shared__ float s_max[Tile::kWarps][kRows], s_sum[Tile::kWarps][kRows];
  __shared__ float s_lse[kRows];  // cluster merge: this split's lse per row

  const int split = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y) % p.heads_kv;
  const int row_block = static_cast<int>(blockIdx.y) / p.heads_kv;
  const int b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;

  const int seqlen_k = decode_seqlen_k(p, b);
  const bool append = p.k_new.data != nullptr;
  const int first_new = append ? seqlen_k - p.q_len : seqlen_k;  // keys from here come from k_new
  // With a sliding window the splits share the keys from the first token's window on (the
  // keys before it are seen by no row).
  const int window_begin = Tile::kVariants && p.variants.window > 0 ? max(0, seqlen_k - p.q_len + 1 - p.variants.window) : 0;
  const int chunk = ceil_div_int(ceil_div_int(seqlen_k - window_begin, p.splits), kBlockN) * kBlockN;
  const int key_begin = min(window_begin + split * chunk, seqlen_k), key_end = min(key_begin + chunk, seqlen_k);
  const int n_blocks = ceil_div_int(key_end - key_begin, kBlockN);
  const int rows_total = p.q_len * p.group, row0 = row_block * kRows;
  const float k_scale = Tile::kFp8 ? p.k.scale[kv_head] : 1.0f;
  const float scale_log2 = p.scale_log2 * k_scale;

  // Q rows, zero past the packed rows.
  {
    constexpr int kChunks = D / 8;
    for (int c = tid; c < kRows * kChunks; c += Tile::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8, gr = row0 + r;
      const bool valid = gr < rows_total;
      const int token = valid ? gr / p.group : 0, head = kv_head * p.group + (valid ? gr % p.group : 0);
      const T* src = static_cast<const T*>(p.q.data) + b * p.q.batch_stride + token * p.q.row_stride +
                     head * p.q.head_stride + col;
      ptx::cp_async_16(ptx::smem_address(sQ + r * Tile::kPitch + col), src, valid);
    }
  }

  // Stage j of the ring: keys [key_begin + j kBlockN, + kBlockN) of K and V, zero rows
  // past the split's end and for the new tokens (written by the warps from k_new / v_new).
  const int load_end = min(key_end, first_new);
  // Each thread loads one 16-byte column piece of rows r0, r0 + kRowsPerPass, ...: its
  // column pointers are fixed, and in a contiguous cache the rows are pointer increments.
  constexpr int kRowsPerPass = prev_power_of_two(Tile::kThreads / Tile::kCacheChunks);
  static_assert(kBlockN % kRowsPerPass == 0);
  const bool loads = tid < kRowsPerPass * Tile::kCacheChunks;
  const int r0 = tid / Tile::kCacheChunks, col = (tid % Tile::kCacheChunks) * 16;
  const unsigned char* k_col = static_cast<const unsigned char*>(p.k.data) + kv_head * p.k.head_stride * sizeof(Cache) + col;
  const unsigned char* v_col = static_cast<const unsigned char*>(p.v.data) + kv_head * p.v.head_stride * sizeof(Cache) + col;
  const uint32_t dst0 = ptx::smem_address(ring + r0 * Tile::kStageRowBytes + col);
  auto issue = [&](int j) {
    if (!loads) return;
    const uint32_t dst = dst0 + (j % kStages) * Tile::kStageBytes;
    const int key0 = key_begin + j * kBlockN + r0;
    if (p.block_table == nullptr) {
      const unsigned char* k_src = k_col + (b * p.k.page_stride + key0 * p.k.row_stride) * sizeof(Cache);
      const unsigned char* v_src = v_col + (b * p.v.page_stride + key0 * p.v.row_stride) * sizeof(Cache);
      const int64_t k_step = kRowsPerPass * p.k.row_stride * sizeof(Cache);
      const int64_t v_step = kRowsPerPass * p.v.row_stride * sizeof(Cache);
#pragma unroll
      for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
        const bool valid = key0 + i * kRowsPerPass < load_end;
        const uint32_t row_dst = dst + i * kRowsPerPass * Tile::kStageRowBytes;
        ptx::cp_async_16(row_dst, valid ? k_src : k_col, valid);
        ptx::cp_async_16(row_dst + kBlockN * Tile::kStageRowBytes, valid ? v_src : v_col, valid);
        k_src += k_step;
        v_src += v_step;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
        const int key = key0 + i * kRowsPerPass;
        const bool valid = key < load_end;
        const DecodeCacheSlot slot = decode_cache_slot(p, b, valid ? key : 0);
        const uint32_t row_dst = dst + i * kRowsPerPass * Tile::kStageRowBytes;
        ptx::cp_async_16(row_dst, k_col + decode_cache_row(p.k, slot) * sizeof(Cache), valid);
        ptx::cp_async_16(row_dst + kBlockN * Tile::kStageRowBytes, v_col + decode_cache_row(p.v, slot) * sizeof(Cache),
                         valid);
      }
    }
  };

  // The key (exclusive) where masking starts for each of the thread's rows.
  int row_end[Tile::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int gr = row0 + mt * 16 + half * 8 + lane / 4;
      const int token = gr < rows_total ? gr / p.group : p.q_len - 1;
      row_end[mt][half] = min(key_end, decode_visible_keys(p, seqlen_k, token));
    }
  const int mask_from = p.causal ? min(key_end, seqlen_k - p.q_len + 1) : key_end;

  float o[Tile::kMTiles][Tile::kHeadDim / 8][4];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
  OnlineSoftmax<Tile::kMTiles> softmax;
  DecodeQFragments<Tile> qf;  // the fp8 register path's Q fragments (Tile::kQInRegisters)

  // One cp.async group for Q, then one per stage (empty ones too): waiting for all but
  // the newest kStages - 2 groups lands Q and stages 0..j.
  ptx::cp_async_commit();
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < n_blocks) issue(j);
    ptx::cp_async_commit();
  }
  for (int j = 0; j < n_blocks; ++j) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage j (and Q) landed; every warp is done with stage j - 1's slot
    if (j == 0 && p.rotary_cos_sin != nullptr) {  // rotate the Q rows in place, pair by pair
      const int pairs = p.rotary_dim / 2;
      for (int item = tid; item < kRows * pairs; item += Tile::kThreads) {
        const int r = item / pairs, pair = item % pairs, gr = row0 + r;
        if (gr >= rows_total) break;
        int i1, i2;
        rope_pair_index(p, pair, i1, i2);
        T* x = sQ + r * Tile::kPitch;
        const float2 y = rope_pair(p, to_float(x[i1]), to_float(x[i2]), pair, seqlen_k - p.q_len + gr / p.group);
        x[i1] = from_float<T>(y.x);
        x[i2] = from_float<T>(y.y);
      }
      __syncthreads();
    }
    if constexpr (Tile::kRegisterFp8 && !std::is_same_v<T, __half>) {
      if (j == 0) {  // after RoPE: the fp8 register path's fp16 Q
        decode_q_to_fp16<T, Tile>(sQ, tid);
        __syncthreads();
      }
    }
    if constexpr (Tile::kQInRegisters) {
      if (j == 0) {
        if constexpr (Tile::kFp8) decode_load_q_fragments_fp8<T, Tile>(qf, sQ, lane);
        else decode_load_q_fragments<T, Tile>(qf, sQ, lane);
      }
    }
    if (j + kStages - 1 < n_blocks) issue(j + kStages - 1);
    ptx::cp_async_commit();

    unsigned char* stage = ring + (j % kStages) * Tile::kStageBytes;
    const int warp_key0 = key_begin + j * kBlockN + warp * Tile::kWarpKeys;
    if (warp_key0 >= key_end) continue;  // past the split's end: nothing for this warp
    unsigned char* k_rows = stage + warp * Tile::kWarpKeys * Tile::kStageRowBytes;
    unsigned char* v_rows = k_rows + kBlockN * Tile::kStageRowBytes;

    // New tokens among this warp's keys: from k_new / v_new into the stage (and the cache).
    if (append && warp_key0 + Tile::kWarpKeys > first_new) {
      const int t_end = min(warp_key0 + Tile::kWarpKeys, key_end);
      for (int t = max(warp_key0, first_new); t < t_end; ++t) {
        const int token = t - first_new;
        const T* kn = static_cast<const T*>(p.k_new.data) + b * p.k_new.batch_stride + token * p.k_new.row_stride +
                      kv_head * p.k_new.head_stride;
        const T* vn = static_cast<const T*>(p.v_new.data) + b * p.v_new.batch_stride + token * p.v_new.row_stride +
                      kv_head * p.v_new.head_stride;
        const DecodeCacheSlot slot = decode_cache_slot(p, b, t);
        Cache* k_dst = static_cast<Cache*>(p.k.data) + decode_cache_row(p.k, slot) + kv_head * p.k.head_stride;
        Cache* v_dst = static_cast<Cache*>(p.v.data) + decode_cache_row(p.v, slot) + kv_head * p.v.head_stride;
        Cache* k_stage = reinterpret_cast<Cache*>(k_rows + (t - warp_key0) * Tile::kStageRowBytes);
        Cache* v_stage = reinterpret_cast<Cache*>(v_rows + (t - warp_key0) * Tile::kStageRowBytes);
        const float v_scale = Tile::kFp8 ? p.v.scale[kv_head] : 1.0f;
        auto put = [&](Cache* stage_row, Cache* cache_row, int e, Cache value) {
          stage_row[e] = value;
          if (row_block == 0) cache_row[e] = value;
        };
        const int rotated = p.rotary_cos_sin != nullptr ? p.rotary_dim : 0;
        for (int pair = lane; pair < rotated / 2; pair += 32) {
          int i1, i2;
          rope_pair_index(p, pair, i1, i2);
          const float2 y = rope_pair(p, to_float(kn[i1]), to_float(kn[i2]), pair, t);
          put(k_stage, k_dst, i1, to_cache<Cache, T>(y.x, k_scale));
          put(k_stage, k_dst, i2, to_cache<Cache, T>(y.y, k_scale));
        }
        for (int e = rotated + lane; e < D; e += 32) put(k_stage, k_dst, e, to_cache<Cache, T>(to_float(kn[e]), k_scale));
        for (int e = lane; e < D; e += 32) put(v_stage, v_dst, e, to_cache<Cache, T>(to_float(vn[e]), v_scale));
      }
      __syncwarp();
    }

    const T* sK = nullptr;
    const T* sV = nullptr;
    if constexpr (Tile::kRegisterFp8) {
      // converted in registers by decode_scores_fp8 / decode_accumulate_pv_fp8
    } else if constexpr (Tile::kFp8) {
      T* k_conv = convert + warp * 2 * Tile::kWarpKeys * Tile::kPitch;
      T* v_conv = k_conv + Tile::kWarpKeys * Tile::kPitch;
      constexpr int kChunks = Tile::kWarpKeys * D / 16;  // 16 fp8 values each
#pragma unroll
      for (int i = 0; i < kChunks / 32; ++i) {
        const int c = lane + 32 * i, r = c / (D / 16), col = (c % (D / 16)) * 16;
        uint4 k16[2], v16[2];
        fp8x16_to<T>(k16, *reinterpret_cast<const uint4*>(k_rows + r * Tile::kStageRowBytes + col));
        fp8x16_to<T>(v16, *reinterpret_cast<const uint4*>(v_rows + r * Tile::kStageRowBytes + col));
        *reinterpret_cast<uint4*>(k_conv + r * Tile::kPitch + col) = k16[0];
        *reinterpret_cast<uint4*>(k_conv + r * Tile::kPitch + col + 8) = k16[1];
        *reinterpret_cast<uint4*>(v_conv + r * Tile::kPitch + col) = v16[0];
        *reinterpret_cast<uint4*>(v_conv + r * Tile::kPitch + col + 8) = v16[1];
      }
      __syncwarp();
      sK = k_conv;
      sV = v_conv;
    } else {
      sK = reinterpret_cast<const T*>(k_rows);
      sV = reinterpret_cast<const T*>(v_rows);
    }

    float s[Tile::kMTiles][2][4];
    if constexpr (Tile::kRegisterFp8) decode_scores_fp8<T, Tile>(s, sQ, qf, k_rows, lane);
    else if constexpr (Tile::kQInRegisters) decode_scores_q_in_registers<T, Tile>(s, qf, sK, lane);
    else scores<T, typename Tile::WarpTile>(s, sQ, sK, 0, lane);
    // The softcap on the true scores scale * k_scale * s (raw s here).
    if (Tile::kVariants && p.variants.softcap > 0.0f)
      softcap_scores(s, p.variants.softcap / (p.scale * k_scale), p.scale * k_scale / p.variants.softcap);
    // (with a window, the keys below the last token's window start, seqlen_k - window, need
    // the left mask of some row; p.variants.window is read from the parameters, not held)
    if (warp_key0 + Tile::kWarpKeys > mask_from ||
        (Tile::kVariants && p.variants.window > 0 && warp_key0 < seqlen_k - p.variants.window)) {
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // The row's window start, recomputed here (rare) rather than held in registers.
          int row_begin = 0;
          if (Tile::kVariants && p.variants.window > 0) {
            const int gr = row0 + mt * 16 + half * 8 + lane / 4;
            row_begin = decode_first_key(p, seqlen_k, gr < rows_total ? gr / p.group : p.q_len - 1);
          }
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int key = warp_key0 + nt * 8 + 2 * (lane % 4) + c;
              if (key >= row_end[mt][half] || key < row_begin) s[mt][nt][2 * half + c] = -INFINITY;
            }
        }
    }
    softmax.update(s, o, scale_log2);
    if constexpr (Tile::kRegisterFp8) decode_accumulate_pv_fp8<T, Tile>(o, s, v_rows, lane);
    else accumulate_pv<T, typename Tile::WarpTile>(o, s, sV, lane);
  }

  // Merge the warps' partial rows: each warp's max, sum and unnormalized O through shared
  // memory (over the ring, now idle), then one pass over the rows.
  ptx::launch_dependents();  // the merge kernel may start launching
  ptx::cp_async_wait<0>();
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + half * 8 + lane / 4;
      float sum = softmax.row_sum[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (lane % 4 == 0) {
        s_max[warp][r] = softmax.row_max[mt][half];
        s_sum[warp][r] = sum;
      }
      if constexpr (Tile::kRegisterFp8) {  // O's columns in decode_fp8_o_column's order
        float* row = s_o + (warp * kRows + r) * Tile::kMergePitch;
        const int n = 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          row[decode_fp8_o_column<D>(dt, n)] = o[mt][dt][2 * half];
          row[decode_fp8_o_column<D>(dt, n + 1)] = o[mt][dt][2 * half + 1];
        }
      } else {
        float* dst = s_o + (warp * kRows + r) * Tile::kMergePitch + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[mt][dt][2 * half], o[mt][dt][2 * half + 1]);
      }
    }
  __syncthreads();

  const float v_scale = Tile::kFp8 ? p.v.scale[kv_head] : 1.0f;
  for (int item = tid; item < kRows * D / 4; item += Tile::kThreads) {
    const int r = item / (D / 4), c = (item % (D / 4)) * 4, gr = row0 + r;
    if (gr >= rows_total) break;  // items run row-major: every later item is past the rows too
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) m = fmaxf(m, s_max[w][r]);
    float l = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) {
      if (s_max[w][r] == -INFINITY) continue;  // no key of this warp reached the row
      const float weight = ptx::exp2_approx((s_max[w][r] - m) * scale_log2);
      l += s_sum[w][r] * weight;
      const float4 ow = *reinterpret_cast<const float4*>(s_o + (w * kRows + r) * Tile::kMergePitch + c);
      acc.x += weight * ow.x;
      acc.y += weight * ow.y;
      acc.z += weight * ow.z;
      acc.w += weight * ow.w;
    }
    const int token = gr / p.group, head = kv_head * p.group + gr % p.group;
    float inv = l > 0.0f ? v_scale / l : 0.0f;
    float lse = l > 0.0f ? (m * scale_log2 + log2f(l)) * 0.6931471805599453f : -INFINITY;
    if (Tile::kVariants && p.variants.sinks != nullptr && p.splits == 1) {  // the sink joins the denominator once (else at the merge)
      const float sink = p.variants.sinks[head] * 1.4426950408889634f, m2 = l > 0.0f ? m * scale_log2 : -INFINITY;
      const float top = fmaxf(m2, sink), keep = l > 0.0f ? ptx::exp2_approx(m2 - top) : 0.0f;
      const float total = l * keep + ptx::exp2_approx(sink - top);
      inv = v_scale * keep / total;
      lse = (top + log2f(total)) * 0.6931471805599453f;
    }
    if (p.splits == 1) {
      T* dst = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride +
               head * p.out.head_stride + c;
      *reinterpret_cast<uint2*>(dst) = make_uint2(ptx::pack2<T>(acc.x * inv, acc.y * inv),
                                                  ptx::pack2<T>(acc.z * inv, acc.w * inv));
      if (c == 0 && p.lse) p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = lse;
    } else if (p.cluster_merge) {  // into warp 0's rows (this thread alone read these 4 floats)
      *reinterpret_cast<float4*>(s_o + r * Tile::kMergePitch + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) s_lse[r] = lse;
    } else {
      const int64_t row = ((static_cast<int64_t>(split) * p.batch + b) * p.q_len + token) * p.heads_q + head;
      *reinterpret_cast<float4*>(p.partial_out + row * D + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) p.partial_lse[row] = lse;
    }
  }
  if (p.cluster_merge) decode_cluster_merge<T, Tile>(p, s_o, s_lse, b, kv_head, row0, rows_total);
}

}  // namespace llmk::detail
