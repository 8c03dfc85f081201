// rmsnorm_linear: out = rmsnorm(x, g, eps) · Wᵀ in one launch.
//   * CPU: llmk::rmsnorm_linear on host tensors (the CPU reference) against an independent
//     naive loop written here from the definition: rstd = 1 / sqrt(mean(x^2) + eps) per row,
//     xn = round_to_x_dtype(x * rstd * g) (rmsnorm's output is in x's dtype, so the fused op
//     mirrors rmsnorm followed by a linear), out = sum_k xn * w in double, rounded once.
//   * GPU: the CUDA kernel against the same naive loop and against the CPU reference, for
//     every M regime (1, 3, 16, 64, and 65, 130: several 64-token chunks), N with tails (1, 8,
//     100, 4096), K multiple of 8 but not of the kernel's tiles (8, 64, 1000, 4096), f16 and
//     bf16, norm weight in x's dtype and in f32, strided x rows, outputs with NaN-poisoned
//     gaps between rows (an unwritten element, or a write into a gap, fails).
//   * Bad inputs: dtype, shape, misaligned rows, CPU/CUDA mix; nothing is written.
//
// Tolerance (the FlashAttention rule with the output's own rounding as the reference
// kernel's error): max |out - ref| <= 2 * max |round_T(ref) - ref| + atol, ref the naive
// loop's unrounded double. atol covers what rounding the output does not: the kernel takes
// rstd in fp32 (rsqrtf of an fp32 sum) where the naive loop uses double, so an element of xn
// that sits on a rounding boundary of T can round the other way. Each such flip moves an
// output by at most ulp_T(max |xn|) * max |w|, and a flip needs x * rstd * g within ~1e-6
// relative of a boundary (a fraction ~1e-6 / 2^-8 of the elements for bf16): we allow 4 flips
// per output (expected far below 1 even at K = 4096), plus K * 2^-22 * sum |xn w| for fp32
// accumulation.
#include <cmath>
#include <string>
#include <vector>

#include "naive_dot.h"
#include "test_util.h"

namespace llmk::test {
namespace {

float round_to(DType dt, float v) {
  return detail::dispatch_dtype(dt, "test", [&](auto tag) {
    using T = detail::host_type_t<decltype(tag)>;
    return detail::to_float(detail::from_float<T>(v));
  });
}

// Relative spacing of T's values (one ulp at 1.0).
double ulp_at_one(DType dt) { return dt == DType::bf16 ? 1.0 / 128 : dt == DType::f16 ? 1.0 / 1024 : 1.0 / 8388608; }

// The naive loop of the definition. Returns out[i * n + j] unrounded (double) and fills
// `atol` per the rule above.
struct Naive {
  std::vector<double> out;
  double atol = 0;
};

// Host values of a tensor as floats, [rows][d] densely.
std::vector<float> dense(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.rows * t.d));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.d; ++c) v[static_cast<size_t>(r * t.d + c)] = t.get(r, c);
  return v;
}

Naive naive_rmsnorm_linear(const HostTensor& x, const HostTensor& g, const HostTensor& w, double eps) {
  const int64_t m = x.rows, k = x.d, n = w.rows;
  const std::vector<float> xv = dense(x), gv = dense(g), wv = dense(w);
  Naive r;
  r.out.assign(static_cast<size_t>(m * n), 0.0);
  std::vector<double> xn(static_cast<size_t>(m * k)), abs_dots(static_cast<size_t>(m * n));
  double max_xn = 0, max_w = 0, max_abs_dot = 0;
  for (float v : wv) max_w = std::max(max_w, std::fabs(double(v)));
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = xv.data() + i * k;
    double ss = 0;
    for (int64_t c = 0; c < k; ++c) ss += double(xi[c]) * xi[c];
    const double rstd = 1.0 / std::sqrt(ss / double(k) + eps);
    for (int64_t c = 0; c < k; ++c) {
      double& v = xn[static_cast<size_t>(i * k + c)];
      v = round_to(x.dtype, static_cast<float>(double(xi[c]) * rstd * gv[c]));
      max_xn = std::max(max_xn, std::fabs(v));
    }
  }
  naive_dot_products(xn.data(), wv.data(), m, n, k, r.out.data(), abs_dots.data());
  for (double v : abs_dots) max_abs_dot = std::max(max_abs_dot, v);
  r.atol = 4.0 * ulp_at_one(x.dtype) * max_xn * max_w + double(k) * std::ldexp(1.0, -22) * max_abs_dot + 1e-30;
  return r;
}

