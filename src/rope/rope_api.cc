// Public entry points of RoPE, in place and out of place: validate every argument (a
// rejected call writes nothing), then run the CUDA launcher or the CPU reference.
#include <cmath>
#include <optional>
#include <string>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "rope/rope_params.h"

namespace llmk {

using detail::RopeParams;
using detail::HeadStrides;
using detail::RopeTensor;

namespace {

constexpr int64_t kMaxRotDim = 1024;  // one thread per pair fits a block
constexpr int64_t kMaxHeads = int64_t{1} << 20;
// Out of place with a tail: ceil(head_dim / 2) threads (one-element vectors) fit a block.
constexpr int64_t kMaxOutOfPlaceHeadDim = 2048;

// The public name of the op and of its arguments: the forward rotates q and k, the
// backward their gradients dq and dk by the inverse rotation; in place the outputs are the
// inputs (and carry their names), out of place they are q_out and k_out.
struct RopeOp {
  const char* name;
  const char* q;
  const char* k;
  const char* q_out;
  const char* k_out;
  float sin_sign;
  bool in_place;
};
constexpr RopeOp kForward{"rope_", "q", "k", "q", "k", 1.0f, true};
constexpr RopeOp kBackward{"rope_backward_", "dq", "dk", "dq", "dk", -1.0f, true};
constexpr RopeOp kForwardOut{"rope", "q", "k", "q_out", "k_out", 1.0f, false};
constexpr RopeOp kBackwardOut{"rope_backward", "dq", "dk", "dq_out", "dk_out", -1.0f, false};

// The rotated tensors of a call; in place the outputs are the inputs.
struct RopeArgs {
  const TensorView& q;
  const std::optional<TensorView>& k;
  const TensorView& q_out;
  const std::optional<TensorView>& k_out;
};

// q, k or an output: [tokens, heads, head_dim] or [batch, seq, heads, head_dim], last dim
// contiguous. A tensor that is written must not have elements that share memory; one that
// is only read may (a stride of 0), its strides non-negative.
void check_heads(const char* op, const char* arg, const TensorView& t, bool written) {
  LLMK_CHECK(t.ndim() == 3 || t.ndim() == 4, op, ": ", arg,
             " must be [tokens, heads, head_dim] or [batch, seq, heads, head_dim], got ",
             detail::shape_string(t));
  detail::check_float_dtype(op, arg, t);
  LLMK_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", arg,
             " must be contiguous in its last dim, got stride ", t.stride(-1));
  LLMK_CHECK(t.size(-2) <= kMaxHeads, op, ": ", arg, " has ", t.size(-2), " heads, at most ",
             kMaxHeads, " are supported");
  detail::check_element_aligned(op, arg, t);
  if (written) return detail::check_no_self_overlap(op, arg, t);
  for (int i = 0; i < t.ndim(); ++i)
    LLMK_CHECK(t.stride(i) >= 0, op, ": ", arg, " has a negative stride in dim ", i);
}

HeadStrides head_strides(const TensorView& t) {
  return {t.ndim() == 4 ? t.stride(0) : 0, t.stride(-3), t.stride(-2)};
}

RopeTensor rope_tensor(const TensorView& in, const TensorView& out) {
  RopeTensor r;
  r.in = in.data();
  r.out = out.data();
  r.heads = static_cast<int>(in.size(-2));
  r.in_strides = head_strides(in);
  r.out_strides = head_strides(out);
  return r;
}

// a (written) and b (another tensor of the call, with a's leading dims) do not share
// memory: their spans do not meet, or they are head slices of one fused tensor (equal
// token strides, each token's b heads beside its a heads: q and k of a fused qkv).
void check_disjoint(const char* op, const char* a_arg, const TensorView& a, const char* b_arg,
                    const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return;
  const int64_t elem = dtype_size(a.dtype());
  const detail::ByteSpan as = detail::byte_span(a), bs = detail::byte_span(b);
  if (as.last <= bs.first || bs.last <= as.first) return;
  // Token slots: the smallest token-dim stride, which every token stride is a multiple of.
  int64_t slot = 0;
  bool same_tokens = true;
  for (int i = 0; i < a.ndim() - 2; ++i) {
    if (a.size(i) == 1) continue;
    same_tokens = same_tokens && a.stride(i) == b.stride(i);
    if (slot == 0 || a.stride(i) < slot) slot = a.stride(i);
  }
  for (int i = 0; i < a.ndim() - 2; ++i)
    same_tokens = same_tokens && (a.size(i) == 1 || (slot > 0 && a.stride(i) % slot == 0));
  auto footprint = [](const TensorView& t) { return (t.size(-2) - 1) * t.stride(-2) + t.size(-1); };
  const bool b_after = bs.first >= as.first;
  const int64_t gap = static_cast<int64_t>(b_after ? bs.first - as.first : as.first - bs.first) / elem;
  const int64_t first = footprint(b_after ? a : b), second = footprint(b_after ? b : a);
  LLMK_CHECK(same_tokens && slot > 0 && gap >= first && gap + second <= slot, op, ": ", a_arg,
             " and ", b_arg, " overlap in memory; they must be disjoint (head slices of one "
             "qkv tensor are accepted)");
}

// An output of the out-of-place op: its input's shape, dtype and device.
void check_output(const RopeOp& op, const char* arg, const TensorView& out, const char* in_arg,
                  const TensorView& in) {
  detail::check_same_device(op.name, arg, out, in_arg, in);
  detail::check_dtype(op.name, arg, out, in.dtype());
  detail::check_same_shape(op.name, arg, out, in_arg, in);
  check_heads(op.name, arg, out, true);
}

// Every written tensor is disjoint from every other tensor of the call, except an output
// that is exactly its own input (then rotated in place). In place that is q against k.
void check_overlaps(const RopeOp& op, const RopeArgs& t) {
  if (t.k) check_disjoint(op.name, op.q_out, t.q_out, op.k, *t.k);
  if (op.in_place) return;
  if (!detail::same_view(t.q_out, t.q)) check_disjoint(op.name, op.q_out, t.q_out, op.q, t.q);
  if (!t.k) return;
  check_disjoint(op.name, op.k_out, *t.k_out, op.q, t.q);
  check_disjoint(op.name, op.q_out, t.q_out, op.k_out, *t.k_out);
  if (!detail::same_view(*t.k_out, *t.k)) check_disjoint(op.name, op.k_out, *t.k_out, op.k, *t.k);
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

// rot_dim 0: the whole head_dim. `rot_dim_from` names where rot_dim came from in errors
// ("rot_dim", or the cos_sin_cache's width).
Validated validate(const RopeOp& op, const RopeArgs& t, const TensorView& positions, int64_t rot_dim,
                   const char* rot_dim_from) {
  const char* name = op.name;
  const TensorView& q = t.q;
  const std::optional<TensorView>& k = t.k;
  Validated v;
  RopeParams& p = v.p;
  check_heads(name, op.q, q, op.in_place);
  const int64_t head_dim = q.size(-1);
  if (k) {
    detail::check_same_device(name, op.k, *k, op.q, q);
    detail::check_dtype(name, op.k, *k, q.dtype());
    check_heads(name, op.k, *k, op.in_place);
    bool same = k->ndim() == q.ndim() && k->size(-1) == head_dim;
    for (int i = 0; same && i < q.ndim() - 2; ++i) same = k->size(i) == q.size(i);
    LLMK_CHECK(same, name, ": ", op.k, " must have ", op.q, "'s leading (token) dims and head_dim ",
               head_dim, ", got ", op.k, " ", detail::shape_string(*k), " and ", op.q, " ",
               detail::shape_string(q));
  }
  if (!op.in_place) {
    LLMK_CHECK(t.k_out.has_value() == k.has_value(), name, ": ", op.k_out, " must be given exactly when ",
               op.k, " is (", op.k, " ", k ? "given" : "absent", ", ", op.k_out, " ",
               t.k_out ? "given" : "absent", ")");
    check_output(op, op.q_out, t.q_out, op.q, q);
    if (k) check_output(op, op.k_out, *t.k_out, op.k, *k);
  }
  check_overlaps(op, t);
  p.q = rope_tensor(q, t.q_out);
  if (k) p.k = rope_tensor(*k, *t.k_out);
  p.batch = q.ndim() == 4 ? q.size(0) : 1;
  p.seq = q.size(-3);

  check_positions(op, p, q, positions);

  if (rot_dim == 0) rot_dim = head_dim;

  LLMK_CHECK(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim <= kMaxRotDim,
             name, ": ", rot_dim_from, " must be even, in [2, min(head_dim = ", head_dim, ", ", kMaxRotDim,
             ")], got ", rot_dim);
  p.rot_dim = static_cast<int>(rot_dim);

  v.dtype = q.dtype();
  v.on_host = !q.is_cuda();
  // The 16-byte vector path: every stride of a dim that is walked is whole vectors.
  const int64_t n = 16 / dtype_size(q.dtype());
  // The tail [rot_dim, head_dim) is written unless every output is its own input. One
  // block covers a token's head: a thread per pair chunk and per two tail vectors.
  const bool all_in_place = detail::same_view(t.q_out, q) && (!k || detail::same_view(*t.k_out, *k));
  const int64_t tail = all_in_place ? 0 : head_dim - rot_dim;
  LLMK_CHECK(tail == 0 || head_dim <= kMaxOutOfPlaceHeadDim, name, ": head_dim ", head_dim,
             " with rot_dim ", rot_dim, " is more than the ", kMaxOutOfPlaceHeadDim,
             " out of place supports when the elements past rot_dim are copied");
  p.tail = static_cast<int>(tail);
  v.vector_ok = (rot_dim / 2) % n == 0 && tail % n == 0;
  for (const TensorView* x : {&q, k ? &*k : nullptr, &t.q_out, t.k_out ? &*t.k_out : nullptr}) {
    if (x == nullptr) continue;
    v.vector_ok = v.vector_ok && detail::is_aligned(x->data(), 16);
    for (int i = 0; i < x->ndim() - 1; ++i)
      v.vector_ok = v.vector_ok && (x->size(i) == 1 || x->stride(i) % n == 0);
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

void rope_with_cache(const RopeOp& op, const RopeArgs& t, const TensorView& positions, const TensorView& cache,
                     RopeStyle style, cudaStream_t stream) {
  LLMK_CHECK(cache.ndim() == 2 && cache.size(1) > 0, op.name,
             ": cos_sin_cache must be [max_pos, rot_dim] with rot_dim > 0, got ",
             detail::shape_string(cache));
  Validated v = validate(op, t, positions, cache.size(1), "cos_sin_cache's width (rot_dim)");
  check_cache(op, v, t.q, positions, cache);
  v.p.sin_sign = op.sin_sign;
  run(op, v, style, t.q, stream);
}

void rope_with_theta(const RopeOp& op, const RopeArgs& t, const TensorView& positions, const RopeTheta& freqs,
                     RopeStyle style, cudaStream_t stream) {
  LLMK_CHECK(freqs.rot_dim >= 0, op.name, ": rot_dim must be >= 0 (0: head_dim), got ", freqs.rot_dim);
  Validated v = validate(op, t, positions, freqs.rot_dim, "rot_dim");
  check_theta(op.name, v, freqs);
  v.p.sin_sign = op.sin_sign;
  run(op, v, style, t.q, stream);
}

}  // namespace

void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kForward, {q, k, q, k}, positions, cos_sin_cache, style, stream);
}

void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kForward, {q, k, q, k}, positions, freqs, style, stream);
}

