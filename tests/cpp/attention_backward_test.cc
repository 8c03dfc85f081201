// Attention backward (attention_backward, attention_varlen_backward): the CPU reference
// against hand values, against central differences of a double forward, and against this
// file's own double oracle; the CUDA kernels (default and deterministic) against the oracle
// over dtypes, head dims, causal and not, seq_q != seq_k with fully masked rows, no keys and
// no queries, lengths around the tiles, GQA group sizes 1-8 and MQA, transposed, strided and
// fused-qkv layouts (NaN gaps in the gradients' storage stay NaN), variable-length batches
// with empty sequences; deterministic runs bitwise equal; bad inputs and workspaces.
//
// Each GPU case runs the forward and the backward on every path of LLMK_ATTENTION_PATH (sm80,
// sm90, auto; the Hopper forward and backward must take head dims 64, 96, 128 and 256) and
// feeds the backward that path's out and lse; the oracle is recomputed from them.
//
// Tolerance. The oracle gives each gradient element its reference value r and the absolute
// and root-sum-square sizes of the terms it sums (A = sum |t|, R = sqrt(sum t^2), t = P dout
// for dv, dS q scale for dk, dS k scale for dq). The kernels round P and dS to the dtype
// (relative error <= u, the unit roundoff: 2^-8 bf16, 2^-11 fp16) before the GEMMs that
// produce dv, dk and dq, and round the output once: |got - r| <= u (A + |r|) bounds the
// error; the rounding errors are independent, so it is also near u R / sqrt(3). Below that,
// the float32 arithmetic: dP = dout . v and D = dout . out, each a float sum (in different
// orders), carry rounding of order 2^-24 of the sums of their products' magnitudes, which
// survives in dS = P (dP - D) when dP and D cancel, even where both are near 0 (one key, dout
// nearly orthogonal to its v: on the H100, fp16 300 x 127 causal d 128, dq of the first row
// that sees a key was 2e-7 against a reference of 0, 2x a bound that sized this by |dP| + |D|
// = 1.3e-4 while sum |dout_c v_c| = 72.6). So F sums the terms' float32 sizes, dS's taken as
// P (sum_c |dout_c v_c| + sum_c |dout_c out_c|) (F >= A). A case passes when
// |got - r| <= 2 u |r| + min(2 u A, 8 u R) + 1e-6 F (+ 2 subnormal steps of fp16): the R term
// keeps the test sensitive on long rows, where A grows like the length and R like its square
// root; 1e-6 F (16 float roundings of F) stays under 1e-4 of max|dq| (~2e-5 measured), so an
// error of 1e-3 max|dq| in a cancelling row still fails (AttentionBackwardCpu.
// BoundCoversFloatCancellationAndStillCatchesErrors checks that, and that a model of the
// kernels' float arithmetic passes). The CPU backend (double, one rounding) must be within
// 1.01 u |r| + 1e-9 F (+ 1 subnormal step).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"

namespace llmk::test {
namespace {

// LLMK_TEST_SEED=<seed> replays a run: the random inputs come from that seed instead of a
// fresh one (the seed a run printed, "[llmk test] random seed N"; ctest runs each test in a
// process of its own, so one test with --gtest_filter draws what it drew there).
class SeedFromEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    const char* seed = std::getenv("LLMK_TEST_SEED");
    if (!seed || !*seed) return;
    rng().seed(std::strtoull(seed, nullptr, 10));
    std::printf("[llmk test] LLMK_TEST_SEED: random seed %s instead\n", seed);
    std::fflush(stdout);
  }
};
testing::Environment* const seed_from_environment = testing::AddGlobalTestEnvironment(new SeedFromEnvironment);

using Accessor = std::function<float(int64_t, int64_t, int64_t, int64_t)>;  // (b, s, h, c)

Accessor of(const Heads& t, int64_t first_head = 0) {
  return [&t, first_head](int64_t b, int64_t s, int64_t h, int64_t c) { return t.get(b, s, first_head + h, c); };
}
// The values a kernel wrote into the (downloaded) storage of `t`.
Accessor of(const Heads& t, const HostTensor& got) {
  return [&t, &got](int64_t b, int64_t s, int64_t h, int64_t c) { return got.get(0, t.index(b, s, h, c)); };
}

// One problem in double: [batch, seq, heads, dim] arrays and the lse [batch, heads, seq_q]; a
// sequence is (batch entry, first q row, q rows, first k row, k rows): one per entry of a
// dense batch, several in the one entry of a packed (varlen) batch.
struct Problem {
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
  std::vector<double> q, k, v, dout, out, lse;
  struct Seq {
    int64_t b, q0, sq, k0, sk;
  };
  std::vector<Seq> seqs;

  int64_t qi(int64_t b, int64_t s, int64_t h) const { return ((b * seq_q + s) * heads_q + h) * dim; }
  int64_t ki(int64_t b, int64_t s, int64_t h) const { return ((b * seq_k + s) * heads_kv + h) * dim; }
  static std::vector<double> read(const Accessor& a, int64_t B, int64_t S, int64_t H, int64_t D) {
    std::vector<double> x(static_cast<size_t>(B * S * H * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < D; ++c) x[((b * S + s) * H + h) * D + c] = a(b, s, h, c);
    return x;
  }
};

Problem make_problem(const Shape& s, const Accessor& q, const Accessor& k, const Accessor& v, const Accessor& dout,
                     const Accessor& out, const HostTensor& lse, std::vector<Problem::Seq> seqs = {}) {
  Problem p{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.dim, {}, {}, {}, {}, {}, {}, std::move(seqs)};
  p.q = Problem::read(q, s.batch, s.seq_q, s.heads_q, s.dim);
  p.dout = Problem::read(dout, s.batch, s.seq_q, s.heads_q, s.dim);
  p.out = Problem::read(out, s.batch, s.seq_q, s.heads_q, s.dim);
  p.k = Problem::read(k, s.batch, s.seq_k, s.heads_kv, s.dim);
  p.v = Problem::read(v, s.batch, s.seq_k, s.heads_kv, s.dim);
  p.lse.resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q));
  for (size_t i = 0; i < p.lse.size(); ++i) p.lse[i] = lse.get(0, static_cast<int64_t>(i));
  if (p.seqs.empty())
    for (int64_t b = 0; b < s.batch; ++b) p.seqs.push_back({b, 0, s.seq_q, 0, s.seq_k});
  return p;
}

// Reference gradients and the sizes of their terms. A term's size is its magnitude before
// any cancellation inside it (dS = P (dP - D) cancels when a row's probability sits on one
// key: its rounding to the dtype is relative to P (|dP| + |D|), not to the difference); its
// float32 size is that of the products inside dP and D, P (sum_c |dout_c v_c| + sum_c
// |dout_c out_c|), which the float sums round relative to however much dP and D cancel.
struct Grad {
  std::vector<double> ref, abs, rss, f32;
  explicit Grad(size_t n) : ref(n, 0.0), abs(n, 0.0), rss(n, 0.0), f32(n, 0.0) {}
  void add(size_t i, double t, double size, double f32_size) {
    ref[i] += t;
    abs[i] += size;
    rss[i] += size * size;
    f32[i] += f32_size;
  }
  void add(size_t i, double t) { add(i, t, std::fabs(t), std::fabs(t)); }
  void finish(double scale) {
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] *= scale;
      abs[i] *= scale;
      rss[i] = std::sqrt(rss[i]) * scale;
      f32[i] *= scale;
    }
  }
};

struct Oracle {
  Grad dq, dk, dv;
};

