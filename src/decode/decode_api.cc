// Public entry points of the decode attention (include/llmk/attention_decode.h): validate
// every argument (a rejected call writes nothing), then run the CUDA launcher or the CPU
// reference. On the host the caller's contract (lengths within the cache, the pages a
// sequence uses within the cache, rotary positions within the cos/sin cache) is checked too.
#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/attention_options.h"
#include "common/cache_attention.h"
#include "common/cuda_check.h"
#include "common/env_path.h"
#include "common/head_dims.h"
#include "common/rows.h"
#include "decode/attention_decode_params.h"
#include "llmk/attention_decode.h"

namespace llmk {

using detail::DecodeCacheTensor;
using detail::DecodeParams;
using detail::AttentionTensor;

namespace {

constexpr const char* kOp = "attention_decode";
constexpr int64_t kMaxGridDim = 65535;

void check_size(const char* what, int64_t value, int64_t limit) {
  LLMK_CHECK(value >= 0 && value <= limit, kOp, ": ", what, " is ", value, ", at most ", limit, " is supported");
}

// The head dim contiguous, the data and every stride of a dim of size > 1 whole 16-byte
// vectors (the kernel moves rows in 16-byte pieces).
void check_rows_aligned(const char* arg, const TensorView& t) {
  const int64_t vec = 16 / dtype_size(t.dtype());
  LLMK_CHECK(t.stride(-1) == 1 || t.size(-1) <= 1, kOp, ": ", arg,
             " must be contiguous in its last (head_dim) dim, got stride ", t.stride(-1));
  LLMK_CHECK(detail::is_aligned(t.data(), 16), kOp, ": ", arg, " data pointer ", t.data(), " is not 16-byte aligned");
  for (int i = 0; i < t.ndim() - 1; ++i) {
    LLMK_CHECK(t.size(i) == 1 || (t.stride(i) >= 0 && t.stride(i) % vec == 0), kOp, ": ", arg, " stride ",
               t.stride(i), " of dim ", i, " must be a non-negative multiple of ", vec, " elements (16-byte aligned ",
               dtype_name(t.dtype()), " rows)");
  }
}

// q, out, k_new or v_new: [batch, q_len, heads, head_dim] in fp16 or bf16.
AttentionTensor check_tokens(const char* arg, const TensorView& t) {
  LLMK_CHECK(t.ndim() == 4, kOp, ": ", arg, " must be [batch, q_len, heads, head_dim], got ",
             detail::shape_string(t));
  LLMK_CHECK(t.dtype() == DType::f16 || t.dtype() == DType::bf16, kOp, ": ", arg,
             " must be float16 or bfloat16, got ", dtype_name(t.dtype()));
  LLMK_CHECK(detail::head_dim_from_64(t.size(3)), kOp, ": ", arg, " has head_dim ", t.size(3),
             "; supported head dims are ", detail::head_dim_words(attention_decode_head_dims()));
  check_rows_aligned(arg, t);
  AttentionTensor r;
  r.data = t.data();
  r.batch_stride = t.stride(0);
  r.row_stride = t.stride(1);
  r.head_stride = t.stride(2);
  return r;
}

// A [tokens, heads, head_dim] slab of k_new / v_new or the shape of lse: `want` exactly.
void check_shape(const char* arg, const TensorView& t, const std::vector<int64_t>& want, const char* names) {
  bool same = t.ndim() == static_cast<int>(want.size());
  for (size_t i = 0; same && i < want.size(); ++i) same = t.size(static_cast<int>(i)) == want[i];
  LLMK_CHECK(same, kOp, ": ", arg, " must be ", names, " = ",
             detail::dims_string(want.data(), static_cast<int>(want.size())), ", got ", detail::shape_string(t));
}

// A contiguous 1-d int32 / float32 tensor of n elements on q's device.
void check_1d(const char* arg, const TensorView& t, DType dtype, int64_t n, const TensorView& q) {
  detail::check_same_device(kOp, arg, t, "q", q);
  detail::check_dtype(kOp, arg, t, dtype);
  detail::check_vector(kOp, arg, t, n);
}

struct Validated {
  DecodeParams p;
  DType dtype = DType::f16, cache_dtype = DType::f16;
  bool on_host = false;
};

// q and the cache: everything the workspace size depends on.
Validated validate_shapes(const TensorView& q, const DecodeCache& cache) {
  Validated r;
  DecodeParams& p = r.p;
  p.q = check_tokens("q", q);
  const TensorView &k = cache.k, &v = cache.v;
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"k_cache", &k}, {"v_cache", &v}}) {
    LLMK_CHECK(t->ndim() == 4, kOp, ": ", arg, " must be [batch, max_len, heads_kv, head_dim] (a contiguous cache) "
               "or [num_pages, page_size, heads_kv, head_dim] (a paged cache, with block_table), got ",
               detail::shape_string(*t));
    detail::check_same_device(kOp, arg, *t, "q", q);
    LLMK_CHECK(t->dtype() == q.dtype() || t->dtype() == DType::f8e4m3, kOp, ": ", arg, " has dtype ",
               dtype_name(t->dtype()), "; the cache holds q's dtype (", dtype_name(q.dtype()), ") or float8_e4m3fn");
    LLMK_CHECK(t->size(3) == q.size(3), kOp, ": ", arg, " has head_dim ", t->size(3), ", q has ", q.size(3),
               "; they must match");
    check_rows_aligned(arg, *t);
  }
  detail::check_dtype(kOp, "v_cache", v, k.dtype());
  detail::check_same_shape(kOp, "v_cache", v, "k_cache", k);
  for (auto [c, t] : {std::pair<DecodeCacheTensor*, const TensorView*>{&p.k, &k}, {&p.v, &v}}) {
    c->data = t->data();
    c->page_stride = t->stride(0);
    c->row_stride = t->stride(1);
    c->head_stride = t->stride(2);
  }

  const int64_t batch = q.size(0), q_len = q.size(1), heads_q = q.size(2), heads_kv = k.size(2);
  check_size("batch", batch, kMaxGridDim);
  LLMK_CHECK(q_len >= 1, kOp, ": q has q_len 0; a decode step has at least one query token per sequence");
  check_size("q_len", q_len, INT_MAX / 2);
  LLMK_CHECK(heads_kv >= 1 && heads_q >= 1 && heads_q % heads_kv == 0, kOp, ": heads_q (", heads_q,
             ") must be a positive multiple of heads_kv (", heads_kv, ", the cache's heads)");
  check_size("heads_q", heads_q, kMaxGridDim);

  int64_t capacity = 0;
  if (cache.block_table) {
    const TensorView& bt = *cache.block_table;
    detail::check_same_device(kOp, "block_table", bt, "q", q);
    detail::check_dtype(kOp, "block_table", bt, DType::i32);
    LLMK_CHECK(bt.ndim() == 2 && bt.size(0) == batch, kOp, ": block_table must be int32 [batch, max_pages] with batch ",
               batch, ", got ", detail::shape_string(bt));
    LLMK_CHECK(bt.size(1) <= 1 || bt.stride(1) == 1, kOp, ": block_table must be contiguous in its last dim, got stride ",
               bt.stride(1));
    LLMK_CHECK(bt.size(0) <= 1 || bt.stride(0) >= 0, kOp, ": block_table has a negative row stride ", bt.stride(0));
    detail::check_element_aligned(kOp, "block_table", bt);
    LLMK_CHECK(k.size(1) >= 1, kOp, ": a paged cache needs page_size >= 1, k_cache is ", detail::shape_string(k));
    LLMK_CHECK(k.size(0) >= 1, kOp, ": a paged cache needs at least one page, k_cache is ", detail::shape_string(k));
    check_size("num_pages", k.size(0), INT_MAX);
    check_size("page_size", k.size(1), INT_MAX);
    check_size("max_pages", bt.size(1), INT_MAX);
    capacity = bt.size(1) * k.size(1);
    p.block_table = static_cast<const int32_t*>(bt.data());
    p.block_table_stride = bt.size(0) > 1 ? bt.stride(0) : 0;
    p.max_pages = static_cast<int>(bt.size(1));
    p.num_pages = static_cast<int>(k.size(0));
    p.page_size = static_cast<int>(k.size(1));
  } else {
    LLMK_CHECK(k.size(0) == batch, kOp, ": k_cache has batch ", k.size(0), ", q has ", batch,
               " (a contiguous cache is [batch, max_len, heads_kv, head_dim]; a paged one comes with block_table)");
    capacity = k.size(1);
    p.max_pages = 1;
    p.num_pages = static_cast<int>(batch);
    p.page_size = static_cast<int>(std::min<int64_t>(capacity, INT_MAX));
  }
  LLMK_CHECK(capacity <= INT_MAX / 2, kOp, ": the cache holds ", capacity, " keys per sequence, at most ",
             INT_MAX / 2, " are supported");
  p.capacity = static_cast<int>(capacity);

  const bool fp8 = k.dtype() == DType::f8e4m3;
  for (const auto& [arg, scale, c] : {std::tuple<const char*, const std::optional<TensorView>*, DecodeCacheTensor*>{
                                          "k_scale", &cache.k_scale, &p.k},
                                      {"v_scale", &cache.v_scale, &p.v}}) {
    if (!fp8) {
      LLMK_CHECK(!scale->has_value(), kOp, ": ", arg, " is given but the cache is ", dtype_name(k.dtype()),
                 "; scales apply to a float8_e4m3fn cache only");
      continue;
    }
    LLMK_CHECK(scale->has_value(), kOp, ": a float8_e4m3fn cache needs ", arg, " (float32 [heads_kv] = [", heads_kv,
               "]: a stored value x means x * scale)");
    check_1d(arg, **scale, DType::f32, heads_kv, q);
    c->scale = static_cast<const float*>((*scale)->data());
  }

  p.batch = static_cast<int>(batch);
  p.q_len = static_cast<int>(q_len);
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_kv);
  p.group = static_cast<int>(heads_q / heads_kv);
  p.head_dim = static_cast<int>(q.size(3));
  r.dtype = q.dtype();
  r.cache_dtype = k.dtype();
  r.on_host = !q.is_cuda();
  return r;
}

