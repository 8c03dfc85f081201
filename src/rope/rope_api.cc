// Public entry points of RoPE: validate every argument (a rejected call writes nothing),
// then run the CUDA launcher or the CPU reference.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "rope/rope_params.h"

namespace llmk {

using detail::RopeParams;
using detail::RopeTensor;

namespace {

constexpr int64_t kMaxRotDim = 1024;  // one thread per pair fits a block
constexpr int64_t kMaxHeads = int64_t{1} << 20;

// q or k: [tokens, heads, head_dim] or [batch, seq, heads, head_dim], last dim contiguous.
RopeTensor check_heads(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(t.ndim() == 3 || t.ndim() == 4, op, ": ", arg,
             " must be [tokens, heads, head_dim] or [batch, seq, heads, head_dim], got ",
             t.ndim(), " dims");
  detail::check_float_dtype(op, arg, t);
  LLMK_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", arg,
             " must be contiguous in its last dim, got stride ", t.stride(-1));
  LLMK_CHECK(t.size(-2) <= kMaxHeads, op, ": ", arg, " has ", t.size(-2), " heads, at most ",
             kMaxHeads, " are supported");
  LLMK_CHECK(detail::is_aligned(t.data(), dtype_size(t.dtype())), op, ": ", arg, " data pointer ",
             t.data(), " is not aligned to its elements");
  detail::check_no_self_overlap(op, arg, t);
  RopeTensor r;
  r.data = t.data();
  r.heads = static_cast<int>(t.size(-2));
  r.batch_stride = t.ndim() == 4 ? t.stride(0) : 0;
  r.seq_stride = t.stride(-3);
  r.head_stride = t.stride(-2);
  return r;
}

// q and k are disjoint: their spans do not meet, or they are head slices of one fused
// qkv tensor (equal token strides, each token's k heads beside its q heads).
void check_qk_disjoint(const char* op, const TensorView& q, const TensorView& k) {
  if (q.numel() == 0 || k.numel() == 0) return;
  const int64_t elem = dtype_size(q.dtype());
  const detail::ByteSpan qs = detail::byte_span(q), ks = detail::byte_span(k);
  if (qs.last <= ks.first || ks.last <= qs.first) return;
  // Token slots: the smallest token-dim stride, which every token stride is a multiple of.
  int64_t slot = 0;
  bool same_tokens = true;
  for (int i = 0; i < q.ndim() - 2; ++i) {
    if (q.size(i) == 1) continue;
    same_tokens = same_tokens && q.stride(i) == k.stride(i);
    if (slot == 0 || q.stride(i) < slot) slot = q.stride(i);
  }
  for (int i = 0; i < q.ndim() - 2; ++i)
    same_tokens = same_tokens && (q.size(i) == 1 || (slot > 0 && q.stride(i) % slot == 0));
  auto footprint = [](const TensorView& t) { return (t.size(-2) - 1) * t.stride(-2) + t.size(-1); };
  const bool k_after = ks.first >= qs.first;
  const int64_t gap = static_cast<int64_t>(k_after ? ks.first - qs.first : qs.first - ks.first) / elem;
  const int64_t first = footprint(k_after ? q : k), second = footprint(k_after ? k : q);
  LLMK_CHECK(same_tokens && slot > 0 && gap >= first && gap + second <= slot, op,
             ": q and k overlap in memory; they must be disjoint (head slices of one qkv "
             "tensor are accepted)");
}

struct Validated {
  RopeParams p;
  DType dtype = DType::f32;
  bool vector_ok = false;
  bool on_host = false;
};

// rot_dim 0: the whole head_dim.
Validated validate(const char* op, const TensorView& q, const TensorView& k,
                   const TensorView& positions, int64_t rot_dim) {
  Validated v;
  RopeParams& p = v.p;
  p.q = check_heads(op, "q", q);
  const int64_t head_dim = q.size(-1);
  if (k.ndim() != 0) {
    detail::check_same_device(op, "k", k, "q", q);
    detail::check_dtype(op, "k", k, q.dtype());
    p.k = check_heads(op, "k", k);
    bool same = k.ndim() == q.ndim() && k.size(-1) == head_dim;
    for (int i = 0; same && i < q.ndim() - 2; ++i) same = k.size(i) == q.size(i);
    LLMK_CHECK(same, op, ": k must have q's leading (token) dims and head_dim ", head_dim);
    check_qk_disjoint(op, q, k);
  }
  p.batch = q.ndim() == 4 ? q.size(0) : 1;
  p.seq = q.size(-3);

  detail::check_same_device(op, "positions", positions, "q", q);
  LLMK_CHECK(positions.dtype() == DType::i32 || positions.dtype() == DType::i64, op,
             ": positions must be int32 or int64, got ", dtype_name(positions.dtype()));
  // [tokens] / [batch, seq], or [seq] / [1, seq] shared by every batch entry.
  const bool full = positions.ndim() == q.ndim() - 2 &&
                    (positions.ndim() == 1 ? positions.size(0) == p.seq
                                           : positions.size(0) == p.batch && positions.size(1) == p.seq);
  const bool shared = q.ndim() == 4 && ((positions.ndim() == 1 && positions.size(0) == p.seq) ||
                                        (positions.ndim() == 2 && positions.size(0) == 1 &&
                                         positions.size(1) == p.seq));
  LLMK_CHECK(full || shared, op, ": positions must have q's leading dims (",
             q.ndim() == 4 ? "[batch, seq] or [seq]" : "[tokens]", "), got ", positions.ndim(),
             " dims of ", positions.ndim() > 0 ? positions.size(-1) : 0, " last");
  LLMK_CHECK(detail::is_contiguous(positions), op, ": positions must be contiguous");
  LLMK_CHECK(detail::is_aligned(positions.data(), dtype_size(positions.dtype())), op,
             ": positions data pointer is not aligned to its elements");
  p.positions = positions.data();
  p.positions_i64 = positions.dtype() == DType::i64;
  p.positions_batch_stride = positions.ndim() == 2 && positions.size(0) > 1 ? p.seq : 0;

  if (rot_dim == 0) rot_dim = head_dim;

  LLMK_CHECK(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim <= kMaxRotDim,
             op, ": rot_dim must be even, in [2, min(head_dim = ", head_dim, ", ", kMaxRotDim,
             ")], got ", rot_dim);
  p.rot_dim = static_cast<int>(rot_dim);

  v.dtype = q.dtype();
  v.on_host = !q.is_cuda();
  // The 16-byte vector path: every stride of a dim that is walked is whole vectors.
  const int64_t n = 16 / dtype_size(q.dtype());
  v.vector_ok = (rot_dim / 2) % n == 0;
  for (const TensorView* t : {&q, &k})
    for (int i = 0; i < t->ndim() - 1; ++i)
      v.vector_ok = v.vector_ok && (t->size(i) == 1 || t->stride(i) % n == 0);
  v.vector_ok = v.vector_ok && detail::is_aligned(q.data(), 16) &&
                (k.ndim() == 0 || detail::is_aligned(k.data(), 16));
  return v;
}

void check_cache(const char* op, Validated& v, const TensorView& q, const TensorView& positions,
                 const TensorView& cache) {
  detail::check_same_device(op, "cos_sin_cache", cache, "q", q);
  detail::check_dtype(op, "cos_sin_cache", cache, DType::f32);
  LLMK_CHECK(detail::is_contiguous(cache), op, ": cos_sin_cache must be contiguous");
  LLMK_CHECK(detail::is_aligned(cache.data(), 4), op, ": cos_sin_cache is not 4-byte aligned");
  v.p.cache = static_cast<const float*>(cache.data());
  v.p.cache_rows = cache.size(0);
  if (!v.on_host) return;
  // The CPU backend checks every position (on the GPU this would cost a sync).
  const int64_t count = positions.numel();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t pos = v.p.positions_i64 ? static_cast<const int64_t*>(positions.data())[i]
                                          : static_cast<const int32_t*>(positions.data())[i];
    LLMK_CHECK(pos >= 0 && pos < v.p.cache_rows, op, ": position ", pos, " (index ", i,
               ") is outside the cos_sin_cache's ", v.p.cache_rows, " rows");
  }
}