// The backward from its definition: P = exp(scale q.k - lse) over the visible keys (none for
// lse = +-inf), D = dout . out, dP = dout . v, dS = P (dP - D). Against the library, `scale`
// is the float the library computes with: gradients that cancel to 1e-6 of their terms move
// by 1e-8 of the terms when the scale moves by its float rounding.
Oracle oracle(const Problem& p, bool causal, double scale) {
  Oracle o{Grad(p.q.size()), Grad(p.k.size()), Grad(p.k.size())};
  const int64_t group = p.heads_q / p.heads_kv, d = p.dim;
  for (const Problem::Seq& s : p.seqs)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.sq; ++i) {
        const double lse = p.lse[(s.b * p.heads_q + h) * p.seq_q + s.q0 + i];
        if (std::isinf(lse)) continue;
        const int64_t keys = causal ? std::clamp<int64_t>(i + 1 + s.sk - s.sq, 0, s.sk) : s.sk;
        const double* q = &p.q[p.qi(s.b, s.q0 + i, h)];
        const double* dout = &p.dout[p.qi(s.b, s.q0 + i, h)];
        const double* out = &p.out[p.qi(s.b, s.q0 + i, h)];
        double delta = 0, delta_terms = 0;
        for (int64_t c = 0; c < d; ++c) {
          delta += dout[c] * out[c];
          delta_terms += std::fabs(dout[c] * out[c]);
        }
        for (int64_t j = 0; j < keys; ++j) {
          const size_t kr = p.ki(s.b, s.k0 + j, g);
          double dot = 0, dp = 0, dp_terms = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += q[c] * p.k[kr + c];
            dp += dout[c] * p.v[kr + c];
            dp_terms += std::fabs(dout[c] * p.v[kr + c]);
          }
          const double prob = std::exp(dot * scale - lse), ds = prob * (dp - delta);
          const double ds_size = prob * (std::fabs(dp) + std::fabs(delta)), ds_f32 = prob * (dp_terms + delta_terms);
          for (int64_t c = 0; c < d; ++c) {
            const double kc = std::fabs(p.k[kr + c]), qc = std::fabs(q[c]);
            o.dq.add(p.qi(s.b, s.q0 + i, h) + c, ds * p.k[kr + c], ds_size * kc, ds_f32 * kc);
            o.dk.add(kr + c, ds * q[c], ds_size * qc, ds_f32 * qc);
            o.dv.add(kr + c, prob * dout[c]);
          }
        }
      }
    }
  o.dq.finish(scale);
  o.dk.finish(scale);
  o.dv.finish(1.0);
  return o;
}

// The spacing of the dtype's subnormals (fp16: 2^-24; gradients of 1e-5 are common): the
// relative bounds hold above it, rounding is absolute below.
double subnormal_step(DType dt) { return dt == DType::f16 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -133); }

// The bound on |got - ref| of element i of `g` (see the top of the file); `cpu`: the CPU
// backend's.
double grad_tolerance(const Grad& g, size_t i, DType dt, bool cpu) {
  const double u = eps_of(dt), r = std::fabs(g.ref[i]);
  return cpu ? 1.01 * u * r + 1e-9 * g.f32[i] + subnormal_step(dt)
             : 2 * u * r + std::min(2 * u * g.abs[i], 8 * u * g.rss[i]) + 1e-6 * g.f32[i] + 2 * subnormal_step(dt);
}

// got (a [batch, seq, heads, dim] accessor) against the oracle's gradient; `cpu`: the CPU
// backend's bound. Returns the number of elements out of bounds (the first few reported;
// with `report` false, nothing is reported: a count for checks that expect failures).
int64_t expect_grad(const char* what, const Accessor& got, const Grad& g, int64_t B, int64_t S, int64_t H, int64_t D,
                    DType dt, bool cpu, bool report = true) {
  int64_t bad = 0;
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c) {
          const size_t i = static_cast<size_t>(((b * S + s) * H + h) * D + c);
          const double r = g.ref[i], x = got(b, s, h, c), err = std::fabs(x - r), tol = grad_tolerance(g, i, dt, cpu);
          worst = std::max(worst, err / (tol > 0 ? tol : 1));
          if (!(err <= tol) && bad++ < 5 && report)
            ADD_FAILURE() << what << "[" << b << ", " << s << ", " << h << ", " << c << "] = " << x << ", reference "
                          << r << " (terms: sum |t| " << g.abs[i] << ", rss " << g.rss[i] << ", float32 sizes "
                          << g.f32[i] << ", tolerance " << tol << ")";
        }
  if (report) EXPECT_EQ(bad, 0) << what << ": elements out of tolerance; worst error / tolerance " << worst;
  return bad;
}

// Every storage element of `t` outside its view is still NaN in `got`.
void expect_gaps_nan(const char* what, const Heads& t, const HostTensor& got) {
  std::vector<bool> in_view(static_cast<size_t>(got.d), false);
  for (int64_t b = 0; b < t.batch; ++b)
    for (int64_t s = 0; s < t.seq; ++s)
      for (int64_t h = 0; h < t.heads; ++h)
        for (int64_t c = 0; c < t.dim; ++c) in_view[t.index(b, s, h, c)] = true;
  int64_t stray = 0;
  for (int64_t i = 0; i < got.d; ++i) stray += !in_view[i] && !std::isnan(got.get(0, i));
  EXPECT_EQ(stray, 0) << what << ": elements outside the view were written";
}

// dq rows of queries that see no key are exactly 0 (not merely near the reference's 0).
void expect_zero_rows(const Heads& dq, const HostTensor& got, const Problem& p, bool causal) {
  int64_t bad = 0;
  for (const Problem::Seq& s : p.seqs) {
    const int64_t masked = s.sk == 0 ? s.sq : causal ? std::max<int64_t>(s.sq - s.sk, 0) : 0;
    for (int64_t i = 0; i < masked; ++i)
      for (int64_t h = 0; h < dq.heads; ++h)
        for (int64_t c = 0; c < dq.dim; ++c) bad += got.get(0, dq.index(s.b, s.q0 + i, h, c)) != 0.0f;
  }
  EXPECT_EQ(bad, 0) << "dq of rows that see no key is not 0";
}

// q, k, v, dout of one case in the layout `layout` asks for; dq, dk, dv storage alike.
struct Inputs {
  std::unique_ptr<Heads> qkv, q, k, v, dout;
  Shape s;
  Layout layout;

  Inputs(DType dt, const Shape& shape, const Layout& l) : s(shape), layout(l) {
    const int64_t extra = l.extra_heads;
    if (l.fused) {
      const int64_t heads = s.heads_q + 2 * s.heads_kv;
      qkv = std::make_unique<Heads>(dt, s.batch, s.seq_q, heads, s.dim, heads + extra, l.transposed);
      qkv->randomize();
    } else {
      q = std::make_unique<Heads>(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra, l.transposed);
      k = std::make_unique<Heads>(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + extra, l.transposed);
      v = std::make_unique<Heads>(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + 2 * extra, l.transposed);
      q->randomize();
      k->randomize();
      v->randomize();
    }
    dout = std::make_unique<Heads>(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra, l.transposed);
    dout->randomize();
  }
  TensorView restride(const TensorView& t) const { return layout.odd_batch_stride ? with_batch_stride(t, 1) : t; }
  std::array<TensorView, 3> qkv_views(bool on_gpu) {
    if (qkv) {
      const TensorView all = restride(on_gpu ? qkv->gpu() : qkv->host());
      return {narrow_heads(all, 0, s.heads_q), narrow_heads(all, s.heads_q, s.heads_kv),
              narrow_heads(all, s.heads_q + s.heads_kv, s.heads_kv)};
    }
    return {restride(on_gpu ? q->gpu() : q->host()), restride(on_gpu ? k->gpu() : k->host()),
            restride(on_gpu ? v->gpu() : v->host())};
  }
  Accessor q_of() const { return qkv ? of(*qkv) : of(*q); }
  Accessor k_of() const { return qkv ? of(*qkv, s.heads_q) : of(*k); }
  Accessor v_of() const { return qkv ? of(*qkv, s.heads_q + s.heads_kv) : of(*v); }
  // Gradient storage: dq like q, dk and dv like k (wider rows, NaN gaps), poisoned.
  std::unique_ptr<Heads> grad_q(DType dt) const {
    return std::make_unique<Heads>(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + layout.extra_heads + 1,
                                   layout.transposed);
  }
  std::unique_ptr<Heads> grad_kv(DType dt) const {
    return std::make_unique<Heads>(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + layout.extra_heads + 1,
                                   layout.transposed);
  }
};