// Every tensor the call writes (out, lse, the workspace; the cache with append) is disjoint
// from every other tensor of the call. k_cache and v_cache may interleave (the halves of one
// kv tensor) but not be the same tensor when they are written.
void check_overlaps(const TensorView& out, const TensorView& q, const DecodeCache& cache,
                    const TensorView& cache_seqlens, const std::optional<DecodeAppend>& append,
                    const std::optional<TensorView>& lse, const std::optional<TensorView>& workspace) {
  using Arg = std::pair<const char*, const TensorView*>;
  std::vector<Arg> read = {{"q", &q}, {"cache_seqlens", &cache_seqlens}};
  if (cache.block_table) read.emplace_back("block_table", &*cache.block_table);
  if (cache.k_scale) read.emplace_back("k_scale", &*cache.k_scale);
  if (cache.v_scale) read.emplace_back("v_scale", &*cache.v_scale);
  if (append) {
    read.emplace_back("k_new", &append->k_new);
    read.emplace_back("v_new", &append->v_new);
    if (append->rotary_cos_sin) read.emplace_back("rotary_cos_sin", &*append->rotary_cos_sin);
  }
  std::vector<Arg> written = {{"out", &out}};
  if (lse) written.emplace_back("lse", &*lse);
  if (workspace) written.emplace_back("workspace", &*workspace);
  std::vector<Arg> caches = {{"k_cache", &cache.k}, {"v_cache", &cache.v}};
  if (append) {
    LLMK_CHECK(!detail::same_view(cache.k, cache.v), kOp, ": k_cache and v_cache are the same tensor; append writes "
               "both");
    for (const Arg& c : caches) {
      detail::check_no_self_overlap(kOp, c.first, *c.second);
      for (const Arg& a : read) detail::check_no_overlap(kOp, c.first, *c.second, a.first, *a.second, false);
    }
  }
  read.insert(read.end(), caches.begin(), caches.end());
  detail::check_no_self_overlap(kOp, "out", out);
  for (size_t i = 0; i < written.size(); ++i) {
    for (const Arg& a : read)
      detail::check_no_overlap(kOp, written[i].first, *written[i].second, a.first, *a.second, false);
    for (size_t j = 0; j < i; ++j)
      detail::check_no_overlap(kOp, written[i].first, *written[i].second, written[j].first, *written[j].second, false);
  }
}

