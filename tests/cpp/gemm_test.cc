// gemm: the CPU reference against an independent double computation written here, for
// every operand layout (a K- or M-major, b K- or N-major, batched a, strided rows), every
// epilogue (bias, residual, residual == out, silu_mul, gelu, gelu_tanh) and every dtype
// pair; the CUDA paths (sm80 always, small_m and sm90 where they apply, auto) against the
// same double computation with the FlashAttention rule; the sm80 kernel's unaligned path
// through its launcher; bad inputs (each rejected with a clear error, nothing written).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gemm/gemm.h"
#include "naive_dot.h"
#include "test_util.h"

namespace llmk::test {
namespace {

using Act = GemmActivation;

const char* act_name(Act a) {
  switch (a) {
    case Act::none: return "none";
    case Act::silu_mul: return "silu_mul";
    case Act::gelu: return "gelu";
    case Act::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// A logical [rows, cols] matrix in its own storage: row-major with row stride `stride`,
// or (transposed) column-major, stored as `cols` rows of `rows` elements `stride` apart.
// Storage outside the logical elements is NaN.
struct Matrix {
  HostTensor t;
  int64_t rows = 0, cols = 0;
  bool transposed = false;

  Matrix() = default;
  Matrix(DType dt, int64_t r, int64_t c, bool trans, int64_t stride)
      : t(dt, trans ? c : r, trans ? r : c, stride), rows(r), cols(c), transposed(trans) {
    t.poison();
  }
  float get(int64_t r, int64_t c) const { return transposed ? t.get(c, r) : t.get(r, c); }
  void set(int64_t r, int64_t c, float v) { transposed ? t.set(c, r, v) : t.set(r, c, v); }
  void fill_uniform(float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set(r, c, dist(rng()));
  }
  TensorView view_at(void* data, Device dev) const {
    const int64_t shape[2] = {rows, cols};
    const int64_t strides[2] = {transposed ? 1 : t.row_stride, transposed ? t.row_stride : 1};
    return TensorView(data, t.dtype, dev, 2, shape, strides);
  }
  TensorView view() { return view_at(t.bytes.data(), Device{}); }
  // [b0, rows / b0, cols] (the batched activations of a linear layer); row-major only.
  TensorView view3_at(void* data, Device dev, int64_t b0) const {
    const int64_t shape[3] = {b0, rows / b0, cols};
    const int64_t strides[3] = {rows / b0 * t.row_stride, t.row_stride, 1};
    return TensorView(data, t.dtype, dev, 3, shape, strides);
  }
  // Every storage element outside the logical matrix is still NaN.
  int64_t spoiled_gaps() const {
    int64_t bad = 0;
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = t.d; c < t.row_stride && r + 1 < t.rows; ++c) bad += !std::isnan(t.get(r, c));
    return bad;
  }
};

// One gemm problem: shapes, layouts, epilogue, dtypes.
struct Case {
  int64_t m, n, k;  // n: columns of a·bᵀ (2 * out columns for silu_mul)
  DType in = DType::bf16, out = DType::bf16;
  bool a_t = false, b_t = false;     // a M-major, b N-major
  int64_t a_pad = 0, out_pad = 0;    // extra elements per row beyond the 16-byte-aligned minimum
  bool bias = false, residual = false, in_place = false;
  Act act = Act::none;
  int64_t batch = 0;                 // > 0: a [batch, m / batch, k], out [batch, m / batch, n_out]

  int64_t n_out() const { return act == Act::silu_mul ? n / 2 : n; }
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "m " << c.m << " n " << c.n << " k " << c.k << " " << dtype_name(c.in) << "->" << dtype_name(c.out)
    << " a " << (c.a_t ? "M" : "K") << "-major b " << (c.b_t ? "N" : "K") << "-major a_pad " << c.a_pad
    << " out_pad " << c.out_pad << " bias " << c.bias << " residual " << c.residual << " in_place " << c.in_place
    << " act " << act_name(c.act) << " batch " << c.batch;
  return s.str();
}

// Inputs and outputs of one case in host memory. Rows of a and b are padded to whole
// 16-byte vectors (the API's rule), the pads are NaN.
struct Problem {
  Case c;
  Matrix a, b, bias, residual, out;

  explicit Problem(const Case& k) : c(k) {
    const int64_t v = 16 / dtype_size(k.in), vo = std::max<int64_t>(1, 16 / dtype_size(k.out));
    a = k.a_t ? Matrix(k.in, k.m, k.k, true, round_up(std::max<int64_t>(k.m, 1), v) + k.a_pad)
              : Matrix(k.in, k.m, k.k, false, round_up(std::max<int64_t>(k.k, 1), v) + k.a_pad);
    b = k.b_t ? Matrix(k.in, k.n, k.k, true, round_up(std::max<int64_t>(k.n, 1), v))
              : Matrix(k.in, k.n, k.k, false, round_up(std::max<int64_t>(k.k, 1), v));
    a.fill_uniform();
    b.fill_uniform();
    const int64_t ld_out = k.n_out() + k.out_pad;
    out = Matrix(k.out, k.m, k.n_out(), false, ld_out);
    if (k.bias) {
      bias = Matrix(k.out, 1, k.n, false, k.n);
      bias.fill_uniform();
    }
    if (k.residual) {
      residual = Matrix(k.out, k.m, k.n_out(), false, k.in_place ? ld_out : round_up(k.n_out(), vo));
      residual.fill_uniform(-4.0f, 4.0f);
      if (k.in_place) out = residual;  // out starts as the residual (gaps NaN)
    }
  }

  TensorView mat_view(const Matrix& mtx, void* data, Device dev) const {
    return c.batch > 0 && &mtx != &b && &mtx != &bias ? mtx.view3_at(data, dev, c.batch) : mtx.view_at(data, dev);
  }
  TensorView bias_view(void* data, Device dev) const {
    const int64_t shape[1] = {c.n}, strides[1] = {1};
    return TensorView(data, c.out, dev, 1, shape, strides);
  }
};

// The independent double reference: out = act(a·bᵀ + bias) + residual, in the textbook
// formulas (erf GELU, tanh GELU, x·sigmoid(x)).
std::vector<double> naive(const Problem& pr) {
  const Case& c = pr.c;
  std::vector<double> A(static_cast<size_t>(c.m * c.k)), B(static_cast<size_t>(c.n * c.k));
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t kk = 0; kk < c.k; ++kk) A[i * c.k + kk] = pr.a.get(i, kk);
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t kk = 0; kk < c.k; ++kk) B[j * c.k + kk] = pr.b.get(j, kk);
  std::vector<double> dots(static_cast<size_t>(c.m * c.n));
  naive_dot_products(A.data(), B.data(), c.m, c.n, c.k, dots.data());
  std::vector<double> z(static_cast<size_t>(c.n));
  std::vector<double> ref(static_cast<size_t>(c.m * c.n_out()));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) z[j] = dots[i * c.n + j] + (c.bias ? pr.bias.get(0, j) : 0.0);
    for (int64_t j = 0; j < c.n_out(); ++j) {
      const double v = z[j];
      double y = v;
      switch (c.act) {
        case Act::none: break;
        case Act::gelu: y = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); break;
        case Act::gelu_tanh:
          y = 0.5 * v * (1.0 + std::tanh(0.79788456080286535588 /* sqrt(2 / pi) */ * (v + 0.044715 * v * v * v)));
          break;
        case Act::silu_mul: y = v / (1.0 + std::exp(-v)) * z[j + c.n / 2]; break;
      }
      if (c.residual) y += pr.residual.get(i, j);
      ref[i * c.n_out() + j] = y;
    }
  }
  return ref;
}