std::string describe_backward(DType dt, const Shape& s, bool causal, const Layout& layout) {
  std::ostringstream m;
  m << "backward " << dtype_name(dt) << " batch " << s.batch << " seq_q " << s.seq_q << " seq_k " << s.seq_k
    << " heads " << s.heads_q << "/" << s.heads_kv << " dim " << s.dim << (causal ? " causal" : "")
    << (layout.transposed ? " transposed" : "") << (layout.extra_heads ? " strided heads" : "")
    << (layout.fused ? " fused qkv" : "") << (layout.odd_batch_stride ? " batch stride 1" : "");
  return m.str();
}

struct Gradients {
  std::unique_ptr<Heads> dq, dk, dv;
};

// The three gradients of one call against the oracle; gaps NaN; rows without keys 0.
void expect_gradients(const Gradients& g, const HostTensor& dq, const HostTensor& dk, const HostTensor& dv,
                      const Oracle& o, const Problem& p, bool causal, DType dt, bool cpu) {
  expect_grad("dq", of(*g.dq, dq), o.dq, p.batch, p.seq_q, p.heads_q, p.dim, dt, cpu);
  expect_grad("dk", of(*g.dk, dk), o.dk, p.batch, p.seq_k, p.heads_kv, p.dim, dt, cpu);
  expect_grad("dv", of(*g.dv, dv), o.dv, p.batch, p.seq_k, p.heads_kv, p.dim, dt, cpu);
  expect_gaps_nan("dq", *g.dq, dq);
  expect_gaps_nan("dk", *g.dk, dk);
  expect_gaps_nan("dv", *g.dv, dv);
  expect_zero_rows(*g.dq, dq, p, causal);
}

// A float32 CUDA workspace of `n` elements, NaN (a kernel that reads what it never wrote fails).
struct Workspace {
  HostTensor host;
  std::unique_ptr<DeviceTensor> device;
  explicit Workspace(int64_t n) : host(DType::f32, 1, std::max<int64_t>(n, 1)) {
    host.poison();
    device = std::make_unique<DeviceTensor>(host);
  }
  TensorView view(int64_t n) const {
    const int64_t shape[1] = {n}, strides[1] = {1};
    return TensorView(device->data, DType::f32, Device{DeviceType::cuda, 0}, 1, shape, strides);
  }
};

// The GPU backward `call(gradients, deterministic, workspace)`: by default, then
// deterministic 1 + `repeats` times; the first two against the oracle, the repeats bitwise
// equal to the first deterministic run. Fresh NaN gradients and workspace every run.
template <class Call>
void gpu_runs(const Inputs& in, DType dt, const Oracle& o, const Problem& p, bool causal, int64_t ws_size, int repeats,
              const char* path, const std::string& what, bool may_decline, Call&& call) {
  const char* names[3] = {"dq", "dk", "dv"};
  HostTensor first[3];
  for (int run = 0; run < 2 + repeats; ++run) {
    const bool deterministic = run > 0;
    SCOPED_TRACE(deterministic ? "deterministic" : "default (dq by atomics)");
    Gradients g{in.grad_q(dt), in.grad_kv(dt), in.grad_kv(dt)};
    Workspace ws(ws_size);
    if (!run_on_path(path, p.dim, what + " backward", [&] { call(g, deterministic, ws.view(ws_size)); }, may_decline,
                     sm90_backward_must_take))
      return;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostTensor got[3] = {g.dq->download(), g.dk->download(), g.dv->download()};
    if (run <= 1) expect_gradients(g, got[0], got[1], got[2], o, p, causal, dt, false);
    for (int i = 0; i < 3 && run >= 1; ++i) {
      if (run == 1) first[i] = got[i];
      EXPECT_EQ(first[i].bytes, got[i].bytes) << names[i] << " differs between deterministic runs";
    }
  }
}

// The CPU backend against the oracle once; then per forward path: the GPU forward's out and
// lse, the GPU backward (default, then deterministic `repeats` + 1 times, bitwise equal)
// against the oracle of that out and lse.
void check_backward(DType dt, const Shape& s, bool causal, const Layout& layout = {}, int repeats = 1) {
  const std::string what = describe_backward(dt, s, causal, layout);
  SCOPED_TRACE(what);
  if (layout.odd_batch_stride) {
    ASSERT_EQ(s.batch, 1) << "an odd batch stride needs a batch of 1";
  }
  if (layout.fused) {
    ASSERT_EQ(s.seq_q, s.seq_k) << "a fused qkv projection has one sequence length";
  }
  Inputs in(dt, s, layout);
  const double scale = 1.0 / std::sqrt(double(s.dim));
  Heads out_ref(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q, layout.transposed);
  Lse lse_ref({s.batch, s.heads_q, s.seq_q});
  {
    const auto [q, k, v] = in.qkv_views(false);
    attention(in.restride(out_ref.host()), q, k, v, causal, scale, lse_ref.cpu());
    Gradients g{in.grad_q(dt), in.grad_kv(dt), in.grad_kv(dt)};
    attention_backward(in.restride(g.dq->host()), in.restride(g.dk->host()), in.restride(g.dv->host()),
                       in.restride(in.dout->host()), q, k, v, in.restride(out_ref.host()), lse_ref.cpu(), causal,
                       scale);
    const Problem p = make_problem(s, in.q_of(), in.k_of(), in.v_of(), of(*in.dout), of(out_ref), lse_ref.host);
    SCOPED_TRACE("CPU backend");
    expect_gradients(g, g.dq->store, g.dk->store, g.dv->store, oracle(p, causal, float(scale)), p, causal, dt, true);
  }
  if (!has_gpu()) return;
  // The deterministic size: enough for both paths.
  const int64_t ws_size = attention_backward_workspace_size(s.batch * s.seq_q, s.heads_q, s.dim);
  for (const char* path : kPaths) {
    SCOPED_TRACE(testing::Message() << "LLMK_ATTENTION_PATH=" << path);
    PathScope scope(path);
    Heads out(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q, layout.transposed);
    Lse lse({s.batch, s.heads_q, s.seq_q});
    const auto [q, k, v] = in.qkv_views(true);
    if (!run_on_path(path, s.dim, what, [&] { attention(in.restride(out.gpu()), q, k, v, causal, scale, lse.gpu()); },
                     layout.odd_batch_stride))
      continue;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostTensor out_got = out.download(), lse_got = lse.device->download();
    const Problem p = make_problem(s, in.q_of(), in.k_of(), in.v_of(), of(*in.dout), of(out, out_got), lse_got);
    gpu_runs(in, dt, oracle(p, causal, float(scale)), p, causal, ws_size, repeats, path, what,
             layout.odd_batch_stride, [&](Gradients& g, bool deterministic, const TensorView& ws) {
               attention_backward(in.restride(g.dq->gpu()), in.restride(g.dk->gpu()), in.restride(g.dv->gpu()),
                                  in.restride(in.dout->gpu()), q, k, v, in.restride(out.gpu()), lse.gpu(), causal,
                                  scale, deterministic, ws);
             });
  }
}