// The CPU backend checks the contract that the GPU cannot check without a sync.
void check_host_contract(const DecodeParams& p, bool paged) {
  const bool append = p.k_new.data != nullptr;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t n = p.cache_seqlens[b];
    LLMK_CHECK(n >= 0, kOp, ": cache_seqlens[", b, "] = ", n, " is negative");
    const int64_t keys = n + (append ? p.q_len : 0);
    if (paged) {
      LLMK_CHECK(keys <= p.capacity, kOp, ": cache_seqlens[", b, "] = ", n, append ? " + q_len " : "",
                 append ? std::to_string(p.q_len) : "", " keys exceed the paged cache's capacity of ", p.capacity,
                 " keys per sequence (max_pages ", p.max_pages, " x page_size ", p.page_size, ")");
      const int64_t pages = (keys + p.page_size - 1) / p.page_size;
      for (int64_t j = 0; j < pages; ++j) {
        const int64_t page = p.block_table[b * p.block_table_stride + j];
        LLMK_CHECK(page >= 0 && page < p.num_pages, kOp, ": block_table[", b, "][", j, "] = ", page,
                   " is outside the cache's ", p.num_pages, " pages (sequence ", b, " holds ", keys,
                   " keys in its first ", pages, " pages)");
      }
    } else {
      LLMK_CHECK(keys <= p.capacity, kOp, ": cache_seqlens[", b, "] = ", n, append ? " + q_len " : "",
                 append ? std::to_string(p.q_len) : "", " keys exceed the cache's max_len ", p.capacity);
    }
    for (int i = 0; p.rotary_cos_sin && i < p.q_len; ++i)
      LLMK_CHECK(n + i < p.rotary_max_pos, kOp, ": rotary position ", n + i, " (cache_seqlens[", b, "] + ", i,
                 ") is outside rotary_cos_sin's ", p.rotary_max_pos, " rows");
  }
}