// Unit roundoff of each output dtype: a value rounded once is within u |v| of v
// (plus half the f16 subnormal step).
double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    default: return 0;
  }
}
double rounded(double v, DType dt) {
  switch (dt) {
    case DType::f32: return static_cast<float>(v);
    case DType::f16: return detail::to_float(detail::from_float<detail::HostHalf>(static_cast<float>(v)));
    case DType::bf16: return detail::to_float(detail::from_float<detail::HostBFloat16>(static_cast<float>(v)));
    default: return v;
  }
}

// The CPU reference rounds the double result once: every element within one unit
// roundoff of the independent double value (1e-12 relative covers the order of the
// double sums; 2^-25 the f16 subnormal half-step).
void expect_cpu_matches(const Problem& pr, const std::vector<double>& ref) {
  const double u = unit_roundoff(pr.c.out) * (1 + 1e-9);
  double scale = 0;
  for (double v : ref) scale = std::max(scale, std::fabs(v));
  int64_t bad = 0;
  for (int64_t i = 0; i < pr.c.m; ++i)
    for (int64_t j = 0; j < pr.c.n_out(); ++j) {
      const double want = ref[i * pr.c.n_out() + j], got = pr.out.get(i, j);
      const double tol = u * std::fabs(want) + 1e-12 * scale + std::ldexp(1.0, -25);
      if (!(std::fabs(got - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << "row " << i << " col " << j << ": got " << got << ", want " << want;
    }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(pr.out.spoiled_gaps(), 0) << "out was written between its rows";
}

// GPU accuracy, the FlashAttention rule: the error against the double reference is at
// most twice that of rounding the reference itself to the output dtype, plus an atol for
// what fp32 accumulation adds. Inputs are uniform in [-1, 1], so |a_ik b_jk| <= 1 and a
// dot product has size ~ sqrt(K / 9); the tensor cores sum K products in fp32 with
// (truncating) alignment steps of ~2^-23 of the running sum, at most K / 16 + K steps in
// total, each below 2^-23 max|ref|: atol = (K + 16) * 2^-22 * max|ref| bounds that with a
// factor 2 to spare (0.05% of max|ref| at K = 1000: far below any indexing bug, which
// moves an element by O(1) of its scale), plus 1e-5 max|ref| for the fp32 epilogue
// (erfcf, __expf and the residual add, a few fp32 ulps).
void expect_gpu_matches(const Problem& pr, const Matrix& got, const std::vector<double>& ref, const char* path) {
  const Case& c = pr.c;
  double scale = 0, baseline = 0, err = 0;
  for (double v : ref) {
    scale = std::max(scale, std::fabs(v));
    baseline = std::max(baseline, std::fabs(rounded(v, c.out) - v));
  }
  const double atol = (static_cast<double>(c.k + 16) * std::ldexp(1.0, -22) + 1e-5) * scale + 1e-30;
  const double tol = 2 * baseline + atol;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n_out(); ++j) {
      const double want = ref[i * c.n_out() + j], g = got.get(i, j);
      const double e = std::fabs(g - want);
      if (!(e <= tol)) {
        if (bad++ < 5)
          ADD_FAILURE() << path << ": row " << i << " col " << j << ": got " << g << ", want " << want << " (tol "
                        << tol << ")";
        err = std::isnan(e) ? e : std::max(err, e);
      } else {
        err = std::max(err, e);
      }
    }
  EXPECT_EQ(bad, 0) << path << ": max error " << err << ", rounding baseline " << baseline << ", atol " << atol;
  EXPECT_EQ(got.spoiled_gaps(), 0) << path << ": out was written between its rows";
}

// Runs gemm on the host tensors of `pr` (the CPU path).
void run_cpu(Problem& pr) {
  GemmEpilogue ep;
  ep.activation = pr.c.act;
  if (pr.c.bias) ep.bias = pr.bias_view(pr.bias.t.bytes.data(), Device{});
  if (pr.c.residual)
    ep.residual = pr.mat_view(pr.c.in_place ? pr.out : pr.residual,
                              (pr.c.in_place ? pr.out : pr.residual).t.bytes.data(), Device{});
  gemm(pr.mat_view(pr.out, pr.out.t.bytes.data(), Device{}), pr.mat_view(pr.a, pr.a.t.bytes.data(), Device{}),
       pr.mat_view(pr.b, pr.b.t.bytes.data(), Device{}), ep);
}

void check_cpu_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  Problem pr(c);
  const std::vector<double> ref = naive(pr);
  run_cpu(pr);
  expect_cpu_matches(pr, ref);
}

const Act kActs[] = {Act::none, Act::silu_mul, Act::gelu, Act::gelu_tanh};

TEST(GemmCpu, MatchesIndependentReferenceEveryLayout) {
  for (DType in : {DType::f16, DType::bf16})
    for (bool a_t : {false, true})
      for (bool b_t : {false, true}) {
        check_cpu_case({5, 6, 9, in, DType::f32, a_t, b_t});
        check_cpu_case({1, 1, 1, in, DType::bf16, a_t, b_t});
        check_cpu_case({70, 66, 17, in, DType::f16, a_t, b_t, 8, 3});  // blocks of 64 + tails, padded rows
      }
}

TEST(GemmCpu, MatchesIndependentReferenceEveryEpilogue) {
  for (DType out : all_dtypes())
    for (Act act : kActs)
      for (int variant = 0; variant < 4; ++variant) {
        Case c{7, 10, 13, DType::bf16, out};
        c.act = act;
        c.bias = variant & 1;
        c.residual = variant >= 2;
        c.in_place = variant == 3;
        c.out_pad = variant == 2 ? 5 : 0;
        c.a_t = variant == 1;
        check_cpu_case(c);
      }
}

TEST(GemmCpu, BatchedAndStridedAndZeroK) {
  Case c{6, 12, 20, DType::f16, DType::bf16};
  c.batch = 2;
  c.a_pad = 16;
  c.out_pad = 4;
  c.bias = c.residual = true;
  check_cpu_case(c);
  c.act = Act::silu_mul;
  c.in_place = true;
  check_cpu_case(c);
  // K == 0: out = act(bias) + residual.
  Case z{4, 6, 0, DType::bf16, DType::f32};
  z.bias = z.residual = true;
  z.act = Act::gelu;
  check_cpu_case(z);
}

TEST(GemmCpu, EmptyOutputsAreNoOps) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 0}, {0, 0}}) {
    Problem pr(Case{m, n, 8});
    run_cpu(pr);  // nothing to do, nothing to fail
  }
}

