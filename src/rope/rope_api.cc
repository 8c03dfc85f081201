// Public entry points of RoPE: validate every argument (a rejected call writes nothing),
// then run the CUDA launcher or the CPU reference.
#include <cmath>
#include <optional>
#include <string>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "rope/rope_params.h"

namespace llmk {

using detail::RopeParams;
using detail::RopeTensor;

namespace {

constexpr int64_t kMaxRotDim = 1024;  // one thread per pair fits a block
constexpr int64_t kMaxHeads = int64_t{1} << 20;

// The public name of the op and of its rotated arguments: the forward rotates q and k,
// the backward their gradients dq and dk by the inverse rotation.
struct RopeOp {
  const char* name;
  const char* q;
  const char* k;
  float sin_sign;
};
constexpr RopeOp kForward{"rope_", "q", "k", 1.0f};
constexpr RopeOp kBackward{"rope_backward_", "dq", "dk", -1.0f};

// q or k: [tokens, heads, head_dim] or [batch, seq, heads, head_dim], last dim contiguous.
RopeTensor check_heads(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(t.ndim() == 3 || t.ndim() == 4, op, ": ", arg,
             " must be [tokens, heads, head_dim] or [batch, seq, heads, head_dim], got ",
             detail::shape_string(t));
  detail::check_float_dtype(op, arg, t);
  LLMK_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", arg,
             " must be contiguous in its last dim, got stride ", t.stride(-1));
  LLMK_CHECK(t.size(-2) <= kMaxHeads, op, ": ", arg, " has ", t.size(-2), " heads, at most ",
             kMaxHeads, " are supported");
  detail::check_element_aligned(op, arg, t);
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
void check_qk_disjoint(const RopeOp& op, const TensorView& q, const TensorView& k) {
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
  LLMK_CHECK(same_tokens && slot > 0 && gap >= first && gap + second <= slot, op.name, ": ",
             op.q, " and ", op.k, " overlap in memory; they must be disjoint (head slices of one "
             "qkv tensor are accepted)");
}

struct Validated {
  RopeParams p;
  DType dtype = DType::f32;
  bool vector_ok = false;
  bool on_host = false;
};

// positions: [tokens] / [batch, seq] (q's leading dims), or [seq] / [1, seq] shared by
// every batch entry; int32 or int64, contiguous.
void check_positions(const RopeOp& op, RopeParams& p, const TensorView& q, const TensorView& positions) {
  const char* name = op.name;
  detail::check_same_device(name, "positions", positions, op.q, q);
  LLMK_CHECK(positions.dtype() == DType::i32 || positions.dtype() == DType::i64, name,
             ": positions must be int32 or int64, got ", dtype_name(positions.dtype()));
  const bool full = positions.ndim() == q.ndim() - 2 &&
                    (positions.ndim() == 1 ? positions.size(0) == p.seq
                                           : positions.size(0) == p.batch && positions.size(1) == p.seq);
  const bool shared = q.ndim() == 4 && ((positions.ndim() == 1 && positions.size(0) == p.seq) ||
                                        (positions.ndim() == 2 && positions.size(0) == 1 &&
                                         positions.size(1) == p.seq));
  const std::string leading = detail::dims_string(q.shape(), q.ndim() - 2);
  LLMK_CHECK(full || shared, name, ": positions must have ", op.q, "'s leading dims (",
             q.ndim() == 4 ? "[batch, seq] = " + leading + " or [seq] = [" + std::to_string(p.seq) + "]"
                           : "[tokens] = " + leading,
             "), got ", detail::shape_string(positions));
  LLMK_CHECK(detail::is_contiguous(positions), name, ": positions must be contiguous, got strides ",
             detail::dims_string(positions.strides(), positions.ndim()));
  detail::check_element_aligned(name, "positions", positions);
  p.positions = positions.data();
  p.positions_i64 = positions.dtype() == DType::i64;
  p.positions_batch_stride = positions.ndim() == 2 && positions.size(0) > 1 ? p.seq : 0;
}

// rot_dim 0: the whole head_dim.
Validated validate(const RopeOp& op, const TensorView& q, const std::optional<TensorView>& k,
                   const TensorView& positions, int64_t rot_dim) {
  const char* name = op.name;
  Validated v;
  RopeParams& p = v.p;
  p.q = check_heads(name, op.q, q);
  const int64_t head_dim = q.size(-1);
  if (k) {
    detail::check_same_device(name, op.k, *k, op.q, q);
    detail::check_dtype(name, op.k, *k, q.dtype());
    p.k = check_heads(name, op.k, *k);
    bool same = k->ndim() == q.ndim() && k->size(-1) == head_dim;
    for (int i = 0; same && i < q.ndim() - 2; ++i) same = k->size(i) == q.size(i);
    LLMK_CHECK(same, name, ": ", op.k, " must have ", op.q, "'s leading (token) dims and head_dim ",
               head_dim, ", got ", op.k, " ", detail::shape_string(*k), " and ", op.q, " ",
               detail::shape_string(q));
    check_qk_disjoint(op, q, *k);
  }
  p.batch = q.ndim() == 4 ? q.size(0) : 1;
  p.seq = q.size(-3);

  check_positions(op, p, q, positions);

  if (rot_dim == 0) rot_dim = head_dim;

  LLMK_CHECK(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim <= kMaxRotDim,
             name, ": rot_dim must be even, in [2, min(head_dim = ", head_dim, ", ", kMaxRotDim,
             ")], got ", rot_dim);
  p.rot_dim = static_cast<int>(rot_dim);

  v.dtype = q.dtype();
  v.on_host = !q.is_cuda();
  // The 16-byte vector path: every stride of a dim that is walked is whole vectors.
  const int64_t n = 16 / dtype_size(q.dtype());
  v.vector_ok = (rot_dim / 2) % n == 0;
  for (const TensorView* t : {&q, k ? &*k : nullptr}) {
    if (t == nullptr) continue;
    v.vector_ok = v.vector_ok && detail::is_aligned(t->data(), 16);
    for (int i = 0; i < t->ndim() - 1; ++i)
      v.vector_ok = v.vector_ok && (t->size(i) == 1 || t->stride(i) % n == 0);
  }
  return v;
}

void check_cache(const RopeOp& op, Validated& v, const TensorView& q, const TensorView& positions,
                 const TensorView& cache) {
  const char* name = op.name;
  detail::check_same_device(name, "cos_sin_cache", cache, op.q, q);
  detail::check_dtype(name, "cos_sin_cache", cache, DType::f32);
  LLMK_CHECK(detail::is_contiguous(cache), name, ": cos_sin_cache must be contiguous, got strides ",
             detail::dims_string(cache.strides(), cache.ndim()));
  LLMK_CHECK(detail::is_aligned(cache.data(), 4), name, ": cos_sin_cache data pointer ", cache.data(),
             " is not 4-byte aligned");
  v.p.cache = static_cast<const float*>(cache.data());
  v.p.cache_rows = cache.size(0);
  if (!v.on_host) return;
  // The CPU backend checks every position (on the GPU this would cost a sync).
  const int64_t count = positions.numel();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t pos = v.p.positions_i64 ? static_cast<const int64_t*>(positions.data())[i]
                                          : static_cast<const int32_t*>(positions.data())[i];
    LLMK_CHECK(pos >= 0 && pos < v.p.cache_rows, name, ": position ", pos, " (index ", i,
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

void run(const RopeOp& op, const Validated& v, RopeStyle style, const TensorView& q, cudaStream_t stream) {
  if (v.p.batch * v.p.seq == 0 || v.p.q.heads + v.p.k.heads == 0) return;
  if (v.on_host) return detail::rope_cpu(v.p, style, v.dtype);
  detail::DeviceGuard guard(op.name, op.q, q);
  detail::rope_cuda(v.p, style, v.dtype, v.vector_ok, stream);
}

void rope_with_cache(const RopeOp& op, const TensorView& q, const std::optional<TensorView>& k,
                     const TensorView& positions, const TensorView& cache, RopeStyle style,
                     cudaStream_t stream) {
  LLMK_CHECK(cache.ndim() == 2 && cache.size(1) > 0, op.name,
             ": cos_sin_cache must be [max_pos, rot_dim] with rot_dim > 0, got ",
             detail::shape_string(cache));
  Validated v = validate(op, q, k, positions, cache.size(1));
  check_cache(op, v, q, positions, cache);
  v.p.sin_sign = op.sin_sign;
  run(op, v, style, q, stream);
}

void rope_with_theta(const RopeOp& op, const TensorView& q, const std::optional<TensorView>& k,
                     const TensorView& positions, const RopeTheta& freqs, RopeStyle style,
                     cudaStream_t stream) {
  LLMK_CHECK(freqs.rot_dim >= 0, op.name, ": rot_dim must be >= 0 (0: head_dim), got ", freqs.rot_dim);
  Validated v = validate(op, q, k, positions, freqs.rot_dim);
  check_theta(op.name, v, freqs);
  v.p.sin_sign = op.sin_sign;
  run(op, v, style, q, stream);
}

}  // namespace

void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kForward, q, k, positions, cos_sin_cache, style, stream);
}

void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kForward, q, k, positions, freqs, style, stream);
}

void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk, const TensorView& positions,
                    const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kBackward, dq, dk, positions, cos_sin_cache, style, stream);
}

void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk, const TensorView& positions,
                    const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kBackward, dq, dk, positions, freqs, style, stream);
}

}  // namespace llmk