// Float32 elements of the split-KV partial results.
int64_t workspace_elements(const DecodeParams& p, int splits) {
  if (splits <= 1) return 0;
  return int64_t{splits} * p.batch * p.q_len * p.heads_q * (p.head_dim + 1);
}

int splits_for(const Validated& r, int device) {
  const DecodeParams& p = r.p;
  const bool fp8 = r.cache_dtype == DType::f8e4m3, paged = p.block_table != nullptr;
  const int plain = detail::decode_splits_for(p.batch, p.heads_kv, p.q_len, p.group, p.head_dim, fp8, paged, false,
                                              p.capacity, device);
  if (!p.variants.any()) return plain;
  // The score variants run on 16-row tiles, and with a sliding window no row sees more than
  // window + q_len - 1 keys (from the first token's window start on): the splits are planned
  // for those, never more than the plain call's (what attention_decode_workspace_size sized).
  const int64_t window_keys = int64_t{p.variants.window} + p.q_len - 1;
  const int keys = p.variants.window > 0 && window_keys < p.capacity ? static_cast<int>(window_keys) : p.capacity;
  const int with_variants = detail::decode_splits_for(p.batch, p.heads_kv, p.q_len, p.group, p.head_dim, fp8, paged,
                                                      true, keys, device);
  return with_variants < plain ? with_variants : plain;
}

// Calls with at least this many query tokens per sequence run the prefill kernel over the
// cache (attention_over_cache) where it takes them: the decode kernel's tiles of 16-64 query
// rows each re-read the keys, the prefill's 128-row tiles share them through L2.
constexpr int kPrefillMinQueries = 64;

detail::CacheAttentionCall cache_call(const DecodeParams& p) {
  detail::CacheAttentionCall c;
  c.q = p.q;
  c.out = p.out;
  for (auto [dst, src] : {std::pair<AttentionTensor*, const DecodeCacheTensor*>{&c.k, &p.k}, {&c.v, &p.v}}) {
    dst->data = src->data;
    dst->batch_stride = src->page_stride;
    dst->row_stride = src->row_stride;
    dst->head_stride = src->head_stride;
  }
  c.cache_seqlens = p.cache_seqlens;
  c.block_table = p.block_table;
  c.block_table_stride = p.block_table_stride;
  c.page_size = p.page_size;
  c.num_pages = p.num_pages;
  c.capacity = p.capacity;
  c.batch = p.batch;
  c.q_len = p.q_len;
  c.heads_q = p.heads_q;
  c.group = p.group;
  c.head_dim = p.head_dim;
  c.causal = p.causal;
  c.scale = p.scale;
  c.scale_log2 = p.scale_log2;
  c.variants = p.variants;
  c.lse = p.lse;
  return c;
}

