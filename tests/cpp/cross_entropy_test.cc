// cross_entropy: the CPU reference against an independent double computation written here
// (PyTorch's formulation through log-probabilities) and against finite differences of its
// own loss; the CUDA kernels against the CPU reference (every kernel path: loss only, the
// register-resident gradient, the two-pass gradient, unaligned rows; strided rows, in-place
// gradient, ignored and masked rows, out-of-range targets); bad inputs.
#include <limits>
#include <sstream>
#include <utility>

#include "test_util.h"

namespace llmk::test {
namespace {

constexpr int64_t kIgnore = -100;
const double kInf = std::numeric_limits<double>::infinity();

struct Case {
  DType dt;
  int64_t rows, vocab, stride;
  double eps = 0.0, z_loss = 0.0, grad_scale = 1.0;
  bool grad = true, in_place = false, i32 = false;
  int ignore_every = 0;         // every ignore_every-th row is ignored (0: none, 1: all)
  bool masked_entries = false;  // columns c % 5 == 3 are -inf (never the target's)
  int masked_rows = 0;          // the first rows are entirely -inf
  float magnitude = 3.0f;       // logits are N(0, magnitude)
};

std::string describe(const Case& k) {
  std::ostringstream s;
  s << dtype_name(k.dt) << " rows " << k.rows << " vocab " << k.vocab << " stride " << k.stride << " eps "
    << k.eps << " z_loss " << k.z_loss << " grad_scale " << k.grad_scale << " grad " << k.grad << " in_place "
    << k.in_place << " i32 " << k.i32 << " ignore_every " << k.ignore_every << " masked_entries "
    << k.masked_entries << " masked_rows " << k.masked_rows;
  return s.str();
}

// Targets as int64 or int32 in a HostTensor's storage ([1, rows]; viewed as [rows]).
struct Targets {
  HostTensor storage;
  std::vector<int64_t> values;
  Targets(bool i32, std::vector<int64_t> v)
      : storage(i32 ? DType::i32 : DType::i64, 1, static_cast<int64_t>(v.size())), values(std::move(v)) {
    for (size_t r = 0; r < values.size(); ++r) {
      if (i32) {
        const int32_t t = static_cast<int32_t>(values[r]);
        std::memcpy(storage.bytes.data() + r * 4, &t, 4);
      } else {
        std::memcpy(storage.bytes.data() + r * 8, &values[r], 8);
      }
    }
  }
};

struct Inputs {
  HostTensor logits;
  Targets target;
};

Inputs make_inputs(const Case& k) {
  HostTensor x(k.dt, k.rows, k.vocab, k.stride);
  x.randomize(0.0f, k.magnitude);
  std::uniform_int_distribution<int64_t> cls(0, k.vocab - 1);
  std::vector<int64_t> t(static_cast<size_t>(k.rows));
  for (int64_t r = 0; r < k.rows; ++r) {
    t[r] = cls(rng());
    if (k.masked_entries && k.vocab > 4 && t[r] % 5 == 3) --t[r];
    if (k.ignore_every > 0 && r % k.ignore_every == k.ignore_every - 1) t[r] = kIgnore;
    for (int64_t c = 0; c < k.vocab; ++c)
      if (r < k.masked_rows || (k.masked_entries && k.vocab > 4 && c % 5 == 3)) x.set(r, c, -INFINITY);
  }
  return {std::move(x), Targets(k.i32, std::move(t))};
}

struct Outputs {
  HostTensor loss, lse, dlogits;
  explicit Outputs(const Case& k)
      : loss(DType::f32, 1, k.rows), lse(DType::f32, 1, k.rows), dlogits(k.dt, k.rows, k.vocab, k.stride) {
    loss.poison();
    lse.poison();
    dlogits.poison();
  }
};

// Runs the op on host tensors (the CPU path). With in_place the gradient overwrites in.logits.
void run_cpu(const Case& k, Inputs& in, Outputs& out) {
  std::optional<TensorView> dl;
  if (k.grad) dl = k.in_place ? in.logits.view() : out.dlogits.view();
  cross_entropy(out.loss.view(true), out.lse.view(true), in.logits.view(), in.target.storage.view(true), kIgnore,
                k.eps, k.z_loss, k.grad_scale, dl);
  if (k.grad && k.in_place) out.dlogits = in.logits;
}

// The same on device copies; the results come back into `out`.
void run_gpu(const Case& k, const Inputs& in, Outputs& out) {
  DeviceTensor x(in.logits), t(in.target.storage), loss(out.loss), lse(out.lse), dl(out.dlogits);
  std::optional<TensorView> dlv;
  if (k.grad) dlv = k.in_place ? x.view() : dl.view();
  cross_entropy(loss.view(true), lse.view(true), x.view(), t.view(true), kIgnore, k.eps, k.z_loss, k.grad_scale,
                dlv);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.loss = loss.download();
  out.lse = lse.download();
  if (k.grad) out.dlogits = (k.in_place ? x : dl).download();
}

// The independent reference: log-probabilities in double, then PyTorch's
//   loss = (1 - eps) * -logp_t + eps * mean_j(-logp_j) + z_loss lse^2.
struct Expected {
  std::vector<double> loss, lse;
  std::vector<std::vector<double>> grad;
};

Expected expected(const Case& k, const Inputs& in) {
  Expected e;
  const double V = static_cast<double>(k.vocab);
  for (int64_t r = 0; r < k.rows; ++r) {
    std::vector<double> z(static_cast<size_t>(k.vocab));
    double m = -kInf;
    for (int64_t c = 0; c < k.vocab; ++c) m = std::max(m, z[c] = in.logits.get(r, c));
    double s = 0;
    for (int64_t c = 0; c < k.vocab; ++c) s += m == -kInf ? 0.0 : std::exp(z[c] - m);
    const double lse = m == -kInf ? -kInf : m + std::log(s);
    const int64_t t = in.target.values[r];
    const bool ignored = t == kIgnore;
    double nll = 0, smooth = 0;
    std::vector<double> g(static_cast<size_t>(k.vocab), 0.0);
    for (int64_t c = 0; c < k.vocab; ++c) {
      const double logp = z[c] - lse;
      if (c == t) nll = -logp;
      smooth -= logp / V;
      const double p = m == -kInf ? 0.0 : std::exp(logp);
      if (!ignored)  // (a fully masked row: p = 0 and lse = -inf, whose product counts as 0)
        g[c] = k.grad_scale * ((p == 0 ? 0.0 : p * (1 + 2 * k.z_loss * lse)) - (1 - k.eps) * (c == t) - k.eps / V);
    }
    double loss = 0;
    if (!ignored) loss = m == -kInf ? kInf : (1 - k.eps) * nll + (k.eps > 0 ? k.eps * smooth : 0.0) + k.z_loss * lse * lse;
    e.loss.push_back(loss);
    e.lse.push_back(lse);
    e.grad.push_back(std::move(g));
  }
  return e;
}

// float16 gradients below 6e-5 are subnormal, in steps of 2^-24.
double subnormal_step(DType dt) { return dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0; }

double finite_or_zero(double v) { return std::isfinite(v) ? std::fabs(v) : 0.0; }

// |got - want| <= tol (infinities must match exactly; NaN fails).
void expect_value(double got, double want, double tol, const char* what, int64_t r, int64_t c = -1) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what << " row " << r << " col " << c;
    return;
  }
  EXPECT_LE(std::fabs(got - want), tol) << what << " row " << r << " col " << c << ": got " << got << ", want "
                                        << want;
}