TEST(AttentionBackwardCpu, MatchesHandValues) {
  // One key: P = 1 for every row that sees it, out = v_0, so dS = P (dout . v_0 - dout . out)
  // = 0 exactly: dq = dk = 0, and dv_0 = the sum of dout over the rows.
  const int64_t d = 32, n = 6;
  Heads q(DType::bf16, 1, n, 2, d), k(DType::bf16, 1, 1, 1, d), v(DType::bf16, 1, 1, 1, d),
      dout(DType::bf16, 1, n, 2, d), out(DType::bf16, 1, n, 2, d), dq(DType::bf16, 1, n, 2, d),
      dk(DType::bf16, 1, 1, 1, d), dv(DType::bf16, 1, 1, 1, d);
  q.randomize();
  k.randomize();
  v.randomize();
  dout.randomize();
  Lse lse({1, 2, n});
  for (bool causal : {false, true}) {
    attention(out.host(), q.host(), k.host(), v.host(), causal, 0.3, lse.cpu());
    attention_backward(dq.host(), dk.host(), dv.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                       lse.cpu(), causal, 0.3);
    // causal with seq_k = 1 < seq_q: only the last row sees the key.
    const int64_t first = causal ? n - 1 : 0;
    for (int64_t c = 0; c < d; ++c) {
      double sum = 0;
      for (int64_t i = first; i < n; ++i) sum += double(dout.get(0, i, 0, c)) + dout.get(0, i, 1, c);
      EXPECT_NEAR(dv.get(0, 0, 0, c), sum, 1e-2 * (1 + std::fabs(sum)));
      EXPECT_EQ(dk.get(0, 0, 0, c), 0.0f);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dq.get(0, i, 1, c), 0.0f);
    }
    if (causal) EXPECT_EQ(lse.host.get(0, 0), -std::numeric_limits<float>::infinity());
  }
}

// attention(q, k, v) in double, straight from the definition (its own code: the checks below
// do not lean on the library's forward): out [batch, seq_q, heads_q, dim], lse [batch,
// heads_q, seq_q] (-inf for a row that sees no key, whose out is 0).
void forward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v, const Shape& s,
             bool causal, double scale, std::vector<double>& out, std::vector<double>& lse) {
  const int64_t group = s.heads_q / s.heads_kv, d = s.dim;
  out.assign(q.size(), 0.0);
  lse.assign(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), -INFINITY);
  std::vector<double> w(static_cast<size_t>(s.seq_k));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i) {
        const int64_t keys = causal ? std::clamp<int64_t>(i + 1 + s.seq_k - s.seq_q, 0, s.seq_k) : s.seq_k;
        if (keys == 0) continue;
        const size_t qr = ((b * s.seq_q + i) * s.heads_q + h) * d;
        double top = -INFINITY, sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const size_t kr = ((b * s.seq_k + j) * s.heads_kv + h / group) * d;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[qr + c] * k[kr + c];
          top = std::max(top, w[j] = dot * scale);
        }
        for (int64_t j = 0; j < keys; ++j) sum += (w[j] = std::exp(w[j] - top));
        for (int64_t j = 0; j < keys; ++j) {
          const size_t kr = ((b * s.seq_k + j) * s.heads_kv + h / group) * d;
          for (int64_t c = 0; c < d; ++c) out[qr + c] += w[j] / sum * v[kr + c];
        }
        lse[(b * s.heads_q + h) * s.seq_q + i] = top + std::log(sum);
      }
}

// gradcheck-style, on tiny shapes (GQA, causal with seq_q < seq_k and seq_q > seq_k: masked
// rows): the gradient of L = sum(dout * attention(q, k, v)) by central differences of the
// double forward at every element of q, k and v (h = 1e-5: exact to ~1e-9 here) against
//  - the oracle fed the exact out and lse: the formulas themselves, to 1e-6 relative;
//  - the CPU backend, fed the library's forward (out rounded to fp16, lse in fp32): within
//    its output rounding (2^-11 relative) plus the effect of those inputs' rounding, which
//    the oracle measures exactly (oracle with the rounded inputs minus oracle with exact).
TEST(AttentionBackwardCpu, MatchesCentralDifferences) {
  const Shape shapes[] = {{1, 5, 7, 4, 2, 32}, {2, 6, 3, 2, 1, 32}, {1, 4, 4, 3, 1, 32}};
  const DType dt = DType::f16;
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(describe_backward(dt, s, causal, {}));
      Inputs in(dt, s, {});
      Heads out(dt, s.batch, s.seq_q, s.heads_q, s.dim);
      Lse lse({s.batch, s.heads_q, s.seq_q});
      Gradients g{in.grad_q(dt), in.grad_kv(dt), in.grad_kv(dt)};
      const double scale = 0.4;
      attention(out.host(), in.q->host(), in.k->host(), in.v->host(), causal, scale, lse.cpu());
      attention_backward(g.dq->host(), g.dk->host(), g.dv->host(), in.dout->host(), in.q->host(), in.k->host(),
                         in.v->host(), out.host(), lse.cpu(), causal, scale);
      Problem exact = make_problem(s, of(*in.q), of(*in.k), of(*in.v), of(*in.dout), of(out), lse.host);
      const Oracle rounded = oracle(exact, causal, float(scale));  // the library's out, lse and float scale
      forward(exact.q, exact.k, exact.v, s, causal, scale, exact.out, exact.lse);
      const Oracle o = oracle(exact, causal, scale);
      std::vector<double> q = exact.q, k = exact.k, v = exact.v;
      auto loss = [&] {
        std::vector<double> o_, l_;
        forward(q, k, v, s, causal, scale, o_, l_);
        double total = 0;
        for (size_t i = 0; i < o_.size(); ++i) total += exact.dout[i] * o_[i];
        return total;
      };
      const double h = 1e-5, u = eps_of(dt);
      auto check = [&](const char* what, std::vector<double>& x, const Grad& exact_grad, const Grad& rounded_grad,
                       const Heads& grad, int64_t seq, int64_t heads) {
        const std::vector<double> got = Problem::read(of(grad), s.batch, seq, heads, s.dim);
        int64_t bad = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const double saved = x[i];
          x[i] = saved + h;
          const double up = loss();
          x[i] = saved - h;
          const double down = loss();
          x[i] = saved;
          const double fd = (up - down) / (2 * h), formula = exact_grad.ref[i];
          const double slack = 1e-6 * (std::fabs(fd) + exact_grad.abs[i]) + 1e-8;
          if (!(std::fabs(formula - fd) <= slack) && bad++ < 5)
            ADD_FAILURE() << what << " element " << i << ": formula " << formula << ", central difference " << fd;
          const double tol = 1.01 * u * std::fabs(rounded_grad.ref[i]) + subnormal_step(dt) +
                             std::fabs(rounded_grad.ref[i] - formula) + slack;
          if (!(std::fabs(got[i] - fd) <= tol) && bad++ < 5)
            ADD_FAILURE() << what << " element " << i << ": CPU backend " << got[i] << ", central difference " << fd
                          << " (tolerance " << tol << ")";
        }
        EXPECT_EQ(bad, 0) << what;
      };
      check("dq", q, o.dq, rounded.dq, *g.dq, s.seq_q, s.heads_q);
      check("dk", k, o.dk, rounded.dk, *g.dk, s.seq_k, s.heads_kv);
      check("dv", v, o.dv, rounded.dv, *g.dv, s.seq_k, s.heads_kv);
    }
}

// The CPU backend against the oracle on small cases of every kind (these run without a GPU;
// the GPU tests below repeat the CPU check at their sizes).
TEST(AttentionBackwardCpu, MatchesOracle) {
  for (bool causal : {false, true}) {
    check_backward(DType::bf16, {2, 17, 23, 4, 2, 32}, causal);
    check_backward(DType::f16, {1, 23, 9, 3, 1, 64}, causal, kTransposed);  // causal: 14 rows see no key
    check_backward(DType::bf16, {2, 12, 12, 4, 2, 32}, causal, Layout{false, 1, true, false});
    check_backward(DType::f16, {1, 9, 0, 2, 1, 32}, causal);  // no keys: dq = 0
    check_backward(DType::f16, {2, 0, 9, 2, 1, 32}, causal);  // no queries: dk = dv = 0
  }
}