// LLMK_DECODE_PATH=auto|decode|prefill: whether a GPU call runs the prefill kernel over the
// cache (auto: from kPrefillMinQueries query tokens, where it takes the call; prefill: an
// error naming the reason where it cannot). Calls that append take the decode kernel. Sets
// `call` where it returns true.
bool runs_prefill(const Validated& r, int device, detail::CacheAttentionCall& call) {
  enum Path { automatic, decode, prefill };
  const int path = detail::env_path(kOp, "LLMK_DECODE_PATH", {"auto", "decode", "prefill"});
  if (path == decode || (path == automatic && r.p.q_len < kPrefillMinQueries)) return false;
  const char* why = "";
  bool takes = false;
  if (r.p.k_new.data != nullptr) {
    why = "the call appends to the cache (the decode kernel writes k_new / v_new)";
  } else if (r.cache_dtype != r.dtype) {
    why = "the cache is float8_e4m3fn (the prefill kernel reads 16-bit caches)";
  } else {
    call = cache_call(r.p);
    takes = detail::attention_over_cache_takes(call, r.dtype, device, &why);
  }
  LLMK_CHECK(takes || path == automatic, kOp, ": LLMK_DECODE_PATH=prefill cannot take this call: ", why);
  return takes;
}

}  // namespace

std::vector<int64_t> attention_decode_head_dims() {
  return detail::head_dims_where([](int64_t d) { return detail::head_dim_from_64(d); });
}

int64_t attention_decode_workspace_size(const TensorView& q, const DecodeCache& cache, int device) {
  const Validated r = validate_shapes(q, cache);
  if (r.on_host || r.p.batch == 0) return 0;
  return workspace_elements(r.p, splits_for(r, device));
}

void attention_decode(const TensorView& out, const TensorView& q, const DecodeCache& cache,
                      const TensorView& cache_seqlens, const std::optional<DecodeAppend>& append, bool causal,
                      double scale, const std::optional<TensorView>& lse, const std::optional<TensorView>& workspace,
                      cudaStream_t stream) {
  attention_decode(out, q, cache, cache_seqlens, append, causal, scale, AttentionOptions{}, lse, workspace, stream);
}

