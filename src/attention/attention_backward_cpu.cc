// CPU reference of the attention backward: the naive algorithm in double, one rounding per
// output. Per (batch entry, query head, row): the scores of the visible keys, P = exp(s -
// lse) from the forward's lse, D = dout . out, dP = dout . v, dS = P (dP - D); dq of the
// row directly, dk and dv accumulated per kv head over its query heads, then rounded once.
// The variants: the window bounds the keys; softcap multiplies dS by ds/du = 1 - (s /
// softcap)^2 (s = softcap tanh(u / softcap)); the sink of head h adds -exp(sink - lse) D per
// row to dsinks[h] (its P, times the D that every probability's gradient subtracts).
#include <cmath>
#include <vector>

#include "attention/attention_params.h"
#include "common/attention_row_host.h"
#include "common/host_types.h"

namespace llmk::detail {

void attention_backward_cpu(const AttentionBackwardParams& bp, DType dtype) {
  const AttentionParams& p = bp.fwd;
  dispatch_dtype(dtype, "attention_backward", [&](auto tag) {
    using T = host_type_t<decltype(tag)>;
    const int d = p.head_dim;
    auto at = [](const AttentionTensor& t, int b, int64_t row, int head) {
      return static_cast<T*>(t.data) + b * t.batch_stride + row * t.row_stride + head * t.head_stride;
    };
    auto load = [&](const T* x, std::vector<double>& to) {
      for (int c = 0; c < d; ++c) to[c] = double(to_float(x[c]));
    };
    std::vector<double> dk_acc, dv_acc, q(d), dout(d), dq(d), kj(d), vj(d);
    std::vector<double> dsinks(static_cast<size_t>(p.heads_q), 0.0);
    const double softcap = p.variants.softcap;
    for (int b = 0; b < p.batch; ++b) {
      const SequenceBounds seq = sequence_bounds(p, b);
      // [heads_kv, seqlen_k, d] sums over each kv head's query heads.
      dk_acc.assign(static_cast<size_t>(bp.heads_kv) * seq.seqlen_k * d, 0.0);
      dv_acc.assign(dk_acc.size(), 0.0);
      for (int h = 0; h < p.heads_q; ++h) {
        const int kv_head = h / p.group;
        for (int64_t i = 0; i < seq.seqlen_q; ++i) {
          const int64_t row = seq.q_start + i;
          load(at(p.q, b, row, h), q);
          load(at(bp.dout, b, row, h), dout);
          const T* out = at(p.out, b, row, h);
          double delta = 0;
          for (int c = 0; c < d; ++c) delta += dout[c] * double(to_float(out[c]));
          const double lse = p.lse[p.lse_offset(b, h) + row];
          std::fill(dq.begin(), dq.end(), 0.0);
          // lse = -inf (the forward's empty row) or +inf: P = 0 for every key.
          const int64_t first = std::isinf(lse) ? 0 : first_visible_key(seq, p.causal, p.variants.window, i);
          const int64_t end = std::isinf(lse) ? 0 : visible_keys(seq, p.causal, i);
          if (p.variants.sinks && !std::isinf(lse)) dsinks[h] -= std::exp(double(p.variants.sinks[h]) - lse) * delta;
          for (int64_t j = first; j < end; ++j) {
            load(at(p.k, b, seq.k_start + j, kv_head), kj);
            load(at(p.v, b, seq.k_start + j, kv_head), vj);
            double dot = 0, dp = 0;
            for (int c = 0; c < d; ++c) {
              dot += q[c] * kj[c];
              dp += dout[c] * vj[c];
            }
            const double s = attention_score_host(dot, p.scale, softcap);
            const double prob = std::exp(s - lse);
            double ds = prob * (dp - delta);
            if (softcap > 0) ds *= 1.0 - (s / softcap) * (s / softcap);
            double* dk = &dk_acc[(static_cast<size_t>(kv_head) * seq.seqlen_k + j) * d];
            double* dv = &dv_acc[(static_cast<size_t>(kv_head) * seq.seqlen_k + j) * d];
            for (int c = 0; c < d; ++c) {
              dq[c] += ds * kj[c];
              dk[c] += ds * q[c];
              dv[c] += prob * dout[c];
            }
          }
          T* dq_out = at(bp.dq, b, row, h);
          for (int c = 0; c < d; ++c) dq_out[c] = from_float<T>(static_cast<float>(dq[c] * p.scale));
        }
      }
      for (int g = 0; g < bp.heads_kv; ++g)
        for (int64_t j = 0; j < seq.seqlen_k; ++j) {
          T* dk = at(bp.dk, b, seq.k_start + j, g);
          T* dv = at(bp.dv, b, seq.k_start + j, g);
          const size_t base = (static_cast<size_t>(g) * seq.seqlen_k + j) * d;
          for (int c = 0; c < d; ++c) {
            dk[c] = from_float<T>(static_cast<float>(dk_acc[base + c] * p.scale));
            dv[c] = from_float<T>(static_cast<float>(dv_acc[base + c]));
          }
        }
    }
    if (bp.dsinks)
      for (int h = 0; h < p.heads_q; ++h) bp.dsinks[h] = static_cast<float>(dsinks[h]);
  });
}

}  // namespace llmk::detail