void check_theta(const char* op, Validated& v, const RopeTheta& f) {
  LLMK_CHECK(std::isfinite(f.theta) && f.theta > 0, op, ": theta must be finite and > 0, got ",
             f.theta);
  v.p.theta.log2_theta = std::log2(f.theta);
  if (!f.llama3) return;
  const Llama3RopeScaling& s = *f.llama3;
  const bool ok = std::isfinite(s.factor) && s.factor > 0 && std::isfinite(s.low_freq_factor) &&
                  s.low_freq_factor > 0 && std::isfinite(s.high_freq_factor) &&
                  s.high_freq_factor > s.low_freq_factor && std::isfinite(s.original_max_position) &&
                  s.original_max_position > 0;
  LLMK_CHECK(ok, op, ": llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor "
             "and original_max_position > 0 (all finite), got factor ", s.factor, ", low ",
             s.low_freq_factor, ", high ", s.high_freq_factor, ", original_max_position ",
             s.original_max_position);
  v.p.theta.factor = s.factor;
  v.p.theta.low_freq_factor = s.low_freq_factor;
  v.p.theta.high_freq_factor = s.high_freq_factor;
  v.p.theta.original_max_position = s.original_max_position;
}

void run(const Validated& v, RopeStyle style, const TensorView& q, cudaStream_t stream) {
  if (v.p.batch * v.p.seq == 0 || v.p.q.heads + v.p.k.heads == 0) return;
  if (v.on_host) return detail::rope_cpu(v.p, style, v.dtype);
  detail::DeviceGuard guard(q.device().index);
  detail::rope_cuda(v.p, style, v.dtype, v.vector_ok, stream);
}