// A model of the kernels' float arithmetic (not their code: the GPU's order of summation is
// its own): S = q.k and dP = dout.v accumulated in float over k-steps of 16 (an MMA's, each
// step's products summed exactly), D = dout.out as a tree over float sums of 8 (another order,
// as the kernels' separate pass), P = exp(S scale - lse) in float, dS = P (dP - D) in float
// rounded to the dtype, dq and dk accumulated in float, times the float scale, rounded to the
// dtype. dq and dk as the oracle's [batch, seq, heads, dim] arrays.
float mma_dot(const double* a, const double* b, int64_t d) {
  float acc = 0;
  for (int64_t c0 = 0; c0 < d; c0 += 16) {
    double step = 0;
    for (int64_t c = c0; c < std::min<int64_t>(c0 + 16, d); ++c) step += a[c] * b[c];
    acc = static_cast<float>(acc + step);
  }
  return acc;
}
float tree_dot(const double* a, const double* b, int64_t d) {
  std::vector<float> part;
  for (int64_t c0 = 0; c0 < d; c0 += 8) {
    float sum = 0;
    for (int64_t c = c0; c < std::min<int64_t>(c0 + 8, d); ++c)
      sum += static_cast<float>(a[c]) * static_cast<float>(b[c]);
    part.push_back(sum);
  }
  for (size_t n = part.size(); n > 1; n = (n + 1) / 2)
    for (size_t i = 0; i < (n + 1) / 2; ++i) part[i] = part[2 * i] + (2 * i + 1 < n ? part[2 * i + 1] : 0.0f);
  return part.empty() ? 0.0f : part[0];
}
void float_model(const Problem& p, bool causal, float scale, DType dt, std::vector<double>& dq,
                 std::vector<double>& dk) {
  HostTensor cell(dt, 1, 1);
  auto to_dtype = [&cell](float x) {
    cell.set(0, 0, x);
    return cell.get(0, 0);
  };
  std::vector<float> dq_acc(p.q.size(), 0.0f), dk_acc(p.k.size(), 0.0f);
  const int64_t group = p.heads_q / p.heads_kv, d = p.dim;
  for (const Problem::Seq& s : p.seqs)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < s.sq; ++i) {
        const float lse = static_cast<float>(p.lse[(s.b * p.heads_q + h) * p.seq_q + s.q0 + i]);
        if (std::isinf(lse)) continue;
        const int64_t keys = causal ? std::clamp<int64_t>(i + 1 + s.sk - s.sq, 0, s.sk) : s.sk;
        const size_t qr = p.qi(s.b, s.q0 + i, h);
        const float delta = tree_dot(&p.dout[qr], &p.out[qr], d);
        for (int64_t j = 0; j < keys; ++j) {
          const size_t kr = p.ki(s.b, s.k0 + j, h / group);
          const float prob = std::exp(mma_dot(&p.q[qr], &p.k[kr], d) * scale - lse);
          const float ds = to_dtype(prob * (mma_dot(&p.dout[qr], &p.v[kr], d) - delta));
          for (int64_t c = 0; c < d; ++c) {
            dq_acc[qr + c] += ds * static_cast<float>(p.k[kr + c]);
            dk_acc[kr + c] += ds * static_cast<float>(p.q[qr + c]);
          }
        }
      }
  dq.resize(dq_acc.size());
  dk.resize(dk_acc.size());
  for (size_t i = 0; i < dq.size(); ++i) dq[i] = to_dtype(dq_acc[i] * scale);
  for (size_t i = 0; i < dk.size(); ++i) dk[i] = to_dtype(dk_acc[i] * scale);
}

// [batch, seq, heads, dim] doubles as an accessor.
Accessor of(const std::vector<double>& x, int64_t seq, int64_t heads, int64_t dim) {
  return [&x, seq, heads, dim](int64_t b, int64_t s, int64_t h, int64_t c) {
    return static_cast<float>(x[((b * seq + s) * heads + h) * dim + c]);
  };
}

// The bound against the float model where dS = P (dP - D) cancels with dP and D both 0: the
// first row that sees a key (one key: P = 1, out = v_0) gets a dout orthogonal to v_0 (dout_c
// = 16 v_{d-1-c}, dout_{d-1-c} = -16 v_c for c < d/2: dP = D = 0 exactly, sum_c |dout_c v_c|
// of order 16 d), so the reference there is 0 and |dP| + |D| = 0, while the float dP and D
// keep their rounding (the H100 failure of FullyMaskedRowsAndEmptySides, seed 3784810976,
// fp16 seq_q 300, seq_k 127, causal, d 128: dq[0, 173, 0, :] 2e-7 where |dP| + |D| = 1.3e-4
// made the bound 1.4e-7). The model passes (dq and dk); its fp16 dq in that row exceeds the 2
// subnormal steps that |dP| + |D| = 0 allowed (the case is exercised; bf16's float sums are
// often exact); the bound still catches an error of 1e-3 max|dq| at every element of that
// row and an offset of 1e-3 max|dq| over the rows that see keys (in 1 element in 20 at least:
// 14% measured for bf16, 83% for fp16); and the float32 allowance 1e-6 F stays under 1e-4
// max|dq| in the other rows (2.6e-5 measured).
TEST(AttentionBackwardCpu, BoundCoversFloatCancellationAndStillCatchesErrors) {
  double exercised = 0;  // the largest fp16 model |dq| in that row, in units of 2 subnormal steps
  for (DType dt : kDTypes)
    for (int64_t d : {64, 128}) {
      const Shape s{2, 40, 9, 8, 2, d};  // causal: rows 0-30 see no key, row 31 one, row 39 all 9
      SCOPED_TRACE(describe_backward(dt, s, true, {}));
      const int64_t row = s.seq_q - s.seq_k;
      Inputs in(dt, s, {});
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads_q; ++h)
          for (int64_t c = 0; c < d / 2; ++c) {
            const int64_t g = h / (s.heads_q / s.heads_kv);
            in.dout->store.set(0, in.dout->index(b, row, h, c), 16 * in.v->get(b, 0, g, d - 1 - c));
            in.dout->store.set(0, in.dout->index(b, row, h, d - 1 - c), -16 * in.v->get(b, 0, g, c));
          }
      const double scale = 1.0 / std::sqrt(double(d));
      Heads out(dt, s.batch, s.seq_q, s.heads_q, d);
      Lse lse({s.batch, s.heads_q, s.seq_q});
      attention(out.host(), in.q->host(), in.k->host(), in.v->host(), true, scale, lse.cpu());
      const Problem p = make_problem(s, in.q_of(), in.k_of(), in.v_of(), of(*in.dout), of(out), lse.host);
      const Oracle o = oracle(p, true, float(scale));
      std::vector<double> dq, dk;
      float_model(p, true, float(scale), dt, dq, dk);
      auto dq_bad = [&](const std::vector<double>& x, bool report) {
        return expect_grad("dq", of(x, s.seq_q, s.heads_q, d), o.dq, s.batch, s.seq_q, s.heads_q, d, dt, false, report);
      };
      SCOPED_TRACE("the float model");
      EXPECT_EQ(dq_bad(dq, true), 0);
      EXPECT_EQ(expect_grad("dk", of(dk, s.seq_k, s.heads_kv, d), o.dk, s.batch, s.seq_k, s.heads_kv, d, dt, false), 0);
      // max|dq|, the float32 allowance outside that row (its dout, 16 v, is not a random
      // one), and in that row: the reference, |dP| + |D| (their sum of sizes) and the model.
      double max_ref = 0, max_allowance = 0, row_ref = 0, row_abs = 0, row_model = 0;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < s.seq_q; ++i)
          for (int64_t h = 0; h < s.heads_q; ++h)
            for (int64_t c = 0; c < d; ++c) {
              const size_t e = p.qi(b, i, h) + c;
              max_ref = std::max(max_ref, std::fabs(o.dq.ref[e]));
              if (i != row) max_allowance = std::max(max_allowance, 1e-6 * o.dq.f32[e]);
              if (i != row) continue;
              row_ref = std::max(row_ref, std::fabs(o.dq.ref[e]));
              row_abs = std::max(row_abs, o.dq.abs[e]);
              row_model = std::max(row_model, std::fabs(dq[e]));
            }
      EXPECT_EQ(row_ref, 0.0) << "dout orthogonal to v_0: dS = 0 in row " << row;
      EXPECT_EQ(row_abs, 0.0) << "|dP| + |D| = 0 in row " << row;
      if (dt == DType::f16) exercised = std::max(exercised, row_model / (2 * subnormal_step(dt)));
      EXPECT_LT(max_allowance, 1e-4 * max_ref) << "the float32 allowance against max|dq|";
      // An error of 1e-3 max|dq| in every element of that row: each fails.
      std::vector<double> wrong = dq;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads_q; ++h)
          for (int64_t c = 0; c < d; ++c) wrong[p.qi(b, row, h) + c] += (c % 2 ? 1e-3 : -1e-3) * max_ref;
      EXPECT_EQ(dq_bad(wrong, false), s.batch * s.heads_q * d) << "an error of 1e-3 max|dq| in row " << row;
      // An offset of 1e-3 max|dq| over the rows that see keys.
      wrong = dq;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = row; i < s.seq_q; ++i)
          for (int64_t h = 0; h < s.heads_q; ++h)
            for (int64_t c = 0; c < d; ++c) wrong[p.qi(b, i, h) + c] += 1e-3 * max_ref;
      EXPECT_GE(dq_bad(wrong, false) * 20, s.batch * (s.seq_q - row) * s.heads_q * d)
          << "an offset of 1e-3 max|dq| over the rows that see keys fails in fewer than 1 element in 20";
    }
  EXPECT_GT(exercised, 1.0) << "the fp16 float model's dq in the cancelling rows (its float rounding, which the "
                               "bound must allow) stayed within the 2 subnormal steps that |dP| + |D| = 0 allows";
}

