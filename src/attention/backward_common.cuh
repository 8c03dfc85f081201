// What the attention backward's sm_80 and Hopper kernels share (sm80/backward_kernel.cuh,
// sm90/backward_kernel.cuh, sm90/backward_hd256_kernel.cuh, sm90/backward_walk.cuh): the
// forward's lse as an exp2 offset, the probabilities and score gradients of a tile of
// accumulators in registers, and the query tiles that see a key block.
#pragma once

#include <cmath>
#include <type_traits>

#include "attention/attention_params.h"
#include "common/ptx.cuh"

namespace llmk::detail::bwd {

// The forward's lse as the exponent offset of exp2: lse * log2(e), with -inf (a row that
// sees no key) read as +inf so that every probability of the row is exp2(-inf) = 0.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

// The probabilities of one tile of scores in place: s = exp2(s * scale_log2 - lse2[col]) (the
// accumulators of S^T, rows = keys, or of S, rows = queries), 0 where `masked(row, col)`
// (row, col: the element's indices in the warp's tile); lse2_of(mt, nt, i) gives the row's
// exponent offset. need_mask false skips the mask: the loop is compiled twice so that such a
// tile runs no mask arithmetic (one copy computed the mask on every tile and selected per
// element). cap_raw > 0: the logit softcap on the raw scores first, s -> cap_raw tanh(s *
// inv_cap_raw) (cap_raw = softcap / scale; the plain kernels pass nothing: no instruction).
template <int kMT, int kNT, class Offset, class Masked>
__device__ __forceinline__ void probabilities(float (&s)[kMT][kNT][4], float scale_log2, int lane, Offset&& lse2_of,
                                              bool need_mask, Masked&& masked, float cap_raw = 0.0f,
                                              float inv_cap_raw = 0.0f) {
  auto run = [&](auto with_mask) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mt * 16 + (i >> 1) * 8 + lane / 4, col = nt * 8 + 2 * (lane % 4) + (i & 1);
          const float x = cap_raw > 0.0f ? cap_raw * ptx::tanh_approx(s[mt][nt][i] * inv_cap_raw) : s[mt][nt][i];
          const float p = ptx::exp2_approx(fmaf(x, scale_log2, -lse2_of(mt, nt, i)));
          s[mt][nt][i] = decltype(with_mask)::value && masked(row, col) ? 0.0f : p;
        }
  };
  if (need_mask) run(std::true_type{});
  else run(std::false_type{});
}

// The query tiles of `block_m` rows that see a key of the key block [n0, n0 + block_n):
// [begin, end), causal from the tile holding row n0 - shift (empty when none does); with a
// sliding window (window > 0, causal) up to the tile holding the last row whose window still
// reaches the block's last key, row n0 + block_n - 2 + window - shift (row i sees key j >
// i + shift - window).
struct QueryTiles {
  int begin, end;
  __device__ int count() const { return max(0, end - begin); }
};
__device__ __forceinline__ QueryTiles query_tiles_seeing(const SequenceBounds& seq, bool causal, int n0, int block_m,
                                                         int window = 0, int block_n = 0) {
  const int shift = seq.seqlen_k - seq.seqlen_q;  // causal: row i sees key j <= i + shift
  const int begin = causal ? max(0, n0 - shift) / block_m : 0, tiles = (seq.seqlen_q + block_m - 1) / block_m;
  if (window <= 0) return {begin, tiles};
  const int64_t last_row = int64_t{n0} + block_n - 2 + window - shift;
  return {begin, last_row < 0 ? begin : static_cast<int>(min(int64_t{tiles}, last_row / block_m + 1))};
}

// dS = P * (dP - D), in place of dP.
template <int kMT, int kNT, class Delta>
__device__ __forceinline__ void score_gradients(float (&dp)[kMT][kNT][4], const float (&p)[kMT][kNT][4],
                                                Delta&& delta_of) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dp[mt][nt][i] = p[mt][nt][i] * (dp[mt][nt][i] - delta_of(mt, nt, i));
}

// The softcap's chain rule on dS = P (dP - D), in place of dS: d(softcap tanh(x / softcap))/dx =
// 1 - t^2, t = tanh(x / softcap), which the probability itself gives back: log2 P = softcap
// log2(e) t - lse2, so t = (log2 P + lse2) / softcap_log2 (softcap_log2 = softcap log2(e); the
// error of lg2.approx is far below the 16-bit rounding of dS). P = 0 (masked, or under exp2's
// range) leaves dS 0.
template <int kMT, int kNT, class Offset>
__device__ __forceinline__ void softcap_gradients(float (&ds)[kMT][kNT][4], const float (&p)[kMT][kNT][4],
                                                  Offset&& lse2_of, float softcap_log2) {
  const float inv = 1.0f / softcap_log2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pv = p[mt][nt][i];
        const float t = (ptx::log2_approx(pv) + lse2_of(mt, nt, i)) * inv;
        ds[mt][nt][i] = pv > 0.0f ? ds[mt][nt][i] * (1.0f - t * t) : 0.0f;
      }
}

}  // namespace llmk::detail::bwd