void rope_with_cache(const char* op, float sin_sign, const TensorView& q, const TensorView& k,
                     const TensorView& positions, const TensorView& cache, RopeStyle style,
                     cudaStream_t stream) {
  LLMK_CHECK(cache.ndim() == 2 && cache.size(1) > 0, op,
             ": cos_sin_cache must be [max_pos, rot_dim] with rot_dim > 0");
  Validated v = validate(op, q, k, positions, cache.size(1));
  check_cache(op, v, q, positions, cache);
  v.p.sin_sign = sin_sign;
  run(v, style, q, stream);
}

void rope_with_theta(const char* op, float sin_sign, const TensorView& q, const TensorView& k,
                     const TensorView& positions, const RopeTheta& freqs, RopeStyle style,
                     cudaStream_t stream) {
  LLMK_CHECK(freqs.rot_dim >= 0, op, ": rot_dim must be >= 0 (0: head_dim), got ", freqs.rot_dim);
  Validated v = validate(op, q, k, positions, freqs.rot_dim);
  check_theta(op, v, freqs);
  v.p.sin_sign = sin_sign;
  run(v, style, q, stream);
}

}  // namespace

void rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache("rope", 1.0f, q, k, positions, cos_sin_cache, style, stream);
}

void rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta("rope", 1.0f, q, k, positions, freqs, style, stream);
}

void rope_backward(const TensorView& dq, const TensorView& dk, const TensorView& positions,
                   const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache("rope_backward", -1.0f, dq, dk, positions, cos_sin_cache, style, stream);
}

void rope_backward(const TensorView& dq, const TensorView& dk, const TensorView& positions,
                   const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta("rope_backward", -1.0f, dq, dk, positions, freqs, style, stream);
}

}  // namespace llmk