// loss and lse within `tol` (absolute, relative to the row's scale), dlogits within one
// rounding of its dtype plus `gtol`.
void check_against_expected(const Case& k, const Inputs& in, const Outputs& out, double tol, double gtol) {
  const Expected e = expected(k, in);
  const double rtol = dtype_rtol(k.dt);
  for (int64_t r = 0; r < k.rows; ++r) {
    const double scale = 1 + finite_or_zero(e.lse[r]) + finite_or_zero(e.loss[r]);
    expect_value(out.loss.get(0, r), e.loss[r], tol * scale, "loss", r);
    expect_value(out.lse.get(0, r), e.lse[r], tol * scale, "lse", r);
    if (!k.grad) continue;
    for (int64_t c = 0; c < k.vocab; ++c) {
      const double want = e.grad[r][c];
      if (in.target.values[r] == kIgnore) {
        ASSERT_EQ(out.dlogits.get(r, c), 0.0f) << "ignored row " << r << " col " << c;
        continue;
      }
      expect_value(out.dlogits.get(r, c), want,
                   rtol * std::fabs(want) + gtol * std::fabs(k.grad_scale) + subnormal_step(k.dt), "dlogits", r, c);
    }
  }
}

// The CPU path: loss and lse are rounded once from double (2^-24 relative to the terms),
// dlogits once to its dtype (1e-7 for the double-to-float step of small gradients).
void check_cpu_case(Case k) {
  SCOPED_TRACE(describe(k));
  Inputs in = make_inputs(k);
  const Inputs original = in;
  Outputs out(k);
  run_cpu(k, in, out);
  check_against_expected(k, original, out, 2e-7, 1e-7);
}