// rmsnorm_linear's CPU reference: out = (x * rstd * g) · wᵀ, double throughout.
TEST(GemmCpu, RmsnormLinearMatchesIndependentReference) {
  for (DType dt : {DType::f16, DType::bf16})
    for (DType gdt : {dt, DType::f32}) {
      const int64_t m = 3, n = 5, k = 24;
      HostTensor x(dt, m, k, 32), g(gdt, 1, k), w(dt, n, k), out(dt, m, n);
      x.randomize();
      g.randomize(1.0f, 0.2f);
      w.randomize();
      out.poison();
      rmsnorm_linear(out.view(), x.view(), g.view(true), w.view(), 1e-5);
      for (int64_t i = 0; i < m; ++i) {
        double ss = 0;
        for (int64_t kk = 0; kk < k; ++kk) ss += double(x.get(i, kk)) * x.get(i, kk);
        const double rstd = 1 / std::sqrt(ss / k + 1e-5);
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t kk = 0; kk < k; ++kk) s += double(x.get(i, kk)) * rstd * g.get(0, kk) * w.get(j, kk);
          EXPECT_NEAR(out.get(i, j), s, unit_roundoff(dt) * std::fabs(s) + 1e-12) << i << " " << j;
        }
      }
    }
}

// ---------------------------------------------------------------------------------------
// Bad inputs: each raises an llmk::Error naming the op and the problem; out keeps its NaN.