void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk, const TensorView& positions,
                    const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kBackward, {dq, dk, dq, dk}, positions, cos_sin_cache, style, stream);
}

void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk, const TensorView& positions,
                    const RopeTheta& freqs, RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kBackward, {dq, dk, dq, dk}, positions, freqs, style, stream);
}

void rope(const TensorView& q_out, const std::optional<TensorView>& k_out, const TensorView& q,
          const std::optional<TensorView>& k, const TensorView& positions, const TensorView& cos_sin_cache,
          RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kForwardOut, {q, k, q_out, k_out}, positions, cos_sin_cache, style, stream);
}

void rope(const TensorView& q_out, const std::optional<TensorView>& k_out, const TensorView& q,
          const std::optional<TensorView>& k, const TensorView& positions, const RopeTheta& freqs,
          RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kForwardOut, {q, k, q_out, k_out}, positions, freqs, style, stream);
}

void rope_backward(const TensorView& dq_out, const std::optional<TensorView>& dk_out, const TensorView& dq,
                   const std::optional<TensorView>& dk, const TensorView& positions,
                   const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream) {
  rope_with_cache(kBackwardOut, {dq, dk, dq_out, dk_out}, positions, cos_sin_cache, style, stream);
}

void rope_backward(const TensorView& dq_out, const std::optional<TensorView>& dk_out, const TensorView& dq,
                   const std::optional<TensorView>& dk, const TensorView& positions, const RopeTheta& freqs,
                   RopeStyle style, cudaStream_t stream) {
  rope_with_theta(kBackwardOut, {dq, dk, dq_out, dk_out}, positions, freqs, style, stream);
}

}  // namespace llmk