// check_backward as a case-list callback (the lists are shared with the forward's tests).
void backward_case(DType dt, const Shape& s, bool causal, const Layout& layout) { check_backward(dt, s, causal, layout); }

TEST(AttentionBackwardGpu, EveryDtypeHeadDimAndMask) {
  LLMK_REQUIRE_GPU();
  dtype_head_dim_cases(backward_case);
}

TEST(AttentionBackwardGpu, SequenceLengths) {
  LLMK_REQUIRE_GPU();
  sequence_length_cases(backward_case);
  check_backward(DType::f16, {1, 700, 1100, 2, 1, 256}, true);
  check_backward(DType::bf16, {1, 1100, 2048, 1, 1, 128}, true);
}

// Walks of at least 16 query tiles (32 causal) at head dim 64 take the kernel that issues each
// tile's dQ during the next tile (attention/sm90/backward.cu, dq_of_previous_tile): 5 tiles (the
// last partial) x group 8, one query head of 33 tiles, causal 9 x 8 across the diagonal; default
// and deterministic against the oracle.
TEST(AttentionBackwardGpu, LongWalksAtHeadDim64) {
  LLMK_REQUIRE_GPU();
  check_backward(DType::bf16, {1, 520, 333, 8, 1, 64}, false);
  check_backward(DType::f16, {1, 4200, 333, 1, 1, 64}, false);
  check_backward(DType::bf16, {2, 1100, 1100, 8, 1, 64}, true);
}

// Head dims 64, 96 and 128 with more key blocks x kv heads x batch entries than the persistent
// grid's CTAs (dense non-causal calls; 132 on the H100), so that CTAs walk two units: the ring,
// the K/V barriers and the dS^T buffers' phases go on across units, and units map to key block,
// kv head and batch entry. Head dim 64: walks of 16 query tiles (the dQ of the previous tile),
// of 2 and of 3 (odd: a unit's first tile takes the other dS^T buffer), with the first store
// (up to 1024 keys) and without it (1100 keys; deterministic: 126 CTAs, a multiple of the 9 key
// blocks). Head dims 96 and 128: 5 query tiles of 64 rows, the last tile's Q stage freed with K
// and V; head dim 96 also without the first store (4 query tiles, 9 key blocks).
TEST(AttentionBackwardGpu, PersistentGridWalksSeveralUnits) {
  LLMK_REQUIRE_GPU();
  check_backward(DType::f16, {1, 129, 129, 560, 70, 64}, false);
  check_backward(DType::bf16, {1, 200, 1100, 16, 16, 64}, false);
  check_backward(DType::bf16, {2, 300, 300, 35, 35, 64}, false);
  check_backward(DType::bf16, {2, 300, 300, 35, 35, 128}, false);
  check_backward(DType::f16, {2, 300, 300, 35, 35, 96}, false);
  check_backward(DType::bf16, {1, 200, 1100, 16, 16, 96}, false);
}

// masked_row_cases: rows that see no key have dq exactly 0 and add nothing to dk and dv; no
// keys: dq = 0; no queries: dk = dv = 0.
TEST(AttentionBackwardGpu, FullyMaskedRowsAndEmptySides) {
  LLMK_REQUIRE_GPU();
  masked_row_cases(backward_case);
}

// dk and dv sum the group's query heads (the cases of gqa_cases).
TEST(AttentionBackwardGpu, GqaGroupSizes) {
  LLMK_REQUIRE_GPU();
  gqa_cases(backward_case);
}

// The forward's layouts (layout_cases); the gradients go into strided storage with NaN gaps
// in every case.
TEST(AttentionBackwardGpu, Layouts) {
  LLMK_REQUIRE_GPU();
  layout_cases(backward_case);
}

// Ten deterministic runs give the same bytes (the first two runs are also checked against
// the oracle).
TEST(AttentionBackwardGpu, DeterministicIsBitwiseRepeatable) {
  LLMK_REQUIRE_GPU();
  check_backward(DType::bf16, {2, 300, 300, 8, 2, 128}, true, {}, 9);
  check_backward(DType::f16, {1, 257, 513, 4, 4, 64}, false, {}, 9);
  check_backward(DType::bf16, {1, 200, 333, 4, 2, 256}, true, {}, 9);
  check_backward(DType::f16, {1, 333, 200, 2, 1, 256}, false, {}, 9);
  check_backward(DType::bf16, {1, 300, 300, 4, 2, 96}, true, {}, 9);
  check_backward(DType::f16, {2, 129, 400, 2, 2, 96}, false, {}, 9);
}

// A deterministic call with more key blocks per head than the GPU holds at once (20,000
// keys: 157 blocks of 128 per head, 313 of 64 at head dim 256, one block per SM on the Hopper
// path): its dq turns follow
// the order the blocks are dispatched in, so it finishes (a wrong order hangs here: ctest's
// 900 s limit, tests/cpp/CMakeLists.txt, fails it), and a second run repeats the first's bits.
// Causal: dk and dv are the default path's bits (the same blocks walk the same tiles in the
// same order). Non-causal: a GPU whose SMs hold every key block at once rotates the
// deterministic walks (the default path never does), so dk and dv may sum in another order.
// dq (and there dk, dv) match the default path's within fp32 summation-order noise and
// rounding.
void check_wide_deterministic(bool causal, int64_t d) {
  SCOPED_TRACE(testing::Message() << (causal ? "causal" : "non-causal") << ", head dim " << d);
  const int64_t seq = 20000, heads = 2;
  const double scale = 1.0 / std::sqrt(double(d));
  Heads q(DType::bf16, 1, seq, heads, d), k(DType::bf16, 1, seq, heads, d), v(DType::bf16, 1, seq, heads, d),
      dout(DType::bf16, 1, seq, heads, d), out(DType::bf16, 1, seq, heads, d);
  for (Heads* t : {&q, &k, &v, &dout}) t->randomize();
  Lse lse({1, heads, seq});
  attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), causal, scale, lse.gpu());
  auto run = [&](bool deterministic) {
    Heads dq(DType::bf16, 1, seq, heads, d), dk(DType::bf16, 1, seq, heads, d), dv(DType::bf16, 1, seq, heads, d);
    const int64_t need = attention_backward_workspace_size(seq, heads, d);
    Workspace ws(need);
    attention_backward(dq.gpu(), dk.gpu(), dv.gpu(), dout.gpu(), q.gpu(), k.gpu(), v.gpu(), out.gpu(), lse.gpu(),
                       causal, scale, deterministic, ws.view(need));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::array<HostTensor, 3>{dq.download(), dk.download(), dv.download()};
  };
  const auto base = run(false), first = run(true), second = run(true);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first[i].bytes, second[i].bytes) << "gradient " << i << " differs between runs";
  if (causal) {
    EXPECT_EQ(first[1].bytes, base[1].bytes) << "dk differs from the default path's";
    EXPECT_EQ(first[2].bytes, base[2].bytes) << "dv differs from the default path's";
  }
  for (int i = causal ? 0 : 2; i >= 0; --i) {
    SCOPED_TRACE("gradient " + std::to_string(i));
    float scale = 0.0f;
    for (int64_t j = 0; j < base[i].d; ++j) scale = std::max(scale, std::fabs(base[i].get(0, j)));
    ASSERT_GT(scale, 0.0f);
    for (int64_t j = 0; j < base[i].d; ++j) {
      const float a = base[i].get(0, j), b = first[i].get(0, j);
      ASSERT_LE(std::fabs(a - b), 1.0e-2f * std::fabs(a) + 1.0e-3f * scale) << "element " << j;
    }
  }
}