struct BadFixture {
  Problem pr;
  std::vector<unsigned char> before;
  BadFixture() : pr(Case{8, 16, 32, DType::bf16, DType::f32, false, false, 0, 0, true, true}) {
    before = pr.out.t.bytes;
  }
  TensorView out() { return pr.out.view(); }
  TensorView a() { return pr.a.view(); }
  TensorView b() { return pr.b.view(); }
  void expect_untouched() { EXPECT_EQ(pr.out.t.bytes, before) << "a rejected call wrote out"; }
};

template <class F>
void expect_rejected(F&& call, const std::string& needle) {
  BadFixture f;
  expect_error([&] { call(f); }, needle);
  f.expect_untouched();
}

TEST(GemmCpu, RejectsBadInputs) {
  // dtypes
  expect_rejected([](BadFixture& f) {
    TensorView a = f.a();
    TensorView a32(a.data(), DType::f32, a.device(), 2, a.shape(), a.strides());
    gemm(f.out(), a32, f.b());
  }, "gemm: a has dtype float32");
  expect_rejected([](BadFixture& f) {
    TensorView b = f.b();
    TensorView b16(b.data(), DType::f16, b.device(), 2, b.shape(), b.strides());
    gemm(f.out(), f.a(), b16);
  }, "gemm: b has dtype float16 but a has dtype bfloat16");
  expect_rejected([](BadFixture& f) {
    TensorView o = f.out();
    TensorView oi(o.data(), DType::i32, o.device(), 2, o.shape(), o.strides());
    gemm(oi, f.a(), f.b());
  }, "gemm: out has unsupported dtype int32");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    TensorView bias = f.pr.bias_view(f.pr.bias.t.bytes.data(), Device{});
    ep.bias = TensorView(bias.data(), DType::bf16, Device{}, 1, bias.shape(), bias.strides());
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: bias has dtype bfloat16, expected float32");
  // shapes
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {16, 24}, strides[2] = {32, 1};
    gemm(f.out(), f.a(), TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides));
  }, "gemm: b has shape [16, 24] but a has K = 32");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 15}, strides[2] = {16, 1};
    gemm(TensorView(f.pr.out.t.bytes.data(), DType::f32, Device{}, 2, shape, strides), f.a(), f.b());
  }, "gemm: out has shape [8, 15], expected a's leading dims");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[3] = {2, 4, 16}, strides[3] = {64, 16, 1};
    gemm(TensorView(f.pr.out.t.bytes.data(), DType::f32, Device{}, 3, shape, strides), f.a(), f.b());
  }, "gemm: out has shape [2, 4, 16] but a has shape [8, 32]");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 16}, strides[2] = {1, 8};  // out must be row-contiguous
    gemm(TensorView(f.pr.out.t.bytes.data(), DType::f32, Device{}, 2, shape, strides), f.a(), f.b());
  }, "gemm: out must be contiguous in its last dim");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 32}, strides[2] = {64, 2};  // neither K- nor M-contiguous
    gemm(f.out(), TensorView(f.pr.a.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides), f.b());
  }, "gemm: a of shape [8, 32] and strides [64, 2] must be contiguous in K");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {16, 32}, strides[2] = {64, 2};
    gemm(f.out(), f.a(), TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides));
  }, "gemm: b of shape [16, 32] and strides [64, 2] must be contiguous in K");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    const int64_t shape[1] = {15}, strides[1] = {1};
    ep.bias = TensorView(f.pr.bias.t.bytes.data(), DType::f32, Device{}, 1, shape, strides);
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: bias must have shape [16]");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    const int64_t shape[2] = {8, 15}, strides[2] = {16, 1};
    ep.residual = TensorView(f.pr.residual.t.bytes.data(), DType::f32, Device{}, 2, shape, strides);
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: residual has shape [8, 15] but out has shape [8, 16]");
  expect_rejected([](BadFixture& f) {
    // silu_mul needs an even N: b [15, 32], out [8, 7].
    const int64_t bs[2] = {15, 32}, bst[2] = {32, 1}, os[2] = {8, 7}, ost[2] = {16, 1};
    GemmEpilogue ep;
    ep.activation = Act::silu_mul;
    gemm(TensorView(f.pr.out.t.bytes.data(), DType::f32, Device{}, 2, os, ost), f.a(),
         TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, bs, bst), ep);
  }, "gemm: silu_mul needs an even N");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    ep.activation = static_cast<Act>(42);
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: unknown activation 42");
  // 16-byte rule
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 30}, strides[2] = {30, 1};  // 60-byte rows
    gemm(f.out(), TensorView(f.pr.a.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides),
         TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, std::array<int64_t, 2>{16, 30}.data(),
                    std::array<int64_t, 2>{32, 1}.data()));
  }, "gemm: a has a stride of 30 elements (60 bytes) over its M dimension of size 8");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 24}, strides[2] = {32, 1};
    gemm(f.out(), TensorView(f.pr.a.t.bytes.data() + 2, DType::bf16, Device{}, 2, shape, strides),
         TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, std::array<int64_t, 2>{16, 24}.data(),
                    std::array<int64_t, 2>{32, 1}.data()));
  }, "is not 16-byte aligned");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {16, 32}, strides[2] = {36, 1};
    gemm(f.out(), f.a(), TensorView(f.pr.b.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides));
  }, "gemm: b has a stride of 36 elements (72 bytes) over its N dimension of size 16");
  expect_rejected([](BadFixture& f) {
    const int64_t shape[2] = {8, 32}, strides[2] = {1, 12};  // M-major, 24-byte columns
    gemm(f.out(), TensorView(f.pr.a.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides), f.b());
  }, "gemm: a has a stride of 12 elements (24 bytes) over its K dimension of size 32");
  // overlap
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    const int64_t shape[2] = {8, 16}, strides[2] = {16, 1};
    ep.residual = TensorView(f.pr.out.t.bytes.data() + 4, DType::f32, Device{}, 2, shape, strides);
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: out and residual overlap in memory");
  expect_rejected([](BadFixture& f) {
    // out on top of a (as bf16, the same bytes)
    const int64_t shape[2] = {8, 16}, strides[2] = {32, 1};
    gemm(TensorView(f.pr.a.t.bytes.data(), DType::bf16, Device{}, 2, shape, strides), f.a(), f.b());
  }, "gemm: out and a overlap in memory");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    const int64_t shape[1] = {16}, strides[1] = {1};
    ep.bias = TensorView(f.pr.out.t.bytes.data(), DType::f32, Device{}, 1, shape, strides);
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: out and bias overlap in memory");
  // devices (no memory is touched before the check, so a fake CUDA view works anywhere)
  expect_rejected([](BadFixture& f) {
    TensorView b = f.b();
    gemm(f.out(), f.a(), TensorView(b.data(), b.dtype(), Device{DeviceType::cuda, 0}, 2, b.shape(), b.strides()));
  }, "gemm: b is on cuda:0 but a is on cpu:0");
  expect_rejected([](BadFixture& f) {
    GemmEpilogue ep;
    TensorView r = f.pr.residual.view();
    ep.residual = TensorView(r.data(), r.dtype(), Device{DeviceType::cuda, 0}, 2, r.shape(), r.strides());
    gemm(f.out(), f.a(), f.b(), ep);
  }, "gemm: residual is on cuda:0 but a is on cpu:0");
}

