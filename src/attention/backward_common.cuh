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
// element).
template <int kMT, int kNT, class Offset, class Masked>
__device__ __forceinline__ void probabilities(float (&s)[kMT][kNT][4], float scale_log2, int lane, Offset&& lse2_of,
                                              bool need_mask, Masked&& masked) {
  auto run = [&](auto with_mask) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mt * 16 + (i >> 1) * 8 + lane / 4, col = nt * 8 + 2 * (lane % 4) + (i & 1);
          const float p = ptx::exp2_approx(fmaf(s[mt][nt][i], scale_log2, -lse2_of(mt, nt, i)));
          s[mt][nt][i] = decltype(with_mask)::value && masked(row, col) ? 0.0f : p;
        }
  };
  if (need_mask) run(std::true_type{});
  else run(std::false_type{});
}

// The query tiles of `block_m` rows that see a key of the key block starting at n0:
// [begin, end), causal from the tile holding row n0 - shift (empty when none does).
struct QueryTiles {
  int begin, end;
  __device__ int count() const { return max(0, end - begin); }
};
__device__ __forceinline__ QueryTiles query_tiles_seeing(const SequenceBounds& seq, bool causal, int n0, int block_m) {
  const int shift = seq.seqlen_k - seq.seqlen_q;  // causal: row i sees key j <= i + shift
  return {causal ? max(0, n0 - shift) / block_m : 0, (seq.seqlen_q + block_m - 1) / block_m};
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

}  // namespace llmk::detail::bwd
