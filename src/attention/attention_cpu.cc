// CPU reference of the attention forward: the naive algorithm in double (all scores of
// a row, their max, the exponentials, the weighted sum of V), one rounding per output; the
// score variants (window, softcap, sinks) as include/llmk/attention.h defines them.
#include <vector>

#include "attention/attention_params.h"
#include "common/attention_row_host.h"
#include "common/host_types.h"

namespace llmk::detail {

void attention_forward_cpu(const AttentionParams& p, DType dtype) {
  dispatch_dtype(dtype, "attention", [&](auto tag) {
    using T = host_type_t<decltype(tag)>;
    const int d = p.head_dim;
    std::vector<double> scores, acc;
    for (int b = 0; b < p.batch; ++b) {
      const SequenceBounds seq = sequence_bounds(p, b);
      for (int h = 0; h < p.heads_q; ++h) {
        const int kv_head = h / p.group;
        auto row = [&](const AttentionTensor& t, int64_t start, int64_t i, int head) {
          return static_cast<T*>(t.data) + b * t.batch_stride + (start + i) * t.row_stride +
                 head * t.head_stride;
        };
        const double sink = sink_host(p.variants, h);
        for (int64_t i = 0; i < seq.seqlen_q; ++i) {
          const T* q = row(p.q, seq.q_start, i, h);
          const int64_t first = first_visible_key(seq, p.causal, p.variants.window, i);  // keys [first, end)
          const double lse = attend_row_host(
              visible_keys(seq, p.causal, i) - first, d, p.scale, p.variants.softcap, sink,
              [&](int64_t j) {
                const T* k = row(p.k, seq.k_start, first + j, kv_head);
                double dot = 0;
                for (int c = 0; c < d; ++c) dot += double(to_float(q[c])) * double(to_float(k[c]));
                return dot;
              },
              [&](int64_t j, int c) { return double(to_float(row(p.v, seq.k_start, first + j, kv_head)[c])); },
              scores, acc);
          T* out = row(p.out, seq.q_start, i, h);
          for (int c = 0; c < d; ++c) out[c] = from_float<T>(static_cast<float>(acc[c]));
          if (p.lse) p.lse[p.lse_offset(b, h) + seq.q_start + i] = static_cast<float>(lse);
        }
      }
    }
  });
}

}  // namespace llmk::detail