TEST(GemmCpu, LayoutChoiceForSizeOneDims) {
  // a [M, 1] with strides (1, 1): M-contiguous, no 16-byte row rule to break.
  Case c{9, 8, 1, DType::bf16, DType::f32};
  Problem pr(c);
  std::vector<double> ref = naive(pr);
  // pack a densely as [9, 1]: element i at i
  HostTensor dense(DType::bf16, 1, 9);
  for (int64_t i = 0; i < 9; ++i) dense.set(0, i, pr.a.get(i, 0));
  const int64_t shape[2] = {9, 1}, strides[2] = {1, 1};
  HostTensor bd(DType::bf16, 1, 8);
  for (int64_t j = 0; j < 8; ++j) bd.set(0, j, pr.b.get(j, 0));
  const int64_t bshape[2] = {8, 1}, bstrides[2] = {1, 1};
  gemm(pr.out.view(), TensorView(dense.bytes.data(), DType::bf16, Device{}, 2, shape, strides),
       TensorView(bd.bytes.data(), DType::bf16, Device{}, 2, bshape, bstrides));
  expect_cpu_matches(pr, ref);
}

TEST(GemmCpu, RmsnormLinearRejectsBadInputs) {
  HostTensor x(DType::bf16, 4, 32), g(DType::bf16, 1, 32), w(DType::bf16, 8, 32), out(DType::bf16, 4, 8);
  x.randomize();
  g.randomize();
  w.randomize();
  out.poison();
  const std::vector<unsigned char> before = out.bytes;
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w.view(), -1.0); },
               "rmsnorm_linear: eps must be a finite number >= 0");
  HostTensor w16(DType::f16, 8, 32);
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w16.view(), 1e-6); },
               "rmsnorm_linear: weight has dtype float16, expected bfloat16");
  HostTensor w_bad(DType::bf16, 8, 24);
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w_bad.view(), 1e-6); },
               "rmsnorm_linear: weight must be 2-d [N, 32]");
  HostTensor out_bad(DType::bf16, 4, 7);
  expect_error([&] { rmsnorm_linear(out_bad.view(), x.view(), g.view(true), w.view(), 1e-6); },
               "rmsnorm_linear: out has shape [4, 7]");
  HostTensor x_odd(DType::bf16, 4, 30);
  HostTensor g_odd(DType::bf16, 1, 30), w_odd(DType::bf16, 8, 30);
  expect_error([&] { rmsnorm_linear(out.view(), x_odd.view(), g_odd.view(true), w_odd.view(), 1e-6); },
               "rmsnorm_linear: x has a stride of 30 elements (60 bytes)");
  HostTensor x32(DType::f32, 4, 32);
  expect_error([&] { rmsnorm_linear(out.view(), x32.view(), g.view(true), w.view(), 1e-6); },
               "rmsnorm_linear: x has dtype float32");
  EXPECT_EQ(out.bytes, before);
}

