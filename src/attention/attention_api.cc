// Public entry points of the attention forward and backward: validate every argument (a
// rejected call writes nothing), then run the CUDA launchers or the CPU references.
#include <climits>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "attention/attention_params.h"
#include "common/attention_options.h"
#include "common/cuda_check.h"
#include "common/rows.h"
#include "llmk/attention.h"

namespace llmk {

using detail::AttentionParams;
using detail::AttentionTensor;

namespace {

constexpr int64_t kMaxGridDim = 65535;  // heads and batch are gridDim.y and gridDim.z


// q, k, v or out: [batch, seq, heads, head_dim] (`packed`: [tokens, heads, head_dim]) in
// fp16 or bf16, the head dim contiguous, every row 16-byte aligned (the kernel moves rows
// in 16-byte pieces).
AttentionTensor check_heads(const char* op, const char* arg, const TensorView& t, bool packed) {
  const int ndim = packed ? 3 : 4;
  LLMK_CHECK(t.ndim() == ndim, op, ": ", arg, " must be ",
             packed ? "[total_tokens, heads, head_dim]" : "[batch, seq, heads, head_dim]", ", got ",
             detail::shape_string(t));
  LLMK_CHECK(t.dtype() == DType::f16 || t.dtype() == DType::bf16, op, ": ", arg,
             " must be float16 or bfloat16, got ", dtype_name(t.dtype()));
  LLMK_CHECK(detail::head_dim_supported(t.size(-1)), op, ": ", arg, " has head_dim ", t.size(-1),
             "; supported head dims are ", detail::head_dim_words(attention_head_dims()));
  LLMK_CHECK(t.stride(-1) == 1, op, ": ", arg, " must be contiguous in its last (head_dim) dim, got stride ",
             t.stride(-1));
  LLMK_CHECK(detail::is_aligned(t.data(), 16), op, ": ", arg, " data pointer ", t.data(),
             " is not 16-byte aligned");
  for (int i = 0; i < ndim - 1; ++i) {
    LLMK_CHECK(t.stride(i) >= 0 && (t.size(i) == 1 || t.stride(i) % 8 == 0), op, ": ", arg,
               " stride ", t.stride(i), " of dim ", i,
               " must be a non-negative multiple of 8 elements (16-byte aligned rows)");
  }
  AttentionTensor a;
  a.data = t.data();
  a.batch_stride = packed ? 0 : t.stride(0);
  a.row_stride = t.stride(-3);
  a.head_stride = t.stride(-2);
  return a;
}

void check_size(const char* op, const char* what, int64_t value, int64_t limit) {
  LLMK_CHECK(value >= 0 && value <= limit, op, ": ", what, " is ", value, ", at most ", limit,
             " is supported");
}

struct Validated {
  AttentionParams p;
  DType dtype = DType::f16;
  bool on_host = false;
  bool empty = false;  // nothing to compute or write
};

// The checks shared by the dense and varlen entry points; `packed` selects the layout.
Validated validate(const char* op, const TensorView& out, const TensorView& q, const TensorView& k,
                   const TensorView& v, bool causal, double scale, const AttentionOptions& options,
                   const std::optional<TensorView>& lse, bool packed) {
  Validated r;
  AttentionParams& p = r.p;
  p.q = check_heads(op, "q", q, packed);
  p.k = check_heads(op, "k", k, packed);
  p.v = check_heads(op, "v", v, packed);
  p.out = check_heads(op, "out", out, packed);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"k", &k}, {"v", &v}, {"out", &out}}) {
    detail::check_same_device(op, arg, *t, "q", q);
    detail::check_dtype(op, arg, *t, q.dtype());
  }
  detail::check_same_shape(op, "out", out, "q", q);
  detail::check_same_shape(op, "v", v, "k", k);
  const int seq_dim = packed ? 0 : 1;
  LLMK_CHECK(packed || k.size(0) == q.size(0), op, ": k has batch ", k.size(0), ", q has ", q.size(0));
  LLMK_CHECK(k.size(-1) == q.size(-1), op, ": k and v have head_dim ", k.size(-1), ", q has ",
             q.size(-1), "; they must match");
  const int64_t heads_q = q.size(-2), heads_kv = k.size(-2);
  LLMK_CHECK((heads_q == 0 && heads_kv == 0) || (heads_kv > 0 && heads_q % heads_kv == 0), op,
             ": heads_q (", heads_q, ") must be a multiple of heads_kv (", heads_kv, ")");
  check_size(op, "heads_q", heads_q, kMaxGridDim);
  check_size(op, "seq_q", q.size(seq_dim), INT_MAX / 2);
  check_size(op, "seq_k", k.size(seq_dim), INT_MAX / 2);
  LLMK_CHECK(std::isfinite(scale) && scale > 0, op, ": scale must be finite and > 0, got ", scale);
  if (out.numel() > 0) detail::check_no_self_overlap(op, "out", out);  // an empty tensor shares nothing
  detail::check_no_overlap(op, "out", out, "q", q, false);
  detail::check_no_overlap(op, "out", out, "k", k, false);
  detail::check_no_overlap(op, "out", out, "v", v, false);

  if (lse) {
    detail::check_same_device(op, "lse", *lse, "q", q);
    detail::check_dtype(op, "lse", *lse, DType::f32);
    const std::vector<int64_t> want = packed ? std::vector<int64_t>{heads_q, q.size(0)}
                                             : std::vector<int64_t>{q.size(0), heads_q, q.size(1)};
    bool same = lse->ndim() == static_cast<int>(want.size());
    for (size_t i = 0; same && i < want.size(); ++i) same = lse->size(static_cast<int>(i)) == want[i];
    LLMK_CHECK(same, op, ": lse must be float32 ", packed ? "[heads_q, total_q]" : "[batch, heads_q, seq_q]",
               " = ", detail::dims_string(want.data(), static_cast<int>(want.size())), ", got ",
               detail::shape_string(*lse));
    LLMK_CHECK(lse->numel() == 0 || detail::is_contiguous(*lse), op, ": lse must be contiguous, got strides ",
               detail::dims_string(lse->strides(), lse->ndim()));
    LLMK_CHECK(detail::is_aligned(lse->data(), 4), op, ": lse data pointer ", lse->data(),
               " is not 4-byte aligned");
    for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
      detail::check_no_overlap(op, "lse", *lse, arg, *t, false);
    p.lse = static_cast<float*>(lse->data());
    p.lse_head_stride = packed ? q.size(0) : q.size(1);
    p.lse_batch_stride = packed ? 0 : heads_q * q.size(1);
  }

  p.heads_q = static_cast<int>(heads_q);
  p.group = heads_kv > 0 ? static_cast<int>(heads_q / heads_kv) : 1;
  p.head_dim = static_cast<int>(q.size(-1));
  p.causal = causal;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  LLMK_CHECK(p.scale > 0 && std::isfinite(p.scale_log2), op, ": scale ", scale,
             " is out of float range");
  p.variants = detail::check_attention_options(op, options, q, causal);
  if (options.sinks) {
    detail::check_no_overlap(op, "out", out, "sinks", *options.sinks, false);
    if (lse) detail::check_no_overlap(op, "lse", *lse, "sinks", *options.sinks, false);
  }
  r.dtype = q.dtype();
  r.on_host = !q.is_cuda();
  return r;
}