TEST(CrossEntropyCpu, MatchesIndependentReference) {
  for (DType dt : all_dtypes()) {
    check_cpu_case({dt, 5, 37, 37});                                      // odd vocab
    check_cpu_case({dt, 1, 1, 1});                                        // one class: loss 0
    check_cpu_case({dt, 1, 1000, 1000, 0.1, 1e-4});                       // one row
    check_cpu_case({dt, 6, 33, 40, 0.1, 1e-4, 0.5});                      // strided rows
    check_cpu_case({dt, 9, 64, 64, 0.0, 0.0, 1.0 / 6, true, false, false, 3});  // ignored rows, mean scale
    check_cpu_case({dt, 4, 50, 50, 0.1, 1e-4, 1.0, true, false, false, 0, true});  // -inf entries
    check_cpu_case({dt, 4, 50, 50, 0.0, 1e-4, 1.0, true, false, false, 0, true, 1});  // + a fully masked row
    check_cpu_case({dt, 7, 129, 131, 0.1, 1e-4, 0.25, true, true, true, 2});  // in place, int32, strided
    check_cpu_case({dt, 3, 300, 300, 0.1, 1e-4, 1.0, false});             // no gradient
  }
}

TEST(CrossEntropyCpu, AllIgnoredBatch) {
  Case k{DType::bf16, 5, 40, 40, 0.1, 1e-4, 1.0, true, false, false, 1};
  Inputs in = make_inputs(k);
  Outputs out(k);
  run_cpu(k, in, out);
  check_against_expected(k, in, out, 2e-7, 1e-7);
  for (int64_t r = 0; r < k.rows; ++r) {
    EXPECT_EQ(out.loss.get(0, r), 0.0f);
    EXPECT_TRUE(std::isfinite(out.lse.get(0, r))) << "lse is written for ignored rows";
  }
}

// The gradient is the derivative of the loss: central differences of the CPU loss (f32
// logits, so the loss's double math resolves steps of 1e-2), label smoothing and a z-loss
// large enough to matter.
TEST(CrossEntropyCpu, GradientMatchesFiniteDifferences) {
  Case k{DType::f32, 3, 11, 11, 0.1, 0.05, 1.0};
  Inputs in = make_inputs(k);
  Outputs out(k);
  run_cpu(k, in, out);
  auto total_loss = [&] {
    Outputs o(k);
    Case no_grad = k;
    no_grad.grad = false;
    run_cpu(no_grad, in, o);
    double s = 0;
    for (int64_t r = 0; r < k.rows; ++r) s += o.loss.get(0, r);
    return s;
  };
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.vocab; ++c) {
      const double fd = central_difference(in.logits, r, c, total_loss);
      EXPECT_NEAR(out.dlogits.get(r, c), fd, 2e-3 * (1 + std::fabs(fd))) << "row " << r << " col " << c;
    }
}