// max |got - want| <= 2 * max |round_T(ref) - ref| + ref.atol + extra over the m x n
// elements (want = ref.out unless given); NaN fails.
void expect_fa_rule(const HostTensor& got, const Naive& ref, const char* what, const std::vector<double>* want = nullptr,
                    double extra = 0) {
  const int64_t m = got.rows, n = got.d;
  double round_err = 0, max_err = 0;
  int64_t bad_nan = 0, at_i = -1, at_j = -1;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t e = static_cast<size_t>(i * n + j);
      const double r = ref.out[e];
      round_err = std::max(round_err, std::fabs(double(round_to(got.dtype, static_cast<float>(r))) - r));
      const double v = got.get(i, j), target = want ? (*want)[e] : r;
      if (std::isnan(v)) {
        if (bad_nan++ == 0) ADD_FAILURE() << what << ": NaN at row " << i << " col " << j;
        continue;
      }
      if (std::fabs(v - target) > max_err) {
        max_err = std::fabs(v - target);
        at_i = i;
        at_j = j;
      }
    }
  const double bound = 2.0 * round_err + ref.atol + extra;
  EXPECT_EQ(bad_nan, 0) << what << ": " << bad_nan << " NaN outputs";
  EXPECT_LE(max_err, bound) << what << ": max |out - ref| " << max_err << " at (" << at_i << ", " << at_j
                            << "), bound " << bound << " (2 x rounding " << round_err << " + atol " << ref.atol
                            << " + " << extra << ")";
}

// The row gaps of a strided output (columns [d, row_stride) of each row but the last) are
// still NaN.
void expect_gaps_untouched(const HostTensor& t, const char* what) {
  int64_t written = 0;
  for (int64_t i = 0; i + 1 < t.rows; ++i)
    for (int64_t c = t.d; c < t.row_stride; ++c) written += !std::isnan(t.get(i, c));
  EXPECT_EQ(written, 0) << what << ": " << written << " elements written between rows";
}

struct Case {
  DType dt, gdt;
  int64_t m, n, k;
  int64_t x_stride = -1;    // -1: k (contiguous)
  int64_t out_stride = -1;  // -1: n
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dt)) + " g " + dtype_name(c.gdt) + " M " + std::to_string(c.m) + " N " +
         std::to_string(c.n) + " K " + std::to_string(c.k) + " x_stride " + std::to_string(c.x_stride) +
         " out_stride " + std::to_string(c.out_stride);
}

struct Inputs {
  HostTensor x, g, w;
  explicit Inputs(const Case& c)
      : x(c.dt, c.m, c.k, c.x_stride), g(c.gdt, 1, c.k), w(c.dt, c.n, c.k) {
    x.randomize(0.0f, 2.0f);
    g.randomize(1.0f, 0.5f);
    // Unit-variance outputs: w ~ N(0, 1/K).
    w.randomize(0.0f, static_cast<float>(1.0 / std::sqrt(double(c.k))));
  }
};

constexpr double kEps = 1e-5;

// ---------------------------------------------------------------------------------------
// CPU reference against the naive loop.

TEST(RmsnormLinearCpu, MatchesNaiveLoop) {
  const Case cases[] = {
      {DType::bf16, DType::bf16, 1, 1, 8},       {DType::f16, DType::f32, 3, 8, 64},
      {DType::bf16, DType::f32, 5, 100, 1000, 1024}, {DType::f16, DType::f16, 16, 33, 200, 208, 40},
      {DType::bf16, DType::bf16, 65, 17, 96},     {DType::f16, DType::f32, 2, 7, 4096},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Inputs in(c);
    HostTensor out(c.dt, c.m, c.n, c.out_stride);
    out.poison();
    rmsnorm_linear(out.view(), in.x.view(), in.g.view(true), in.w.view(), kEps);
    expect_fa_rule(out, naive_rmsnorm_linear(in.x, in.g, in.w, kEps), "cpu");
    if (c.out_stride > c.n) expect_gaps_untouched(out, "cpu");
  }
}

TEST(RmsnormLinearCpu, HandComputed) {
  // x = [3, 4, 0 x 6] (rows padded to 16 bytes): mean(x^2) = 25 / 8; g = [1, 2, 1 x 6];
  // w rows [1, 0, ...] and [1, 1, 0, ...]: out = [3 r, 3 r + 8 r].
  HostTensor x(DType::f16, 1, 8), g(DType::f32, 1, 8), w(DType::f16, 2, 8), out(DType::f16, 1, 2);
  for (int c = 0; c < 8; ++c) {
    x.set(0, c, c == 0 ? 3.0f : c == 1 ? 4.0f : 0.0f);
    g.set(0, c, c == 1 ? 2.0f : 1.0f);
    w.set(0, c, c == 0 ? 1.0f : 0.0f);
    w.set(1, c, c < 2 ? 1.0f : 0.0f);
  }
  rmsnorm_linear(out.view(), x.view(), g.view(true), w.view(), 0.0);
  const double r = 1.0 / std::sqrt(25.0 / 8.0);
  // f16: the output and xn each rounded once (half an ulp, 2^-11 relative, each).
  EXPECT_NEAR(out.get(0, 0), 3.0 * r, 3.0 * r * 2e-3);
  EXPECT_NEAR(out.get(0, 1), 11.0 * r, 11.0 * r * 2e-3);
}