void execute(const char* op, Validated& r, const TensorView& q, cudaStream_t stream) {
  if (r.empty) return;
  if (r.on_host) return detail::attention_forward_cpu(r.p, r.dtype);
  LLMK_CHECK(detail::head_dim_compiled(r.p.head_dim), op, ": head_dim ", r.p.head_dim,
             " has no CUDA kernel in this build (CMake option LLMK_HEAD_DIMS)");
  detail::DeviceGuard guard(op, "q", q);
  detail::attention_forward_cuda(r.p, r.dtype, stream);
}

// cu_seqlens: int32 [batch + 1], contiguous, on q's device.
const int32_t* check_cu_seqlens(const char* op, const char* arg, const TensorView& cu, const TensorView& q,
                                int64_t batch) {
  detail::check_same_device(op, arg, cu, "q", q);
  detail::check_dtype(op, arg, cu, DType::i32);
  LLMK_CHECK(cu.ndim() == 1 && cu.size(0) == batch + 1, op, ": ", arg,
             " must be int32 [batch + 1] = [", batch + 1, "], got ", detail::shape_string(cu));
  LLMK_CHECK(detail::is_contiguous(cu), op, ": ", arg, " must be contiguous, got stride ", cu.stride(0));
  LLMK_CHECK(detail::is_aligned(cu.data(), 4), op, ": ", arg, " data pointer ", cu.data(),
             " is not 4-byte aligned");
  return static_cast<const int32_t*>(cu.data());
}