TEST(CrossEntropyCpu, ZeroTokensIsANoOp) {
  HostTensor x(DType::f32, 1, 8), loss(DType::f32, 1, 1), lse(DType::f32, 1, 1);
  Targets t(false, {0});
  TensorView x0(x.bytes.data(), DType::f32, Device{}, {0, 8});
  TensorView l0(loss.bytes.data(), DType::f32, Device{}, {0});
  TensorView s0(lse.bytes.data(), DType::f32, Device{}, {0});
  TensorView t0(t.storage.bytes.data(), DType::i64, Device{}, {0});
  cross_entropy(l0, s0, x0, t0, kIgnore, 0.0, 0.0, 1.0, x0);
}

// ---------------------------------------------------------------- GPU

// The GPU against the CPU reference. loss and lse: fp32 sums of up to 262144 ex2.approx
// terms and fp32 differences of terms of the row's scale (|lse|, max z): 3e-5 of that
// scale. dlogits: one rounding to the dtype plus the fp32 softmax's error (~1e-5 of the
// largest gradient term, |grad_scale|), 3e-5.
void run_gpu_case(const Case& k) {
  SCOPED_TRACE(describe(k));
  Inputs in = make_inputs(k);
  Outputs want(k), got(k);
  Inputs cpu_in = in;
  run_cpu(k, cpu_in, want);
  run_gpu(k, in, got);
  const double rtol = dtype_rtol(k.dt);
  for (int64_t r = 0; r < k.rows; ++r) {
    double zmax = 0;
    for (int64_t c = 0; c < k.vocab; ++c)
      if (std::isfinite(in.logits.get(r, c))) zmax = std::max(zmax, double(std::fabs(in.logits.get(r, c))));
    const double scale = 1 + zmax + finite_or_zero(want.lse.get(0, r)) + finite_or_zero(want.loss.get(0, r));
    expect_value(got.loss.get(0, r), want.loss.get(0, r), 3e-5 * scale, "loss", r);
    expect_value(got.lse.get(0, r), want.lse.get(0, r), 3e-5 * scale, "lse", r);
  }
  if (!k.grad) return;
  int64_t bad = 0;
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.vocab; ++c) {
      const double g = got.dlogits.get(r, c), w = want.dlogits.get(r, c);
      const double tol = rtol * std::fabs(w) + 3e-5 * std::fabs(k.grad_scale) + subnormal_step(k.dt);
      if (!(std::fabs(g - w) <= tol) && bad++ < 5)
        ADD_FAILURE() << "dlogits row " << r << " col " << c << ": got " << g << ", want " << w;
    }
  EXPECT_EQ(bad, 0) << "dlogits elements out of tolerance";
}

TEST(CrossEntropyGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (int64_t vocab : {1, 7, 4096, 32000, 128256})
      for (bool grad : {true, false}) {
        const int64_t rows = vocab >= 32000 ? 3 : 37;
        run_gpu_case({dt, rows, vocab, vocab, 0.0, 0.0, 1.0, grad});
        run_gpu_case({dt, rows, vocab, vocab, 0.1, 1e-4, 1.0 / rows, grad, false, false, 4});
      }
}

TEST(CrossEntropyGpu, KernelPathsStridesInPlace) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case({dt, 3, 65536, 65536, 0.1, 1e-4});                   // longest register-resident bf16 row
    run_gpu_case({dt, 2, 65544, 65544, 0.1, 1e-4});                   // two-pass, vector loads
    run_gpu_case({dt, 2, 262144, 262144, 0.1, 1e-4, 0.5});            // Gemma's vocabulary
    run_gpu_case({dt, 9, 1003, 1003, 0.1, 1e-4});                     // unaligned rows: scalar loop
    run_gpu_case({dt, 9, 4096, 3 * 4096, 0.1, 1e-4, 0.3, true, false, true});   // strided rows, int32
    run_gpu_case({dt, 5, 32000, 32008, 0.0, 1e-4, 1.0, true, true});  // in place, strided
    run_gpu_case({dt, 2, 128256, 128256, 0.1, 1e-4, 1.0, true, true});  // in place, two-pass
    run_gpu_case({dt, 7, 1001, 1001, 0.0, 0.0, 1.0, true, true});     // in place, scalar loop
    run_gpu_case({dt, 11, 2048, 2048, 0.0, 1e-4, 1.0, true, false, false, 0, true, 2});  // -inf entries, masked rows
    run_gpu_case({dt, 4, 70000, 70000, 0.1, 0.0, 1.0, true, false, false, 0, true, 1});  // the same, two-pass
    run_gpu_case({dt, 5, 4096, 4096, 0.1, 1e-4, 1.0, true, false, false, 1});  // every row ignored
    run_gpu_case({dt, 5, 4096, 4096, 0.0, 0.0, 1.0, true, false, false, 0, false, 0, 1e3f});  // logits of 1e3
  }
}