// ---------------------------------------------------------------------------------------
// GPU kernel against the naive loop and the CPU reference.

void run_gpu_case(const Case& c, bool compare_cpu) {
  SCOPED_TRACE(describe(c));
  Inputs in(c);
  const Naive ref = naive_rmsnorm_linear(in.x, in.g, in.w, kEps);
  HostTensor out(c.dt, c.m, c.n, c.out_stride);
  out.poison();
  DeviceTensor dx(in.x), dg(in.g), dw(in.w), dout(out);
  rmsnorm_linear(dout.view(), dx.view(), dg.view(true), dw.view(), kEps);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = dout.download();
  expect_fa_rule(got, ref, "gpu vs naive");
  if (c.out_stride > c.n) expect_gaps_untouched(got, "gpu");
  if (compare_cpu) {
    // Against the CPU reference: |gpu - cpu| <= |gpu - naive| + |naive - cpu|, the first
    // bounded by the rule, the second measured.
    HostTensor cpu(c.dt, c.m, c.n, c.out_stride);
    cpu.poison();
    rmsnorm_linear(cpu.view(), in.x.view(), in.g.view(true), in.w.view(), kEps);
    std::vector<double> cpu_values(static_cast<size_t>(c.m * c.n));
    double cpu_err = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        const size_t e = static_cast<size_t>(i * c.n + j);
        cpu_values[e] = cpu.get(i, j);
        cpu_err = std::max(cpu_err, std::fabs(cpu_values[e] - ref.out[e]));
      }
    expect_fa_rule(got, ref, "gpu vs cpu reference", &cpu_values, cpu_err);
  }
}

TEST(RmsnormLinearGpu, MatchesReferenceOverShapes) {
  LLMK_REQUIRE_GPU();
  const DType combos[4][2] = {
      {DType::bf16, DType::bf16}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}, {DType::f16, DType::f16}};
  int index = 0;
  for (int64_t m : {1, 3, 16, 64, 65, 130})
    for (int64_t n : {1, 8, 100, 4096})
      for (int64_t k : {8, 64, 1000, 4096}) {
        // The largest products only for the decode sizes (CPU time of the naive loop).
        if (n == 4096 && k == 4096 && m != 1 && m != 16 && m != 64) continue;
        const DType* dts = combos[index % 4];
        Case c{dts[0], dts[1], m, n, k};
        if (index % 3 == 1) c.x_stride = k + 8;      // strided x rows (16-byte aligned)
        if (index % 5 == 2) c.out_stride = n + 3;     // strided out rows, NaN gaps
        ++index;
        run_gpu_case(c, n * k <= 100 * 1000);
      }
}

TEST(RmsnormLinearGpu, DtypesStridesAndPoisonedGaps) {
  LLMK_REQUIRE_GPU();
  for (DType dt : {DType::f16, DType::bf16})
    for (DType gdt : {dt, DType::f32}) {
      run_gpu_case({dt, gdt, 19, 300, 1000, 3 * 1000 + 8, 301}, true);
      run_gpu_case({dt, gdt, 64, 4096, 512, 1024, 4099}, false);  // the fused qkv-slice case
      run_gpu_case({dt, gdt, 1, 4099, 4096, -1, -1}, false);       // N tail, M = 1
    }
}

TEST(RmsnormLinearGpu, DecodeShapes) {
  LLMK_REQUIRE_GPU();
  // Llama-3-8B's qkv projection after the attention norm (N 6144, K 4096), and a down-
  // projection-like long K with few rows.
  for (int64_t m : {1, 16, 64}) run_gpu_case({DType::bf16, DType::bf16, m, 6144, 4096}, false);
  run_gpu_case({DType::bf16, DType::f32, 4, 512, 14336}, false);
}