// ---------------------------------------------------------------------------------------
// GPU: every path against the double reference.

// Sets LLMK_GEMM_PATH for the scope of one call.
struct PathScope {
  explicit PathScope(const char* path) { setenv("LLMK_GEMM_PATH", path, 1); }
  ~PathScope() { unsetenv("LLMK_GEMM_PATH"); }
};

struct DeviceMatrix {
  std::optional<DeviceTensor> d;
  explicit DeviceMatrix(const Matrix& m) { d.emplace(m.t); }
  void* data() const { return d->data; }
  Matrix download(const Matrix& like) const {
    Matrix m = like;
    m.t = d->download();
    return m;
  }
};

// Runs one case through `path` on the GPU; returns false (with the reason in *why) when
// the forced path declined the call.
bool run_gpu(const Problem& pr, const char* path, Matrix& result, std::string* why) {
  const Case& c = pr.c;
  const Device dev{DeviceType::cuda, 0};
  DeviceMatrix a(pr.a), b(pr.b), out(pr.out);
  std::optional<DeviceMatrix> bias, residual;
  GemmEpilogue ep;
  ep.activation = c.act;
  if (c.bias) {
    bias.emplace(pr.bias);
    ep.bias = pr.bias_view(bias->data(), dev);
  }
  if (c.residual && !c.in_place) {
    residual.emplace(pr.residual);
    ep.residual = pr.mat_view(pr.residual, residual->data(), dev);
  }
  const TensorView out_view = pr.mat_view(pr.out, out.data(), dev);
  if (c.in_place) ep.residual = out_view;
  try {
    PathScope scope(path);
    gemm(out_view, pr.mat_view(pr.a, a.data(), dev), pr.mat_view(pr.b, b.data(), dev), ep);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("cannot take this call") != std::string::npos) {
      *why = msg;
      return false;
    }
    throw;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  result = out.download(pr.out);
  return true;
}

// small_m's contract: M <= 64, K-major b, k > 0 a whole number of 16-byte vectors.
bool small_m_applies(const Case& c) { return c.m <= detail::kGemmSmallM && !c.b_t && c.k > 0 && c.k % 8 == 0; }
bool sm90_applies(const Case& c) {
  const DeviceInfo info = device_info(0);
  // The Hopper kernel writes its inputs' dtype (other out dtypes take the mma.sync kernel).
  return info.cc_major == 9 && info.cc_minor == 0 && c.k > 0 && c.out == c.in;
}

void check_gpu_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  Problem pr(c);
  const std::vector<double> ref = naive(pr);
  std::vector<const char*> paths = {"sm80", "auto"};
  if (small_m_applies(c)) paths.push_back("small_m");
  if (sm90_applies(c)) paths.push_back("sm90");
  for (const char* path : paths) {
    Matrix got;
    std::string why;
    if (!run_gpu(pr, path, got, &why)) {
      // The Hopper kernel is absent from builds without sm_90a: a note, not a failure.
      // small_m's contract names b only; a declined M-major a is noted, not failed.
      if (std::string(path) == "sm90" || c.a_t) {
        std::printf("[ note ] %s: %s\n", describe(c).c_str(), why.c_str());
        continue;
      }
      ADD_FAILURE() << path << " declined a call it should take: " << why;
      continue;
    }
    expect_gpu_matches(pr, got, ref, path);
  }
}

// Sizes: 1, odd, around the 64/128 tile edges, K not a multiple of 32/64, M >> N and
// N >> M, one 1000^3 problem (about 1 s of CPU reference).
TEST(GemmGpu, ShapesAndLayouts) {
  LLMK_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {1, 1, 1},
      {7, 7, 7},
      {1, 1000, 300},
      {7, 129, 65, DType::f16, DType::f32},
      {63, 65, 129},
      {64, 64, 64, DType::f16, DType::f16},
      {65, 129, 63},
      {129, 300, 1000, DType::bf16, DType::f32},
      {1000, 7, 300},
      {7, 1000, 300, DType::f16, DType::bf16},
      {300, 63, 129, DType::f16, DType::f16},
      {1000, 1000, 1000},
      {129, 300, 65, DType::bf16, DType::bf16, true, false},  // a M-major
      {129, 300, 65, DType::f16, DType::f32, false, true},    // b N-major
      {300, 129, 1000, DType::bf16, DType::f16, true, true},  // both
      {1, 63, 129, DType::bf16, DType::bf16, true, true},
      {64, 65, 7, DType::f16, DType::bf16, true, false},
      {65, 1, 300, DType::bf16, DType::f32, false, true},
      {300, 129, 65, DType::bf16, DType::bf16, false, false, 24, 5},  // strided a and out rows
      {63, 300, 129, DType::f16, DType::f32, true, true, 8, 3},       // strided transposed a, out
      {264, 136, 200, DType::bf16, DType::bf16, true, true},           // transposed, sm90-friendly
      {129, 136, 72, DType::f16, DType::f16, false, true},
  };
  for (const Case& c : cases) check_gpu_case(c);
}