void attention_decode(const TensorView& out, const TensorView& q, const DecodeCache& cache,
                      const TensorView& cache_seqlens, const std::optional<DecodeAppend>& append, bool causal,
                      double scale, const AttentionOptions& options, const std::optional<TensorView>& lse,
                      const std::optional<TensorView>& workspace, cudaStream_t stream) {
  Validated r = validate_shapes(q, cache);
  DecodeParams& p = r.p;
  const int64_t batch = q.size(0), q_len = q.size(1), heads_q = q.size(2), heads_kv = cache.k.size(2),
                head_dim = q.size(3);

  p.out = check_tokens("out", out);
  detail::check_same_device(kOp, "out", out, "q", q);
  detail::check_dtype(kOp, "out", out, q.dtype());
  detail::check_same_shape(kOp, "out", out, "q", q);

  check_1d("cache_seqlens", cache_seqlens, DType::i32, batch, q);
  p.cache_seqlens = static_cast<const int32_t*>(cache_seqlens.data());

  if (append) {
    for (const auto& [arg, t, dst] : {std::tuple<const char*, const TensorView*, AttentionTensor*>{
                                          "k_new", &append->k_new, &p.k_new},
                                      {"v_new", &append->v_new, &p.v_new}}) {
      *dst = check_tokens(arg, *t);
      detail::check_same_device(kOp, arg, *t, "q", q);
      detail::check_dtype(kOp, arg, *t, q.dtype());
      check_shape(arg, *t, {batch, q_len, heads_kv, head_dim}, "[batch, q_len, heads_kv, head_dim]");
    }
    if (append->rotary_cos_sin) {
      const TensorView& cs = *append->rotary_cos_sin;
      detail::check_same_device(kOp, "rotary_cos_sin", cs, "q", q);
      detail::check_dtype(kOp, "rotary_cos_sin", cs, DType::f32);
      LLMK_CHECK(cs.ndim() == 2, kOp, ": rotary_cos_sin must be float32 [max_pos, rotary_dim] (cos | sin, as rope_'s "
                 "cos_sin_cache), got ", detail::shape_string(cs));
      const int64_t rot = cs.size(1);
      LLMK_CHECK(rot >= 2 && rot % 2 == 0 && rot <= head_dim, kOp, ": rotary_cos_sin has rotary_dim ", rot,
                 "; it must be even, in [2, head_dim = ", head_dim, "]");
      check_size("rotary_cos_sin's max_pos", cs.size(0), INT_MAX);
      LLMK_CHECK(detail::is_contiguous(cs), kOp, ": rotary_cos_sin must be contiguous, got strides ",
                 detail::dims_string(cs.strides(), cs.ndim()));
      detail::check_element_aligned(kOp, "rotary_cos_sin", cs);
      p.rotary_cos_sin = static_cast<const float*>(cs.data());
      p.rotary_dim = static_cast<int>(rot);
      p.rotary_max_pos = static_cast<int>(cs.size(0));
      p.rotary_interleaved = append->rotary_style == RopeStyle::gptj;
    }
  }

  if (lse) {
    detail::check_same_device(kOp, "lse", *lse, "q", q);
    detail::check_dtype(kOp, "lse", *lse, DType::f32);
    check_shape("lse", *lse, {batch, heads_q, q_len}, "float32 [batch, heads_q, q_len]");
    LLMK_CHECK(detail::is_contiguous(*lse), kOp, ": lse must be contiguous, got strides ",
               detail::dims_string(lse->strides(), lse->ndim()));
    detail::check_element_aligned(kOp, "lse", *lse);
    p.lse = static_cast<float*>(lse->data());
  }

  if (workspace) {
    detail::check_same_device(kOp, "workspace", *workspace, "q", q);
    detail::check_dtype(kOp, "workspace", *workspace, DType::f32);
    LLMK_CHECK(workspace->ndim() == 1, kOp, ": workspace must be a 1-d float32 tensor, got shape ",
               detail::shape_string(*workspace));
    LLMK_CHECK(workspace->numel() <= 1 || workspace->stride(0) == 1, kOp, ": workspace must be contiguous, got stride ",
               workspace->stride(0));
    LLMK_CHECK(detail::is_aligned(workspace->data(), 16), kOp, ": workspace data pointer ", workspace->data(),
               " is not 16-byte aligned");
  }

  LLMK_CHECK(std::isfinite(scale) && scale > 0, kOp, ": scale must be finite and > 0, got ", scale);
  p.causal = causal;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  LLMK_CHECK(p.scale > 0 && std::isfinite(p.scale) && std::isfinite(p.scale_log2), kOp, ": scale ", scale,
             " is out of float range");
  p.variants = detail::check_attention_options(kOp, options, q, causal);
  if (options.sinks) {  // the written tensors overlap no sinks
    detail::check_no_overlap(kOp, "out", out, "sinks", *options.sinks, false);
    if (lse) detail::check_no_overlap(kOp, "lse", *lse, "sinks", *options.sinks, false);
    if (append) {
      detail::check_no_overlap(kOp, "k_cache", cache.k, "sinks", *options.sinks, false);
      detail::check_no_overlap(kOp, "v_cache", cache.v, "sinks", *options.sinks, false);
    }
  }

  check_overlaps(out, q, cache, cache_seqlens, append, lse, workspace);

  if (r.on_host) {
    check_host_contract(p, cache.block_table.has_value());
    if (p.batch == 0) return;
    return detail::attention_decode_cpu(p, r.dtype, r.cache_dtype);
  }
  if (p.batch == 0) return;
  LLMK_CHECK(detail::head_dim_compiled(p.head_dim), kOp, ": head_dim ", p.head_dim,
             " has no CUDA kernel in this build (CMake option LLMK_HEAD_DIMS)");
  detail::DeviceGuard guard(kOp, "q", q);
  if (detail::CacheAttentionCall call; runs_prefill(r, q.device().index, call))
    return detail::attention_over_cache(call, r.dtype, stream);
  const int splits = splits_for(r, q.device().index);
  if (workspace) {
    const int64_t needed = workspace_elements(p, splits);
    LLMK_CHECK(workspace->numel() >= needed, kOp, ": workspace has ", workspace->numel(), " elements, this call needs ",
               needed, " (attention_decode_workspace_size)");
    if (splits > 1) {
      p.splits = splits;
      p.partial_out = static_cast<float*>(workspace->data());
      p.partial_lse = p.partial_out + int64_t{splits} * p.batch * p.q_len * p.heads_q * p.head_dim;
    }
  } else {
    // Without a workspace, the launcher merges up to kDecodeClusterMaxSplits splits in a
    // cluster where the GPU has them (else it runs one).
    p.splits = std::min(splits, detail::kDecodeClusterMaxSplits);
  }
  detail::attention_decode_cuda(p, r.dtype, r.cache_dtype, stream);
}

}  // namespace llmk