TEST(AttentionBackwardGpu, DeterministicWiderThanTheGpu) {
  LLMK_REQUIRE_GPU();
  for (int64_t d : {64, 256}) {
    if (!attention_head_dim_compiled(d)) continue;
    check_wide_deterministic(true, d);
    check_wide_deterministic(false, d);
  }
}

// Packed sequences: the CPU backend and the GPU (default and deterministic) against the
// oracle over the same sequences.
void check_varlen_backward(DType dt, const std::vector<int64_t>& lens_q, const std::vector<int64_t>& lens_k,
                           int64_t heads_q, int64_t heads_kv, int64_t dim, bool causal) {
  std::ostringstream m;
  m << "varlen backward " << dtype_name(dt) << " q lengths";
  for (int64_t n : lens_q) m << " " << n;
  m << ", k lengths";
  for (int64_t n : lens_k) m << " " << n;
  m << ", heads " << heads_q << "/" << heads_kv << " dim " << dim << (causal ? " causal" : "");
  SCOPED_TRACE(m.str());
  const int64_t batch = static_cast<int64_t>(lens_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<Problem::Seq> seqs;
  for (int64_t b = 0; b < batch; ++b) {
    seqs.push_back({0, cu_q.back(), lens_q[b], cu_k.back(), lens_k[b]});
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(lens_q[b]));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(lens_k[b]));
  }
  const int64_t max_q = *std::max_element(lens_q.begin(), lens_q.end());
  const int64_t max_k = *std::max_element(lens_k.begin(), lens_k.end());
  const int64_t total_q = cu_q.back(), total_k = cu_k.back();
  const Shape s{1, total_q, total_k, heads_q, heads_kv, dim};
  Inputs in(dt, s, Layout{false, 1, false, false});
  HostTensor cu_host(DType::i32, 1, 2 * (batch + 1));  // raw int32 storage
  std::memcpy(cu_host.bytes.data(), cu_q.data(), 4 * (batch + 1));
  std::memcpy(cu_host.bytes.data() + 4 * (batch + 1), cu_k.data(), 4 * (batch + 1));
  auto cu_view = [&](void* base, bool on_gpu, int which) {
    const int64_t shape[1] = {batch + 1}, strides[1] = {1};
    return TensorView(static_cast<int32_t*>(base) + which * (batch + 1), DType::i32,
                      Device{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0}, 1, shape, strides);
  };
  const double scale = 0.7 / std::sqrt(double(dim));
  {
    Heads out(dt, 1, total_q, heads_q, dim);
    Lse lse({heads_q, total_q});
    Gradients g{in.grad_q(dt), in.grad_kv(dt), in.grad_kv(dt)};
    const TensorView cq = cu_view(cu_host.bytes.data(), false, 0), ck = cu_view(cu_host.bytes.data(), false, 1);
    attention_varlen(out.host(true), in.q->host(true), in.k->host(true), in.v->host(true), cq, ck, max_q, max_k,
                     causal, scale, lse.cpu());
    attention_varlen_backward(g.dq->host(true), g.dk->host(true), g.dv->host(true), in.dout->host(true),
                              in.q->host(true), in.k->host(true), in.v->host(true), out.host(true), lse.cpu(), cq, ck,
                              max_q, max_k, causal, scale);
    const Problem p = make_problem(s, of(*in.q), of(*in.k), of(*in.v), of(*in.dout), of(out), lse.host, seqs);
    SCOPED_TRACE("CPU backend");
    expect_gradients(g, g.dq->store, g.dk->store, g.dv->store, oracle(p, causal, float(scale)), p, causal, dt, true);
  }
  if (!has_gpu()) return;
  DeviceTensor cu_dev(cu_host);
  const TensorView cq = cu_view(cu_dev.data, true, 0), ck = cu_view(cu_dev.data, true, 1);
  const int64_t ws_size = attention_backward_workspace_size(total_q, heads_q, dim);
  for (const char* path : kPaths) {
    SCOPED_TRACE(testing::Message() << "LLMK_ATTENTION_PATH=" << path);
    PathScope scope(path);
    Heads out(dt, 1, total_q, heads_q, dim);
    Lse lse({heads_q, total_q});
    if (!run_on_path(path, dim, m.str(), [&] {
          attention_varlen(out.gpu(true), in.q->gpu(true), in.k->gpu(true), in.v->gpu(true), cq, ck, max_q, max_k,
                           causal, scale, lse.gpu());
        }))
      continue;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostTensor out_got = out.download(), lse_got = lse.device->download();
    const Problem p = make_problem(s, of(*in.q), of(*in.k), of(*in.v), of(*in.dout), of(out, out_got), lse_got, seqs);
    gpu_runs(in, dt, oracle(p, causal, float(scale)), p, causal, ws_size, 1, path, m.str(), false,
             [&](Gradients& g, bool deterministic, const TensorView& ws) {
               attention_varlen_backward(g.dq->gpu(true), g.dk->gpu(true), g.dv->gpu(true), in.dout->gpu(true),
                                         in.q->gpu(true), in.k->gpu(true), in.v->gpu(true), out.gpu(true), lse.gpu(),
                                         cq, ck, max_q, max_k, causal, scale, deterministic, ws);
             });
  }
}

// Empty sequences first, between and last, sequences without keys, a q longer than its keys
// (causal: rows that see none), lengths around the tiles, GQA.
TEST(AttentionBackwardVarlen, EmptySequencesAndTileEdges) {
  for (bool causal : {false, true}) {
    check_varlen_backward(DType::bf16, {3, 0, 5, 1}, {4, 2, 0, 6}, 4, 2, 32, causal);  // small: the CPU case
    if (!has_gpu()) continue;
    check_varlen_backward(DType::bf16, {1, 130, 0, 77, 300}, {1, 130, 5, 200, 250}, 4, 2, 64, causal);
    check_varlen_backward(DType::f16, {0, 7, 129, 0, 300, 1}, {5, 7, 200, 0, 127, 0}, 6, 2, 128, causal);
    check_varlen_backward(DType::bf16, {7, 129}, {0, 0}, 4, 2, 128, causal);  // no keys at all
    check_varlen_backward(DType::f16, {65, 1, 129}, {129, 64, 1}, 8, 1, 256, causal);
    check_varlen_backward(DType::bf16, {70, 0, 129}, {200, 3, 65}, 4, 2, 96, causal);
  }
}