// cross_entropy_backward from the forward's lse and a per-row dloss: on `gpu` or the CPU,
// with the gradient written to a poisoned tensor or into (a copy of) the logits. Returns dlogits.
HostTensor run_backward(const Case& k, Inputs in, HostTensor lse, HostTensor dloss, bool gpu) {
  HostTensor dl(k.dt, k.rows, k.vocab, k.stride);
  dl.poison();
  if (!gpu) {
    HostTensor& out = k.in_place ? in.logits : dl;
    cross_entropy_backward(out.view(), dloss.view(true), in.logits.view(), in.target.storage.view(true), lse.view(true),
                           kIgnore, k.eps, k.z_loss);
    return out;
  }
  DeviceTensor x(in.logits), t(in.target.storage), l(lse), d(dloss), out(dl);
  DeviceTensor& o = k.in_place ? x : out;
  cross_entropy_backward(o.view(), d.view(true), x.view(), t.view(true), l.view(true), kIgnore, k.eps, k.z_loss);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return o.download();
}

HostTensor random_dloss(const Case& k) {
  HostTensor dloss(DType::f32, 1, k.rows);
  dloss.randomize(0.0f, 1.0f);
  return dloss;
}

// The backward equals the forward's fused gradient (grad_scale 1) scaled by each row's dloss.
void check_backward_against_forward(Case k) {
  SCOPED_TRACE(describe(k));
  k.grad_scale = 1.0;
  Inputs in = make_inputs(k);
  Inputs fwd_in = in;
  Outputs fwd(k);
  run_cpu(k, fwd_in, fwd);
  const HostTensor dloss = random_dloss(k);
  const HostTensor got = run_backward(k, in, fwd.lse, dloss, false);
  const double rtol = dtype_rtol(k.dt);
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.vocab; ++c) {
      const double want = fwd.dlogits.get(r, c) * dloss.get(0, r);
      expect_value(got.get(r, c), want, 2 * rtol * std::fabs(want) + 1e-7 + subnormal_step(k.dt), "dlogits", r, c);
    }
}

TEST(CrossEntropyBackwardCpu, IsTheForwardGradientScaledByDloss) {
  for (DType dt : all_dtypes()) {
    check_backward_against_forward({dt, 9, 37, 37, 0.1, 1e-4});
    check_backward_against_forward({dt, 8, 64, 70, 0.0, 0.0, 1.0, true, true, true, 3});  // strided, in place, ignored
    check_backward_against_forward({dt, 6, 50, 50, 0.0, 1e-4, 1.0, true, false, false, 0, true, 2});  // -inf, masked rows
  }
}

// The GPU kernel against the CPU reference on both load paths, in place, with -inf entries,
// ignored rows and logits of 1e3; every element of the poisoned output written.
TEST(CrossEntropyBackwardGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (const Case& k : std::vector<Case>{{dt, 5, 1, 1, 0.1, 1e-4},
                                           {dt, 37, 7, 7, 0.1, 1e-4, 1.0, true, false, false, 4},
                                           {dt, 9, 4096, 4096, 0.1, 1e-4},
                                           {dt, 3, 32000, 32008, 0.0, 1e-4, 1.0, true, true},
                                           {dt, 2, 128256, 128256, 0.1, 1e-4, 1.0, true, false, true, 2},
                                           {dt, 9, 1003, 1003, 0.1, 0.0},
                                           {dt, 11, 2048, 2048, 0.0, 1e-4, 1.0, true, false, false, 0, true, 2},
                                           {dt, 5, 4096, 4096, 0.0, 0.0, 1.0, true, false, false, 0, false, 0, 1e3f}}) {
      SCOPED_TRACE(describe(k));
      Inputs in = make_inputs(k);
      Inputs fwd_in = in;
      Outputs fwd(k);
      Case loss_only = k;
      loss_only.grad = false;
      run_cpu(loss_only, fwd_in, fwd);
      const HostTensor dloss = random_dloss(k);
      const HostTensor want = run_backward(k, in, fwd.lse, dloss, false);
      const HostTensor got = run_backward(k, in, fwd.lse, dloss, true);
      int64_t bad = 0;
      for (int64_t r = 0; r < k.rows; ++r)
        for (int64_t c = 0; c < k.vocab; ++c) {
          const double g = got.get(r, c), w = want.get(r, c);
          const double tol = dtype_rtol(k.dt) * std::fabs(w) + 3e-5 * std::fabs(dloss.get(0, r)) + subnormal_step(k.dt);
          if (!(std::fabs(g - w) <= tol) && bad++ < 5)
            ADD_FAILURE() << "dlogits row " << r << " col " << c << ": got " << g << ", want " << w;
        }
      EXPECT_EQ(bad, 0) << "dlogits elements out of tolerance";
    }
}

