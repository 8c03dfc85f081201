// CPU reference of the decode attention: the naive algorithm in double, in the order a
// reader checks it against the header (include/llmk/attention_decode.h):
//   1. append: k_new (rotated as rope_ rotates, rounded to q's dtype) and v_new are stored
//      into the cache at positions cache_seqlens[b] + i: copied for an fp16/bf16 cache,
//      quantized to e4m3 as x / scale (the quotient in float, then round to nearest even,
//      saturating at +-448; NaN stays NaN) for fp8;
//   2. a rotated copy of q (rope_'s rounding; q itself is not modified);
//   3. per (sequence, q token, query head): every score over the visible keys, read through
//      decode_cache_row (fp8 dequantized as value * scale), their max, the exponentials and
//      the weighted sum of V; one rounding per output; lse in natural log, and out 0 /
//      lse -inf for a query that sees no key.
// The caller (decode_api.cc) has checked the contract: lengths within the capacity,
// the pages a sequence uses within the cache, rotary positions within the cos/sin cache.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "common/attention_row_host.h"
#include "common/host_types.h"
#include "common/rope_host.h"
#include "decode/attention_decode_params.h"

namespace llmk::detail {

namespace {

// Row i of sequence b of q, out, k_new or v_new, at head h.
template <class T>
T* token_row(const AttentionTensor& t, int b, int i, int h) {
  return static_cast<T*>(t.data) + b * t.batch_stride + i * t.row_stride + h * t.head_stride;
}

// The cache element type C holds T values as they are (C == T) or e4m3 codes with scales.
template <class C>
double cache_value(const DecodeCacheTensor& c, int64_t row, int h, int col) {
  const double x = to_float(static_cast<const C*>(c.data)[row + h * c.head_stride + col]);
  return c.scale ? x * static_cast<double>(c.scale[h]) : x;
}

template <class T, class C>
void store_cache(const DecodeCacheTensor& c, int64_t row, int h, const T* x, int d) {
  C* dst = static_cast<C*>(c.data) + row + h * c.head_stride;
  for (int col = 0; col < d; ++col) {
    if constexpr (std::is_same_v<C, T>) {
      dst[col] = x[col];
    } else {
      dst[col] = from_float<C>(to_float(x[col]) / c.scale[h]);  // the quotient in float, as the kernel
    }
  }
}

// cos and sin of the rotary angles at position pos: cos_sin row pos, cos | sin.
void rotary_angles(const DecodeParams& p, int64_t pos, std::vector<double>& cos_v, std::vector<double>& sin_v) {
  const int half = p.rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    cos_v[i] = p.rotary_cos_sin[pos * p.rotary_dim + i];
    sin_v[i] = p.rotary_cos_sin[pos * p.rotary_dim + half + i];
  }
}

template <class T, class C>
void decode(const DecodeParams& p) {
  const int d = p.head_dim;
  const RopeStyle style = p.rotary_interleaved ? RopeStyle::gptj : RopeStyle::neox;
  const bool append = p.k_new.data != nullptr, rotary = p.rotary_cos_sin != nullptr;
  std::vector<double> cos_v(std::max(p.rotary_dim / 2, 1)), sin_v(cos_v.size());
  std::vector<T> x(d);

  // 1. The appended tokens into the cache.
  for (int b = 0; append && b < p.batch; ++b)
    for (int i = 0; i < p.q_len; ++i) {
      const int64_t pos = int64_t{p.cache_seqlens[b]} + i;
      if (pos < 0 || pos >= p.capacity) continue;  // outside the contract (checked by the caller)
      if (rotary) rotary_angles(p, pos, cos_v, sin_v);
      const int64_t k_row = decode_cache_row(p, p.k, b, static_cast<int>(pos));
      const int64_t v_row = decode_cache_row(p, p.v, b, static_cast<int>(pos));
      for (int h = 0; h < p.heads_kv; ++h) {
        std::copy_n(token_row<T>(p.k_new, b, i, h), d, x.begin());
        if (rotary) rope_rotate_host(x.data(), p.rotary_dim, style, cos_v.data(), sin_v.data());
        store_cache<T, C>(p.k, k_row, h, x.data(), d);
        store_cache<T, C>(p.v, v_row, h, token_row<T>(p.v_new, b, i, h), d);
      }
    }

  // 2-3. Attention of every q token over the cache.
  std::vector<double> scores, acc;
  std::vector<int64_t> k_rows, v_rows;
  for (int b = 0; b < p.batch; ++b) {
    const int seqlen_k = decode_seqlen_k(p, b);
    k_rows.resize(seqlen_k);
    v_rows.resize(seqlen_k);
    for (int j = 0; j < seqlen_k; ++j) {
      k_rows[j] = decode_cache_row(p, p.k, b, j);
      v_rows[j] = decode_cache_row(p, p.v, b, j);
    }
    for (int i = 0; i < p.q_len; ++i) {
      const int first = decode_first_key(p, seqlen_k, i);  // keys [first, visible)
      const int keys = decode_visible_keys(p, seqlen_k, i) - first;
      if (rotary) rotary_angles(p, int64_t{p.cache_seqlens[b]} + i, cos_v, sin_v);
      for (int h = 0; h < p.heads_q; ++h) {
        const int kv_head = h / p.group;
        std::copy_n(token_row<T>(p.q, b, i, h), d, x.begin());
        if (rotary) rope_rotate_host(x.data(), p.rotary_dim, style, cos_v.data(), sin_v.data());
        const double lse = attend_row_host(
            keys, d, p.scale, p.variants.softcap, sink_host(p.variants, h),
            [&](int64_t j) {
              double dot = 0;
              for (int c = 0; c < d; ++c)
                dot += double(to_float(x[c])) * cache_value<C>(p.k, k_rows[first + j], kv_head, c);
              return dot;
            },
            [&](int64_t j, int c) { return cache_value<C>(p.v, v_rows[first + j], kv_head, c); }, scores, acc);
        T* out = token_row<T>(p.out, b, i, h);
        for (int c = 0; c < d; ++c) out[c] = from_float<T>(static_cast<float>(acc[c]));
        if (p.lse) p.lse[(int64_t{b} * p.heads_q + h) * p.q_len + i] = static_cast<float>(lse);
      }
    }
  }
}

}  // namespace

void attention_decode_cpu(const DecodeParams& p, DType dtype, DType cache_dtype) {
  dispatch_dtype(dtype, "attention_decode", [&](auto tag) {
    using T = host_type_t<decltype(tag)>;
    if (cache_dtype == DType::f8e4m3) decode<T, HostF8E4M3>(p);
    else decode<T, T>(p);
  });
}

}  // namespace llmk::detail