TEST(RmsnormLinearGpu, RepeatedCallsAreDeterministic) {
  LLMK_REQUIRE_GPU();
  const Case c{DType::bf16, DType::bf16, 16, 4096, 4096};
  Inputs in(c);
  HostTensor out(c.dt, c.m, c.n);
  out.poison();
  DeviceTensor dx(in.x), dg(in.g), dw(in.w), d1(out), d2(out);
  rmsnorm_linear(d1.view(), dx.view(), dg.view(true), dw.view(), kEps);
  rmsnorm_linear(d2.view(), dx.view(), dg.view(true), dw.view(), kEps);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_equal_elements(d1.download(), d2.download(), "two identical calls");
}

// ---------------------------------------------------------------------------------------
// Bad inputs: rejected before any work, the poisoned output untouched.

class RmsnormLinearBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, g{DType::bf16, 1, 64}, w{DType::bf16, 32, 64}, out{DType::bf16, 4, 32};
  void SetUp() override {
    x.randomize();
    g.randomize();
    w.randomize();
    out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 32);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes) << "a rejected call wrote to out";
  }
};

TEST_F(RmsnormLinearBadInput, WrongDtypes) {
  HostTensor x32(DType::f32, 4, 64), g16(DType::f16, 1, 64), w16(DType::f16, 32, 64), out16(DType::f16, 4, 32);
  HostTensor out32(DType::f32, 4, 32);
  expect_error([&] { rmsnorm_linear(out32.view(), x32.view(), g.view(true), w.view(), kEps); }, "x has dtype float32");
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g16.view(true), w.view(), kEps); }, "norm_weight has dtype float16");
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w16.view(), kEps); }, "weight has dtype float16");
  expect_error([&] { rmsnorm_linear(out16.view(), x.view(), g.view(true), w.view(), kEps); }, "out has dtype float16");
  expect_error([&] { rmsnorm_linear(out32.view(), x.view(), g.view(true), w.view(), kEps); }, "out has dtype float32");
  expect_untouched();
}

TEST_F(RmsnormLinearBadInput, WrongShapes) {
  HostTensor w65(DType::bf16, 32, 65), g63(DType::bf16, 1, 63), out33(DType::bf16, 4, 33), out3(DType::bf16, 3, 32);
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w65.view(), kEps); }, "weight must be 2-d [N, 64]");
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g63.view(true), w.view(), kEps); }, "norm_weight must have shape [64]");
  expect_error([&] { rmsnorm_linear(out33.view(), x.view(), g.view(true), w.view(), kEps); }, "out has shape");
  expect_error([&] { rmsnorm_linear(out3.view(), x.view(), g.view(true), w.view(), kEps); }, "out has shape");
  expect_untouched();
}

TEST_F(RmsnormLinearBadInput, MisalignedRowsAndPointers) {
  // x rows 60 elements apart (120 bytes): not a whole number of 16-byte vectors.
  HostTensor x_odd(DType::bf16, 4, 56, 60);
  x_odd.randomize();
  HostTensor g56(DType::bf16, 1, 56), w56(DType::bf16, 32, 56);
  g56.randomize();
  w56.randomize();
  expect_error([&] { rmsnorm_linear(out.view(), x_odd.view(), g56.view(true), w56.view(), kEps); },
               "x has a stride of 60");
  // A weight whose data pointer is 2 bytes past a 16-byte boundary.
  HostTensor w_big(DType::bf16, 33, 64);
  w_big.randomize();
  const TensorView w_shift(w_big.bytes.data() + 2, DType::bf16, Device{}, {32, 64});
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), w_shift, kEps); },
               "weight data pointer");
  expect_untouched();
}

TEST_F(RmsnormLinearBadInput, DeviceMix) {
  const TensorView wg(w.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {32, 64});
  const TensorView gg(g.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {64});
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), g.view(true), wg, kEps); }, "weight is on cuda:0 but x is on cpu");
  expect_error([&] { rmsnorm_linear(out.view(), x.view(), gg, w.view(), kEps); }, "norm_weight is on cuda:0 but x is on cpu");
  expect_untouched();
}

TEST(RmsnormLinearGpuBadInput, HostWeightWithDeviceInput) {
  LLMK_REQUIRE_GPU();
  HostTensor x(DType::bf16, 2, 64), g(DType::bf16, 1, 64), w(DType::bf16, 8, 64), out(DType::bf16, 2, 8);
  x.randomize();
  g.randomize();
  w.randomize();
  out.poison();
  DeviceTensor dx(x), dg(g), dout(out);
  expect_error([&] { rmsnorm_linear(dout.view(), dx.view(), dg.view(true), w.view(), kEps); },
               "weight is on cpu:0 but x is on cuda:0");
  EXPECT_EQ(dout.download().bytes, out.bytes);
}

}  // namespace
}  // namespace llmk::test