// GPU rows whose target is outside [0, vocab): NaN loss and gradient in that row only,
// its lse valid, the other rows unaffected.
TEST(CrossEntropyGpu, OutOfRangeTargetGivesNaNRow) {
  LLMK_REQUIRE_GPU();
  for (int64_t vocab : {7, 4096, 128256}) {
    Case k{DType::bf16, 4, vocab, vocab, 0.1, 1e-4};
    Inputs in = make_inputs(k);
    Inputs cpu_in = in;
    Outputs want(k), got(k);
    run_cpu(k, cpu_in, want);
    std::vector<int64_t> bad_targets = in.target.values;
    bad_targets[1] = vocab;
    bad_targets[2] = -5;
    in.target = Targets(false, bad_targets);
    run_gpu(k, in, got);
    for (int64_t r = 0; r < k.rows; ++r) {
      const bool bad = r == 1 || r == 2;
      EXPECT_NEAR(got.lse.get(0, r), want.lse.get(0, r), 1e-4 * (1 + std::fabs(want.lse.get(0, r))));
      if (bad) EXPECT_TRUE(std::isnan(got.loss.get(0, r))) << "row " << r;
      else EXPECT_NEAR(got.loss.get(0, r), want.loss.get(0, r), 1e-4 * (1 + std::fabs(want.loss.get(0, r))));
      for (int64_t c = 0; c < vocab; ++c)
        if (bad) ASSERT_TRUE(std::isnan(got.dlogits.get(r, c))) << "row " << r << " col " << c;
        else ASSERT_FALSE(std::isnan(got.dlogits.get(r, c))) << "row " << r << " col " << c;
    }
  }
}

// ---------------------------------------------------------------- bad inputs

class CrossEntropyBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, loss{DType::f32, 1, 4}, lse{DType::f32, 1, 4}, dl{DType::bf16, 4, 64};
  Targets t{false, {1, 2, kIgnore, 63}};
  void SetUp() override {
    x.randomize();
    loss.poison();
    lse.poison();
    dl.poison();
  }
  void call(const TensorView& l, const TensorView& s, const TensorView& logits, const TensorView& target,
            std::optional<TensorView> d = std::nullopt, double eps = 0.0, double z = 0.0, double g = 1.0) {
    cross_entropy(l, s, logits, target, kIgnore, eps, z, g, d);
  }
  void expect_untouched() {
    HostTensor fresh_row(DType::f32, 1, 4), fresh_dl(DType::bf16, 4, 64);
    fresh_row.poison();
    fresh_dl.poison();
    EXPECT_EQ(loss.bytes, fresh_row.bytes) << "a rejected call wrote to loss";
    EXPECT_EQ(lse.bytes, fresh_row.bytes) << "a rejected call wrote to lse";
    EXPECT_EQ(dl.bytes, fresh_dl.bytes) << "a rejected call wrote to dlogits";
  }
};