TEST(GemmGpu, Epilogues) {
  LLMK_REQUIRE_GPU();
  for (DType out : all_dtypes())
    for (Act act : kActs)
      for (int variant = 0; variant < 3; ++variant) {
        // variant 0: bias; 1: residual; 2: bias + residual == out
        for (int64_t m : {int64_t{33}, int64_t{130}}) {
          // K = 129 (a K tail) for M = 33; K = 136 for M = 130, which the Hopper kernel takes
          // (it wants whole 16-byte K rows), so that sm90's epilogue is covered too.
          Case c{m, 130, m == 130 ? 136 : 129, out == DType::f16 ? DType::f16 : DType::bf16, out};
          c.act = act;
          c.bias = variant != 1;
          c.residual = variant >= 1;
          c.in_place = variant == 2;
          c.out_pad = variant == 1 ? 6 : 0;
          c.b_t = m == 130 && variant == 1;
          check_gpu_case(c);
        }
      }
}

// The Hopper kernel's split-K (few tiles, long K: M 33-256 against a projection): pieces of
// unequal length and a K tail in the last, reduced in clusters (one tile row) or through
// partial sums (two tile rows and more), every layout the kernel takes, the epilogues the
// split paths apply in their reductions (bias, gelu, residual in place), and silu_mul, which
// does not split. One tile row wider than a wave of blocks (the SM count + 5 tiles): the
// whole wave as one call, the last columns as a second call split in clusters.
TEST(GemmGpu, SplitKFewTiles) {
  LLMK_REQUIRE_GPU();
  std::vector<Case> cases = {
      {65, 300, 2048},                                          // one tile row: 8 pieces in a cluster
      {100, 520, 4104},                                         // 65 k steps: pieces of 9, the last 2
      {200, 136, 4104, DType::f16, DType::f16},                 // a K tail in the last piece
      {256, 520, 4096},
      {128, 128, 4096, DType::bf16, DType::bf16, true, true},   // weight-gradient layout, in a cluster
      {200, 128, 4096, DType::bf16, DType::bf16, true, true},   // the same through partial sums
      {129, 264, 3072, DType::f16, DType::f16, false, true},    // input-gradient layout
  };
  const int64_t wave = device_info(0).sm_count;  // the Hopper kernel runs one block per SM
  Case wide{37, (wave + 5) * 256 - 100, 1024};    // the last tile partial
  wide.bias = wide.residual = wide.in_place = true;
  wide.act = Act::gelu;
  cases.push_back(wide);
  wide.b_t = true;  // input-gradient layout (N a multiple of 8): the tail's B columns
  wide.n = (wave + 5) * 256 - 96;
  wide.in_place = false;
  wide.act = Act::none;
  cases.push_back(wide);
  // 129 rows: two-block clusters (the second block's tile mostly past M); 100: one tile row,
  // one-block clusters.
  for (int64_t m : {129, 100}) {
    for (Act act : kActs) {
      Case c{m, 264, 4096};
      c.act = act;
      c.bias = true;
      c.residual = act != Act::none;
      c.in_place = act == Act::gelu;
      cases.push_back(c);
    }
  }
  for (const Case& c : cases) check_gpu_case(c);
}

TEST(GemmGpu, BatchedAndZeroK) {
  LLMK_REQUIRE_GPU();
  Case c{6, 65, 129, DType::bf16, DType::bf16};  // a [2, 3, K]
  c.batch = 2;
  c.bias = c.residual = true;
  check_gpu_case(c);
  c.act = Act::silu_mul;
  c.n = 130;
  c.m = 300;
  c.batch = 3;
  c.a_pad = 16;
  c.out_pad = 2;
  check_gpu_case(c);
  Case z{70, 9, 0, DType::f16, DType::f32};  // K == 0: out = act(bias) + residual
  z.bias = z.residual = true;
  z.act = Act::gelu_tanh;
  check_gpu_case(z);
  Case e{0, 9, 16};  // M == 0: nothing launched
  Problem pr(e);
  Matrix got;
  std::string why;
  EXPECT_TRUE(run_gpu(pr, "auto", got, &why));
}

