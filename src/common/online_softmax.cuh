// The register-level pieces of attention that do not depend on how the scores were
// computed (the sm_80 mma.sync mainloops and the Hopper wgmma one): the causal and
// sequence-end mask, the online softmax, and the final normalization with the
// log-sum-exp. Shared by attention's sm_80 and Hopper forwards (attention/sm80/,
// attention/sm90/) and decode (decode/).
//
// Scores live in mma accumulator fragments: a warp owns kMTiles tiles of 16 rows, each
// thread two rows of each (group and group + 8, group = lane / 4) and, for every 8-column
// n-tile, two adjacent columns (2 * (lane % 4) + {0, 1}). A row is spread over the 4
// threads of a quad, so row reductions are two xor-shuffles.
#pragma once

#include <cmath>

#include "common/ptx.cuh"

namespace llmk::detail {

// 2^x for x <= 0 on the FMA and integer pipes instead of the special-function unit (whose 16
// results per clock per SM bound the softmax where the tensor work per score is small):
// x = j + f with j = round(x) (the 1.5 * 2^23 shifter leaves j in t's low mantissa bits) and
// f in [-0.5, 0.5]; 2^f by a degree-3 polynomial fitted for relative error (at most 1.4e-4,
// below a 16-bit P's rounding); j added to the result's exponent field. x < -127.5, -inf
// included, gives +0 (the sum's exponent field goes negative and is clamped), as
// ex2.approx.ftz does; 10 instructions.
__device__ __forceinline__ float exp2_fma(float x) {
  constexpr float kShifter = 12582912.0f;
  x = fmaxf(x, -128.0f);
  const float t = x + kShifter;
  const float f = x - (t - kShifter);
  const float p = fmaf(fmaf(fmaf(0.055171434f, f, 0.24261081f), f, 0.69326097f), f, 0.99992812f);
  const int bits = __float_as_int(p) + (__float_as_int(t) << 23);
  return __int_as_float(bits > 0 ? bits : 0);
}

// -inf for every score past the sequence end or above the causal diagonal (key col >
// row + causal_shift), and with a sliding window (window > 0, causal) left of it (key col <=
// row + causal_shift - window). Rows and columns count from the key block's first column:
// row0 is the thread's first row (tile 0, group) minus that column, col0 its first column
// (n-tile 0: 2 * (lane % 4)), seqlen_k the keys left from that column on. (window <=
// INT_MAX / 2, as the API clamps it, keeps row + 1 + causal_shift - window in int.)
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                            int seqlen_k, bool causal, int causal_shift, int window = 0) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + half * 8;
      int end = causal ? row + 1 + causal_shift : seqlen_k;
      end = end < seqlen_k ? end : seqlen_k;
      const int begin = window > 0 ? row + 1 + causal_shift - window : 0;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = col0 + nt * 8 + c;
          if (col >= end || (window > 0 && col < begin)) s[mt][nt][2 * half + c] = -INFINITY;
        }
      }
    }
  }
}

// The logit softcap on raw scores (before the softmax's scale): s -> cap_raw tanh(s /
// cap_raw) with cap_raw = softcap / scale, i.e. scale * s -> softcap tanh(scale * s /
// softcap); `inv_cap_raw` = scale / softcap.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void softcap_scores(float (&s)[kMTiles][kNTiles][4], float cap_raw, float inv_cap_raw) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = cap_raw * ptx::tanh_approx(s[mt][nt][e] * inv_cap_raw);
}