// The CPU backend checks the caller's contract that the GPU cannot check without a sync.
void check_host_cu_seqlens(const char* op, const char* arg, const int32_t* cu, int64_t batch, int64_t total,
                           int64_t max_seqlen) {
  LLMK_CHECK(cu[0] == 0, op, ": ", arg, "[0] must be 0, got ", cu[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t{cu[b + 1]} - cu[b];
    LLMK_CHECK(len >= 0, op, ": ", arg, " decreases at index ", b + 1, " (", cu[b], " -> ", cu[b + 1], ")");
    LLMK_CHECK(len <= max_seqlen, op, ": sequence ", b, " has length ", len, " in ", arg,
               ", more than its max_seqlen ", max_seqlen);
  }
  LLMK_CHECK(cu[batch] == total, op, ": ", arg, "[batch] = ", cu[batch], " must equal the ", total,
             " packed rows");
}

// Dense batches: [batch, seq, heads, dim].
void set_dense(const char* op, Validated& r, const TensorView& q, const TensorView& k) {
  check_size(op, "batch", q.size(0), kMaxGridDim);
  r.p.batch = static_cast<int>(q.size(0));
  r.p.seqlen_q = static_cast<int>(q.size(1));
  r.p.seqlen_k = static_cast<int>(k.size(1));
  r.empty = q.numel() == 0;
}

// Packed batches: [total, heads, dim] with cu_seqlens; the host backend checks the contract.
void set_varlen(const char* op, Validated& r, const TensorView& q, const TensorView& k,
                const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                int64_t max_seqlen_k) {
  LLMK_CHECK(cu_seqlens_q.ndim() == 1 && cu_seqlens_q.size(0) >= 1, op,
             ": cu_seqlens_q must be int32 [batch + 1], got ", detail::shape_string(cu_seqlens_q));
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  check_size(op, "batch", batch, kMaxGridDim);
  r.p.cu_seqlens_q = check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q, batch);
  r.p.cu_seqlens_k = check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, q, batch);
  check_size(op, "max_seqlen_q", max_seqlen_q, INT_MAX / 2);
  check_size(op, "max_seqlen_k", max_seqlen_k, INT_MAX / 2);
  r.p.batch = static_cast<int>(batch);
  r.p.seqlen_q = static_cast<int>(max_seqlen_q);
  r.p.seqlen_k = static_cast<int>(max_seqlen_k);
  r.p.total_q = q.size(0);
  r.p.total_k = k.size(0);
  // Cheap checks of the contract: batch sequences of at most max_seqlen must hold every row.
  LLMK_CHECK(batch * max_seqlen_q >= q.size(0) && batch * max_seqlen_k >= k.size(0), op, ": ", batch,
             " sequences of at most max_seqlen_q = ", max_seqlen_q, " / max_seqlen_k = ", max_seqlen_k,
             " cannot hold the ", q.size(0), " / ", k.size(0), " packed q / k rows");
  if (r.on_host) {
    check_host_cu_seqlens(op, "cu_seqlens_q", r.p.cu_seqlens_q, batch, q.size(0), max_seqlen_q);
    check_host_cu_seqlens(op, "cu_seqlens_k", r.p.cu_seqlens_k, batch, k.size(0), max_seqlen_k);
  }
  r.empty = batch == 0 || max_seqlen_q == 0 || q.numel() == 0;
}