// Small-M calls back to back on one stream, each reading what the one before wrote (the
// second's weight is the first's output, poisoned before it; the third's x the second's
// output) and the third writing over the second's x: a launch that read or wrote before the
// previous one completed (an overlapped launch, e.g. programmatic dependent launch) fails
// here. Each result is checked against the product of what the GPU actually holds.
TEST(GemmGpu, SmallMCallsBackToBackSeeEachOthersWrites) {
  LLMK_REQUIRE_GPU();
  const Device dev{DeviceType::cuda, 0};
  Matrix a1(DType::bf16, 64, 256, false, 256), b1(DType::bf16, 1024, 256, false, 256);
  Matrix w2(DType::bf16, 64, 1024, false, 1024), x(DType::bf16, 5, 1024, false, 1024);
  Matrix y(DType::bf16, 5, 64, false, 64), w3(DType::bf16, 1024, 64, false, 64);
  a1.fill_uniform();
  b1.fill_uniform();
  x.fill_uniform();
  w3.fill_uniform();
  DeviceMatrix da1(a1), db1(b1), dw2(w2), dx(x), dy(y), dw3(w3);
  {
    PathScope scope("small_m");
    gemm(w2.view_at(dw2.data(), dev), a1.view_at(da1.data(), dev), b1.view_at(db1.data(), dev), GemmEpilogue{});
    gemm(y.view_at(dy.data(), dev), x.view_at(dx.data(), dev), w2.view_at(dw2.data(), dev), GemmEpilogue{});
    gemm(x.view_at(dx.data(), dev), y.view_at(dy.data(), dev), w3.view_at(dw3.data(), dev), GemmEpilogue{});
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Matrix w2_got = dw2.download(w2), y_got = dy.download(y), z_got = dx.download(x);
  // got ≈ a · bᵀ (bf16 output: relative to the largest reference element)
  auto expect_product = [](const Matrix& got, const Matrix& a, const Matrix& b, const char* what) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < got.rows; ++i)
      for (int64_t j = 0; j < got.cols; ++j) {
        double ref = 0;
        for (int64_t kk = 0; kk < a.cols; ++kk) ref += double(a.get(i, kk)) * b.get(j, kk);
        const double g = got.get(i, j);
        worst = std::isfinite(g) ? std::max(worst, std::abs(g - ref)) : INFINITY;
        scale = std::max(scale, std::abs(ref));
      }
    EXPECT_LE(worst, 1e-2 * scale) << what;
  };
  expect_product(w2_got, a1, b1, "first call");
  expect_product(y_got, x, w2_got, "second call (weight written by the first)");
  expect_product(z_got, y_got, w3, "third call (x written by the second, out over the second's x)");
}

// The sm80 kernel's element-wise path, which the API's 16-byte rule never selects: call
// the launcher directly with odd row strides and pointers one element off 16 bytes.
TEST(GemmGpu, Sm80UnalignedOperands) {
  LLMK_REQUIRE_GPU();
  for (bool a_t : {false, true})
    for (bool b_t : {false, true}) {
      Case c{37, 45, 51, DType::f16, DType::f32, a_t, b_t};
      c.bias = c.residual = true;
      c.act = Act::gelu;
      SCOPED_TRACE(describe(c));
      // Storage with odd strides: a element (i, k) at 1 + (a_t ? k * lda + i : i * lda + k).
      const int64_t lda = (a_t ? c.m : c.k) + 2, ldb = (b_t ? c.n : c.k) + 4;
      Matrix a(c.in, a_t ? c.k : c.m, lda, false, lda), b(c.in, b_t ? c.k : c.n, ldb, false, ldb);
      Problem pr(c);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const float v = pr.a.get(i, kk);
          a_t ? a.set(kk, 1 + i, v) : a.set(i, 1 + kk, v);
        }
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const float v = pr.b.get(j, kk);
          b_t ? b.set(kk, 1 + j, v) : b.set(j, 1 + kk, v);
        }
      const std::vector<double> ref = naive(pr);
      DeviceMatrix da(a), db(b), dout(pr.out), dbias(pr.bias), dres(pr.residual);
      detail::GemmParams p{};
      p.out = dout.data();
      p.ld_out = pr.out.t.row_stride;
      p.a = static_cast<const char*>(da.data()) + 2;
      p.lda = lda;
      p.a_k_major = !a_t;
      p.b = static_cast<const char*>(db.data()) + 2;
      p.ldb = ldb;
      p.b_k_major = !b_t;
      p.bias = dbias.data();
      p.residual = dres.data();
      p.ld_residual = pr.residual.t.row_stride;
      p.m = c.m;
      p.n = c.n;
      p.k = c.k;
      p.activation = c.act;
      p.in_dtype = c.in;
      p.out_dtype = c.out;
      detail::gemm_sm80_cuda(p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expect_gpu_matches(pr, dout.download(pr.out), ref, "sm80 unaligned");
    }
}

TEST(GemmGpu, RejectsBadPathsAndDeviceMix) {
  LLMK_REQUIRE_GPU();
  Problem pr(Case{100, 64, 64});
  const Device dev{DeviceType::cuda, 0};
  DeviceMatrix a(pr.a), b(pr.b), out(pr.out);
  const TensorView ov = pr.out.view_at(out.data(), dev), av = pr.a.view_at(a.data(), dev),
                   bv = pr.b.view_at(b.data(), dev);
  {
    PathScope scope("small_m");  // M = 100 > 64
    expect_error([&] { gemm(ov, av, bv); }, "gemm: LLMK_GEMM_PATH=small_m cannot take this call");
  }
  {
    PathScope scope("fastest");
    expect_error([&] { gemm(ov, av, bv); }, "gemm: LLMK_GEMM_PATH=fastest is not one of auto, sm90, small_m, sm80");
  }
  expect_error([&] { gemm(ov, pr.a.view(), bv); }, "gemm: b is on cuda:0 but a is on cpu:0");
  expect_error([&] { gemm(pr.out.view(), av, bv); }, "gemm: out is on cpu:0 but a is on cuda:0");
  const Matrix after = out.download(pr.out);
  EXPECT_EQ(after.t.bytes, pr.out.t.bytes) << "a rejected call wrote out";
}

}  // namespace
}  // namespace llmk::test