TEST_F(CrossEntropyBadInput, DtypesAndShapes) {
  HostTensor xi(DType::i32, 4, 64), lf16(DType::f16, 1, 4), short_loss(DType::f32, 1, 3), dl_f16(DType::f16, 4, 64),
      dl_short(DType::bf16, 4, 63);
  HostTensor tf(DType::f32, 1, 4);
  Targets t3(false, {1, 2, 3});
  const TensorView L = loss.view(true), S = lse.view(true), X = x.view(), T = t.storage.view(true);
  expect_error([&] { call(L, S, xi.view(), T); },
               "cross_entropy: logits has unsupported dtype int32 (expected float32, float16 or bfloat16)");
  expect_error([&] { call(lf16.view(true), S, X, T); }, "cross_entropy: loss has dtype float16, expected float32");
  expect_error([&] { call(L, lf16.view(true), X, T); }, "cross_entropy: lse has dtype float16, expected float32");
  expect_error([&] { call(L, S, X, tf.view(true)); }, "cross_entropy: target has dtype float32, expected int64 or int32");
  expect_error([&] { call(L, S, X, t3.storage.view(true)); }, "cross_entropy: target must have shape [4], got [3]");
  expect_error([&] { call(short_loss.view(true), S, X, T); }, "cross_entropy: loss must have shape [4], got [3]");
  expect_error([&] { call(L, S, X, T, dl_f16.view()); }, "cross_entropy: dlogits has dtype float16, expected bfloat16");
  expect_error([&] { call(L, S, X, T, dl_short.view()); },
               "cross_entropy: dlogits has shape [4, 63] but logits has shape [4, 64]");
  const int64_t shape3[3] = {2, 2, 64}, strides3[3] = {128, 64, 1};
  expect_error([&] { call(L, S, TensorView(x.bytes.data(), DType::bf16, Device{}, 3, shape3, strides3), T); },
               "cross_entropy: logits must be 2-d [tokens, vocab], got shape [2, 2, 64]");
  expect_untouched();
}

TEST_F(CrossEntropyBadInput, ScalarsTargetsOverlapDevices) {
  const TensorView L = loss.view(true), S = lse.view(true), X = x.view(), T = t.storage.view(true);
  expect_error([&] { call(L, S, X, T, dl.view(), 1.5); }, "cross_entropy: label_smoothing must be in [0, 1], got 1.5");
  expect_error([&] { call(L, S, X, T, dl.view(), 0.0, -1e-4); }, "cross_entropy: z_loss must be >= 0, got -0.0001");
  expect_error([&] { call(L, S, X, T, dl.view(), 0.0, 0.0, 1e300); }, "cross_entropy: grad_scale must be finite in float32");
  Targets high(false, {1, 64, 2, 3}), negative(true, {1, 2, 3, -1});
  expect_error([&] { call(L, S, X, high.storage.view(true), dl.view()); },
               "cross_entropy: target[1] = 64 is out of range for 64 classes");
  expect_error([&] { call(L, S, X, negative.storage.view(true), dl.view()); },
               "cross_entropy: target[3] = -1 is out of range");
  // dlogits overlapping logits partially (shifted by one row): rejected; identical: allowed below.
  const int64_t shape[2] = {4, 64}, strides[2] = {64, 1};
  std::vector<unsigned char> big(5 * 64 * 2);
  TensorView logits_big(big.data(), DType::bf16, Device{}, 2, shape, strides);
  TensorView shifted(big.data() + 64 * 2, DType::bf16, Device{}, 2, shape, strides);
  expect_error([&] { call(L, S, logits_big, T, shifted); },
               "cross_entropy: dlogits and logits overlap in memory; they must be the same tensor or disjoint");
  expect_error([&] { call(L, L, X, T); }, "cross_entropy: loss and lse are the same tensor");
  TensorView xg(x.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {4, 64});
  expect_error([&] { call(L, S, xg, T); }, "cross_entropy: target is on cpu:0 but logits is on cuda:0");
  HostTensor empty_vocab(DType::f32, 4, 1);
  TensorView x_v0(empty_vocab.bytes.data(), DType::f32, Device{}, {4, 0});
  expect_error([&] { call(L, S, x_v0, T); }, "cross_entropy: logits has 4 rows of 0 classes");
  expect_untouched();
}

}  // namespace
}  // namespace llmk::test