TEST(AttentionBackwardErrors, BadInputsWriteNothing) {
  const int64_t d = 64;
  Heads q(DType::bf16, 2, 8, 4, d), k(DType::bf16, 2, 8, 2, d), v(DType::bf16, 2, 8, 2, d),
      out(DType::bf16, 2, 8, 4, d), dout(DType::bf16, 2, 8, 4, d), dq(DType::bf16, 2, 8, 4, d),
      dk(DType::bf16, 2, 8, 2, d), dv(DType::bf16, 2, 8, 2, d);
  for (Heads* t : {&q, &k, &v, &dout}) t->randomize();
  Lse lse({2, 4, 8});
  attention(out.host(), q.host(), k.host(), v.host(), true, 0.125, lse.cpu());
  dq.store.poison();
  auto call = [&](const TensorView& dqv, const TensorView& dkv, const TensorView& doutv, const TensorView& lsev) {
    attention_backward(dqv, dkv, dv.host(), doutv, q.host(), k.host(), v.host(), out.host(), lsev, true, 0.125);
  };
  Heads dq_short(DType::bf16, 2, 7, 4, d), dk_f16(DType::f16, 2, 8, 2, d), dout_h3(DType::bf16, 2, 8, 3, d);
  expect_error([&] { call(dq_short.host(), dk.host(), dout.host(), lse.cpu()); },
               "attention_backward: dq has shape [2, 7, 4, 64] but q has shape [2, 8, 4, 64]");
  expect_error([&] { call(dq.host(), dk_f16.host(), dout.host(), lse.cpu()); },
               "attention_backward: dk has dtype float16, expected bfloat16");
  expect_error([&] { call(dq.host(), dk.host(), dout_h3.host(), lse.cpu()); },
               "attention_backward: dout has shape [2, 8, 3, 64] but q has shape");
  Lse lse_bad({2, 4, 7});
  expect_error([&] { call(dq.host(), dk.host(), dout.host(), lse_bad.cpu()); },
               "attention_backward: lse must be float32 [batch, heads_q, seq_q] = [2, 4, 8], got [2, 4, 7]");
  expect_error(
      [&] {
        attention_backward(dq.host(), dk.host(), dk.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                           lse.cpu(), true, 0.125);
      },
      "attention_backward: dk and dv are the same tensor");
  expect_error([&] { call(dq.host(), k.host(), dout.host(), lse.cpu()); }, "dk and k are the same tensor");
  expect_error([&] { call(dout.host(), dk.host(), dout.host(), lse.cpu()); }, "same tensor");  // dq is dout
  expect_error(
      [&] {
        attention_backward(dq.host(), dk.host(), dv.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                           lse.cpu(), true, -1.0);
      },
      "scale must be finite and > 0");
  for (int64_t i = 0; i < dq.store.d; ++i) ASSERT_TRUE(std::isnan(dq.store.get(0, i))) << "dq element " << i;
  for (int64_t i = 0; i < dk.store.d; ++i) ASSERT_TRUE(std::isnan(dk.store.get(0, i))) << "dk element " << i;
  for (int64_t i = 0; i < dv.store.d; ++i) ASSERT_TRUE(std::isnan(dv.store.get(0, i))) << "dv element " << i;
  // The workspace size: the accumulator, D and two counters per row and head.
  EXPECT_EQ(attention_backward_workspace_size(10, 4, 64), 10 * 4 * 67);
}

// The sinks' gradient of the C++ API (Python computes it by autograd's formula instead):
// dsinks[h] = -sum over the rows of head h of exp(sink_h - lse) * rowsum(dout * out), with the
// forward's lse (which includes the sink), on causal rows with a window and a softcap, including
// rows that see no key (their out is 0: they add nothing). A rejected call writes nothing.
TEST(AttentionBackwardCpu, SinksGradient) {
  const int64_t d = 32, heads = 4, seq_q = 9, seq_k = 6;
  Heads q(DType::bf16, 2, seq_q, heads, d), k(DType::bf16, 2, seq_k, 2, d), v(DType::bf16, 2, seq_k, 2, d),
      out(DType::bf16, 2, seq_q, heads, d), dout(DType::bf16, 2, seq_q, heads, d), dq(DType::bf16, 2, seq_q, heads, d),
      dk(DType::bf16, 2, seq_k, 2, d), dv(DType::bf16, 2, seq_k, 2, d);
  for (Heads* t : {&q, &k, &v, &dout}) t->randomize();
  Lse lse({2, heads, seq_q}), sinks({heads}), dsinks({heads});
  for (int64_t h = 0; h < heads; ++h) sinks.host.set(0, h, 0.5f * static_cast<float>(h) - 1.0f);
  AttentionOptions o;
  o.window = 3;
  o.softcap = 4.0;
  o.sinks = sinks.cpu();
  attention(out.host(), q.host(), k.host(), v.host(), true, 0.2, o, lse.cpu());
  attention_backward(dq.host(), dk.host(), dv.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                     lse.cpu(), true, 0.2, o, dsinks.cpu());
  for (int64_t h = 0; h < heads; ++h) {
    double want = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < seq_q; ++i) {
        double delta = 0;
        for (int64_t c = 0; c < d; ++c) delta += double(dout.get(b, i, h, c)) * out.get(b, i, h, c);
        want -= std::exp(double(sinks.host.get(0, h)) - lse.host.get(0, (b * heads + h) * seq_q + i)) * delta;
      }
    // out is rounded to bf16 in the forward and D is taken from the exact row in the reference:
    // the difference is the output rounding, 2^-8 of |out| per row.
    EXPECT_NEAR(dsinks.host.get(0, h), want, 1e-2 * (1 + std::fabs(want))) << "head " << h;
  }
  // seq_q > seq_k: the first rows see no key; their lse is the sink itself.
  EXPECT_EQ(lse.host.get(0, 0), sinks.host.get(0, 0));
  Lse poisoned({heads});
  AttentionOptions none;
  expect_error(
      [&] {
        attention_backward(dq.host(), dk.host(), dv.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                           lse.cpu(), true, 0.2, none, poisoned.cpu());
      },
      "attention_backward: dsinks was given without sinks");
  Lse wrong({heads + 1});
  expect_error(
      [&] {
        attention_backward(dq.host(), dk.host(), dv.host(), dout.host(), q.host(), k.host(), v.host(), out.host(),
                           lse.cpu(), true, 0.2, o, wrong.cpu());
      },
      "attention_backward: dsinks must be float32 [heads_q] = [4], got [5]");
  for (int64_t h = 0; h < heads; ++h) ASSERT_TRUE(std::isnan(poisoned.host.get(0, h)));
}

// On the GPU the workspace is required, float32, large enough and on q's device; a rejected
// call writes nothing.
TEST(AttentionBackwardGpu, WorkspaceErrorsWriteNothing) {
  LLMK_REQUIRE_GPU();
  const int64_t d = 64;
  Heads q(DType::bf16, 1, 8, 2, d), k(DType::bf16, 1, 8, 2, d), out(DType::bf16, 1, 8, 2, d),
      dq(DType::bf16, 1, 8, 2, d), dk(DType::bf16, 1, 8, 2, d), dv(DType::bf16, 1, 8, 2, d);
  q.randomize();
  k.randomize();
  Lse lse({1, 2, 8});
  attention(out.gpu(), q.gpu(), k.gpu(), k.gpu(), false, 0.125, lse.gpu());
  const int64_t need = attention_backward_workspace_size(8, 2, d);
  Workspace ws(need);
  auto call = [&](const std::optional<TensorView>& w) {
    attention_backward(dq.gpu(), dk.gpu(), dv.gpu(), out.gpu(), q.gpu(), k.gpu(), k.gpu(), out.gpu(), lse.gpu(), false,
                       0.125, false, w);
  };
  expect_error([&] { call(std::nullopt); }, "attention_backward: CUDA tensors need a float32 workspace of");
  expect_error([&] { call(ws.view(need - 1)); }, "workspace must be a 1-d float32 tensor of at least");
  HostTensor host_ws(DType::f32, 1, need);
  expect_error([&] { call(host_ws.view(true)); }, "workspace is on cpu:0 but q is on cuda:0");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (Heads* t : {&dq, &dk, &dv}) {
    const HostTensor got = t->download();
    for (int64_t i = 0; i < got.d; ++i) ASSERT_TRUE(std::isnan(got.get(0, i))) << "element " << i << " was written";
  }
  call(ws.view(need));  // and the same call with its workspace runs
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace llmk::test