// The backward's checks beyond the forward's (validate() took q, k, v, out as the forward
// does and lse as optional): lse present, dout like q, dq like q, dk and dv like k, the three
// outputs overlapping nothing; on the GPU, the workspace. Then the forward's shape setup
// (`shapes`), and the launch.
template <class SetShapes>
void backward(const char* op, const TensorView& dq, const TensorView& dk, const TensorView& dv,
              const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, bool causal, double scale, const AttentionOptions& options,
              const std::optional<TensorView>& dsinks, bool deterministic, const std::optional<TensorView>& workspace,
              cudaStream_t stream, bool packed, SetShapes&& shapes) {
  Validated r = validate(op, out, q, k, v, causal, scale, options, lse, packed);
  detail::AttentionBackwardParams b;
  b.dout = check_heads(op, "dout", dout, packed);
  b.dq = check_heads(op, "dq", dq, packed);
  b.dk = check_heads(op, "dk", dk, packed);
  b.dv = check_heads(op, "dv", dv, packed);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"dout", &dout}, {"dq", &dq}, {"dk", &dk},
                               {"dv", &dv}}) {
    detail::check_same_device(op, arg, *t, "q", q);
    detail::check_dtype(op, arg, *t, q.dtype());
  }
  detail::check_same_shape(op, "dout", dout, "q", q);
  detail::check_same_shape(op, "dq", dq, "q", q);
  detail::check_same_shape(op, "dk", dk, "k", k);
  detail::check_same_shape(op, "dv", dv, "k", k);
  using Arg = std::pair<const char*, const TensorView*>;
  const Arg outputs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  const Arg inputs[] = {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}};
  for (int i = 0; i < 3; ++i) {
    if (outputs[i].second->numel() > 0) detail::check_no_self_overlap(op, outputs[i].first, *outputs[i].second);
    for (int j = i + 1; j < 3; ++j)
      detail::check_no_overlap(op, outputs[i].first, *outputs[i].second, outputs[j].first, *outputs[j].second,
                               false);
    for (const auto& [arg, t] : inputs)
      detail::check_no_overlap(op, outputs[i].first, *outputs[i].second, arg, *t, false);
  }
  if (dsinks) {
    LLMK_CHECK(options.sinks.has_value(), op, ": dsinks was given without sinks (the gradient of nothing)");
    b.dsinks = detail::check_head_vector(op, "dsinks", *dsinks, q);
    for (const Arg& a : outputs) detail::check_no_overlap(op, "dsinks", *dsinks, a.first, *a.second, false);
    for (const Arg& a : inputs) detail::check_no_overlap(op, "dsinks", *dsinks, a.first, *a.second, false);
    detail::check_no_overlap(op, "dsinks", *dsinks, "sinks", *options.sinks, false);
  }
  // Before any work: the sinks' gradient is the CPU backend's (on the GPU, compute it from out
  // and lse: -sum over a head's rows of exp(sink - lse) rowsum(dout * out), as llmk's autograd does).
  LLMK_CHECK(r.on_host || !dsinks, op, ": dsinks is computed by the CPU backend only; on the GPU compute it from out "
             "and lse (-sum over a head's rows of exp(sink - lse) * rowsum(dout * out))");
  shapes(r);
  b.fwd = r.p;
  b.heads_kv = static_cast<int>(k.size(-2));
  if (b.dsinks && q.numel() == 0)  // no rows: a zero gradient
    for (int64_t h = 0; h < q.size(-2); ++h) b.dsinks[h] = 0.0f;
  if (q.numel() == 0 && k.numel() == 0) return;
  if (r.on_host) return detail::attention_backward_cpu(b, r.dtype);
  LLMK_CHECK(detail::head_dim_compiled(r.p.head_dim), op, ": head_dim ", r.p.head_dim,
             " has no CUDA kernel in this build (CMake option LLMK_HEAD_DIMS)");
  const int64_t q_rows = packed ? q.size(0) : q.size(0) * q.size(1);
  const int64_t needed = attention_backward_workspace_size(q_rows, q.size(-2), q.size(-1));
  if (workspace) detail::check_same_device(op, "workspace", *workspace, "q", q);
  detail::check_workspace(op, workspace, q, needed, "attention_backward_workspace_size");
  for (const Arg& a : outputs) detail::check_no_overlap(op, "workspace", *workspace, a.first, *a.second, false);
  for (const Arg& a : inputs) detail::check_no_overlap(op, "workspace", *workspace, a.first, *a.second, false);
  float* ws = static_cast<float*>(workspace->data());
  // [dq accumulator: q_rows x heads x D][D: q_rows x heads][2 counters per (row, head)]; the
  // sm_80 path uses the accumulator and D, its deterministic form D alone
  // (attention_backward_cuda).
  const int64_t row_heads = q_rows * q.size(-2);
  b.dq_accum = ws;
  b.delta = ws + row_heads * q.size(-1);
  b.dq_counters = reinterpret_cast<int*>(b.delta + row_heads);
  b.dq_ordered = deterministic;
  detail::DeviceGuard guard(op, "q", q);
  detail::attention_backward_cuda(b, r.dtype, stream);
}

}  // namespace