// Running max and (per-thread partial) sum of each of the thread's rows, over the key
// blocks seen so far; the output accumulators are rescaled whenever the max grows.
template <int kMTiles>
struct OnlineSoftmax {
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      row_max[mt][0] = row_max[mt][1] = -INFINITY;
      row_sum[mt][0] = row_sum[mt][1] = 0.0f;
    }
  }

  // Turns the scores of one key block into unnormalized probabilities
  // p = exp2(s * scale_log2 - max * scale_log2) and sets `correction` to each row's factor
  // exp(old max - new max) for the output accumulated so far. Returns whether any row of
  // the warp changed its max: once the running maxima settle (most key blocks of a long
  // row) the rescale of O (kDTiles * 4 multiplies per row pair) can be skipped. With
  // kFmaEvery > 0 every kFmaEvery-th n-tile's exponentials run on the FMA pipe (exp2_fma).
  template <int kFmaEvery = 0, int kNTiles>
  __device__ __forceinline__ bool update_scores(float (&s)[kMTiles][kNTiles][4], float (&correction)[kMTiles][2],
                                                float scale_log2) {
    bool max_changed = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float m = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          m = fmaxf(m, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // A row with every key masked so far keeps max -inf; subtract 0 instead so that
        // its probabilities are exp2(-inf) = 0, not NaN.
        const float m_scaled = m == -INFINITY ? 0.0f : m * scale_log2;
        correction[mt][half] = ptx::exp2_approx(row_max[mt][half] * scale_log2 - m_scaled);
        max_changed = max_changed || m != row_max[mt][half];
        row_max[mt][half] = m;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float x = fmaf(s[mt][nt][2 * half + c], scale_log2, -m_scaled);
            const bool on_fma = kFmaEvery > 0 && nt % (kFmaEvery > 0 ? kFmaEvery : 1) == kFmaEvery - 1;
            const float p = on_fma ? exp2_fma(x) : ptx::exp2_approx(x);
            s[mt][nt][2 * half + c] = p;
            sum += p;
          }
        }
        row_sum[mt][half] = row_sum[mt][half] * correction[mt][half] + sum;
      }
    }
    return __any_sync(0xffffffffu, max_changed);
  }

  template <int kDTiles>
  __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4],
                                                 const float (&correction)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[mt][dt][0] *= correction[mt][0];
        o[mt][dt][1] *= correction[mt][0];
        o[mt][dt][2] *= correction[mt][1];
        o[mt][dt][3] *= correction[mt][1];
      }
    }
  }

  // update_scores, then the rescale of o where a max changed.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float (&o)[kMTiles][kDTiles][4],
                                         float scale_log2) {
    float correction[kMTiles][2];
    if (update_scores(s, correction, scale_log2)) rescale(o, correction);
  }

  // After the last key block: the factor that normalizes each row (0 for a row that saw
  // no key, whose output is then 0) and its natural-log log-sum-exp (-inf for such a row).
  // An attention sink (sink_log2 = its logit * log2(e); -inf: none) joins the denominator:
  // with top = max(max * scale_log2, sink_log2), the row's sum becomes sum 2^(max *
  // scale_log2 - top) + 2^(sink_log2 - top) (no overflow whichever is larger), O (relative
  // to the max) is scaled by 2^(max * scale_log2 - top) / that, and a row without keys gets
  // O = 0 and lse = the sink.
  __device__ __forceinline__ void finish(float (&inv_sum)[kMTiles][2], float (&lse)[kMTiles][2], float scale_log2,
                                         float sink_log2 = -INFINITY) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = row_sum[mt][half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const bool empty = !(sum > 0.0f);
        if (sink_log2 != -INFINITY) {
          const float m = empty ? -INFINITY : row_max[mt][half] * scale_log2;
          const float top = fmaxf(m, sink_log2);
          const float keep = empty ? 0.0f : ptx::exp2_approx(m - top);
          const float total = sum * keep + ptx::exp2_approx(sink_log2 - top);
          inv_sum[mt][half] = keep / total;
          lse[mt][half] = (top + log2f(total)) * 0.6931471805599453f;
          continue;
        }
        inv_sum[mt][half] = empty ? 0.0f : 1.0f / sum;
        lse[mt][half] = empty ? -INFINITY
                              : (row_max[mt][half] * scale_log2 + log2f(sum)) * 0.6931471805599453f;
      }
    }
  }
};

}  // namespace llmk::detail
