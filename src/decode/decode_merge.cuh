// The merge of a decode call's split-KV pieces: inside a thread-block cluster through
// distributed shared memory (decode_cluster_merge, called by the main kernel's blocks on
// sm_90), or by attention_decode_merge_kernel over the workspace's partial rows.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "decode/attention_decode_params.h"

namespace llmk::detail {

// The combine of a cluster's splits (sm_90; the launcher asks for it only there): the
// cluster is the gridDim.x = p.splits blocks of one (sequence, kv head, row block), each
// holding its normalized partial rows (pitch kMergePitch floats) and their lse in shared
// memory. After a cluster barrier, block `split` takes a 1/C share of the (row, 4 columns)
// items and reads every block's piece through distributed shared memory: out = sum_s
// exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s) (a split that saw no key has lse -inf
// and weighs nothing), in a fixed order. A second barrier keeps each block's shared memory
// alive until its peers have read it.
template <class T, class Tile>
__device__ __forceinline__ void decode_cluster_merge(const DecodeParams& p, const float* s_o, const float* s_lse, int b,
                                                     int kv_head, int row0, int rows_total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int D = Tile::kHeadDim;
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait();
  const int splits = p.splits, split = static_cast<int>(blockIdx.x);
  const int rows = min(Tile::kRows, rows_total - row0);
  for (int item = split * Tile::kThreads + static_cast<int>(threadIdx.x); item < rows * (D / 4);
       item += splits * Tile::kThreads) {
    const int r = item / (D / 4), c = (item % (D / 4)) * 4;
    const int gr = row0 + r, token = gr / p.group, head = kv_head * p.group + gr % p.group;
    // An attention sink joins the merged denominator once (natural log units, as the lse).
    const float sink = Tile::kVariants && p.variants.sinks ? p.variants.sinks[head] : -INFINITY;
    float m = sink;
    for (int s = 0; s < splits; ++s)
      m = fmaxf(m, static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_lse), s))[r]);
    float sum = sink == -INFINITY ? 0.0f : ptx::exp2_approx((sink - m) * 1.4426950408889634f);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float ls = static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_lse), s))[r];
      if (ls == -INFINITY) continue;
      const float weight = ptx::exp2_approx((ls - m) * 1.4426950408889634f);
      const float4 o = *reinterpret_cast<const float4*>(
          static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_o), s)) + r * Tile::kMergePitch + c);
      sum += weight;
      acc.x += weight * o.x;
      acc.y += weight * o.y;
      acc.z += weight * o.z;
      acc.w += weight * o.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* dst = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride +
             head * p.out.head_stride + c;
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(ptx::pack2<T>(acc.x * inv, acc.y * inv), ptx::pack2<T>(acc.z * inv, acc.w * inv));
    if (c == 0 && p.lse)
      p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = sum > 0.0f ? m + logf(sum) : -INFINITY;
  }
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);  // this block's reads of its peers are done
  cuda::ptx::barrier_cluster_wait();
#else
  (void)p, (void)s_o, (void)s_lse, (void)b, (void)kv_head, (void)row0, (void)rows_total;
#endif
}

// Merges the splits' partial rows: out = sum_s exp(lse_s - lse) O_s with lse the
// log-sum-exp of the lse_s (splits that saw no key have lse -inf, O 0, and weigh nothing).
// One warp per (sequence, token, query head) row: the lanes read the splits' lse values
// together (split s in lane s % 32), then every split's O row is read with independent
// loads (unrolled, so several are in flight: the loop is latency-bound otherwise), each
// lane D / 32 columns. grid ceil(rows / 4), 128 threads; splits <= 32 * kMaxSplitWords.
// Launched as a programmatic dependent of the main kernel, so its launch overlaps that
// kernel's tail.
constexpr int kMaxSplitWords = 4;

template <class T, int kHeadDim, bool kVariants>
__global__ void __launch_bounds__(128) attention_decode_merge_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kCols = kHeadDim / 32, kBatch = 8;
  __shared__ float s_weight[4][32 * kMaxSplitWords];
  ptx::wait_for_prior_grid();  // launched early (programmatic dependent launch)
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len * p.heads_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;
  float lse[kMaxSplitWords];
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kMaxSplitWords; ++w) {
    const int s = lane + 32 * w;
    lse[w] = s < p.splits ? p.partial_lse[s * rows + row] : -INFINITY;
    m = fmaxf(m, lse[w]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  // An attention sink joins the merged denominator once (natural log units, as the lse).
  const float sink = kVariants && p.variants.sinks ? p.variants.sinks[row % p.heads_q] : -INFINITY;
  if (kVariants) m = fmaxf(m, sink);
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kMaxSplitWords; ++w) {
    const float weight = lse[w] == -INFINITY ? 0.0f : ptx::exp2_approx((lse[w] - m) * 1.4426950408889634f);
    s_weight[warp][lane + 32 * w] = weight;
    sum += weight;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (kVariants && sink != -INFINITY) sum += ptx::exp2_approx((sink - m) * 1.4426950408889634f);
  __syncwarp();
  float acc[kCols] = {};
  const float* o = p.partial_out + row * kHeadDim + lane;
  const int64_t split_stride = rows * kHeadDim;
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
    float v[kBatch][kCols];  // kBatch splits' loads issued before any is used
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c) v[i][c] = s0 + i < p.splits ? o[(s0 + i) * split_stride + 32 * c] : 0.0f;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const float weight = s0 + i < p.splits ? s_weight[warp][s0 + i] : 0.0f;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] += weight * v[i][c];
    }
  }
  const int head = static_cast<int>(row % p.heads_q);
  const int token = static_cast<int>((row / p.heads_q) % p.q_len);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.heads_q) * p.q_len));
  T* out = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride + head * p.out.head_stride;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) out[lane + 32 * c] = from_float<T>(acc[c] * inv);
  if (lane == 0 && p.lse)
    p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = sum > 0.0f ? m + logf(sum) : -INFINITY;
}

}  // namespace llmk::detail