std::vector<int64_t> attention_head_dims() {
  return detail::head_dims_where([](int64_t d) { return detail::head_dim_supported(d); });
}

bool attention_head_dim_compiled(int64_t head_dim) { return detail::head_dim_compiled(head_dim); }

std::vector<int64_t> attention_sm90_head_dims() {
  return detail::head_dims_where([](int64_t d) { return detail::attention_sm90_head_dim(d); });
}

void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
               bool causal, double scale, const std::optional<TensorView>& lse, cudaStream_t stream) {
  attention(out, q, k, v, causal, scale, AttentionOptions{}, lse, stream);
}

void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
               double scale, const AttentionOptions& options, const std::optional<TensorView>& lse,
               cudaStream_t stream) {
  const char* op = "attention";
  Validated r = validate(op, out, q, k, v, causal, scale, options, lse, false);
  set_dense(op, r, q, k);
  execute(op, r, q, stream);
}

void attention_varlen(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, bool causal, double scale, const std::optional<TensorView>& lse,
                      cudaStream_t stream) {
  attention_varlen(out, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                   AttentionOptions{}, lse, stream);
}

void attention_varlen(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, bool causal, double scale, const AttentionOptions& options,
                      const std::optional<TensorView>& lse, cudaStream_t stream) {
  const char* op = "attention_varlen";
  Validated r = validate(op, out, q, k, v, causal, scale, options, lse, true);
  set_varlen(op, r, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  execute(op, r, q, stream);
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, bool causal, double scale, bool deterministic,
                        const std::optional<TensorView>& workspace, cudaStream_t stream) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, causal, scale, AttentionOptions{}, std::nullopt,
                     deterministic, workspace, stream);
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, bool causal, double scale, const AttentionOptions& options,
                        const std::optional<TensorView>& dsinks, bool deterministic,
                        const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const char* op = "attention_backward";
  backward(op, dq, dk, dv, dout, q, k, v, out, lse, causal, scale, options, dsinks, deterministic, workspace, stream,
           false, [&](Validated& r) { set_dense(op, r, q, k); });
}

void attention_varlen_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                               bool causal, double scale, bool deterministic,
                               const std::optional<TensorView>& workspace, cudaStream_t stream) {
  attention_varlen_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, causal, scale, AttentionOptions{}, std::nullopt, deterministic, workspace,
                            stream);
}

void attention_varlen_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                               bool causal, double scale, const AttentionOptions& options,
                               const std::optional<TensorView>& dsinks, bool deterministic,
                               const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const char* op = "attention_varlen_backward";
  backward(op, dq, dk, dv, dout, q, k, v, out, lse, causal, scale, options, dsinks, deterministic, workspace, stream,
           true,
           [&](Validated& r) { set_varlen(op, r, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k); });
}

int64_t attention_backward_workspace_size(int64_t q_rows, int64_t heads_q, int64_t head_dim) {
  LLMK_CHECK(q_rows >= 0 && heads_q >= 0 && head_dim >= 0, "attention_backward_workspace_size: negative size (",
             q_rows, ", ", heads_q, ", ", head_dim, ")");
  return q_rows * heads_q * (1 + head_dim + 2);
}

}  // namespace llmk
