// Gated activations (silu_and_mul, gelu_and_mul, swiglu, geglu and their backwards): the
// CPU reference against hand-computed values, finite differences and a double reference,
// the CUDA kernels against the CPU reference (both input forms, every activation and dtype,
// odd and strided rows, in-place gradients), and bad inputs.
#include "test_util.h"

namespace llmk::test {
namespace {

enum class Act { silu, gelu, gelu_tanh };
const Act kActs[] = {Act::silu, Act::gelu, Act::gelu_tanh};

const char* act_name(Act a) {
  return a == Act::silu ? "silu" : a == Act::gelu ? "gelu" : "gelu_tanh";
}

GeluApproximation approx(Act a) {
  return a == Act::gelu_tanh ? GeluApproximation::tanh : GeluApproximation::none;
}

void fused(Act a, const TensorView& out, const TensorView& x) {
  if (a == Act::silu) silu_and_mul(out, x);
  else gelu_and_mul(out, x, approx(a));
}

void fused_backward(Act a, const TensorView& dx, const TensorView& dy, const TensorView& x) {
  if (a == Act::silu) silu_and_mul_backward(dx, dy, x);
  else gelu_and_mul_backward(dx, dy, x, approx(a));
}

// The two-tensor form: swiglu for silu, geglu for the GELUs.
void two_tensor(Act a, const TensorView& out, const TensorView& gate, const TensorView& up) {
  if (a == Act::silu) swiglu(out, gate, up);
  else geglu(out, gate, up, approx(a));
}

void two_tensor_backward(Act a, const TensorView& dgate, const TensorView& dup, const TensorView& dy,
                         const TensorView& gate, const TensorView& up) {
  if (a == Act::silu) swiglu_backward(dgate, dup, dy, gate, up);
  else geglu_backward(dgate, dup, dy, gate, up, approx(a));
}

double act_value(Act a, double g) {
  switch (a) {
    case Act::silu: return g / (1 + std::exp(-g));
    // 1 + erf(z) and 1 + tanh(z) cancel for z << 0: erfc and sigmoid(2z) instead.
    case Act::gelu: return 0.5 * g * std::erfc(-g / std::sqrt(2.0));
    case Act::gelu_tanh: return g / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
  }
  return 0;
}

// d act / d g, in the same cancellation-free forms as act_value.
double act_slope(Act a, double g) {
  switch (a) {
    case Act::silu: {
      const double s = 1 / (1 + std::exp(-g));
      return s + g * s * (1 - s);
    }
    case Act::gelu: return 0.5 * std::erfc(-g / std::sqrt(2.0)) + g * std::exp(-0.5 * g * g) / std::sqrt(2 * M_PI);
    case Act::gelu_tanh: {
      // d/dg g s(2u) = s + 2 g s (1 - s) u', u = k (g + 0.044715 g^3).
      const double k = std::sqrt(2 / M_PI), s = 1 / (1 + std::exp(-2 * k * (g + 0.044715 * g * g * g)));
      return s + 2 * g * s * (1 - s) * k * (1 + 3 * 0.044715 * g * g);
    }
  }
  return 0;
}

TEST(GatedActivationCpu, MatchesHandComputedValues) {
  for (Act a : kActs) {
    HostTensor x(DType::f32, 2, 6), out(DType::f32, 2, 3);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) {
        x.set(r, c, -2.0f + c + r);   // gate
        x.set(r, c + 3, 0.5f * c - r);  // up
      }
    fused(a, out.view(), x.view());
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c)
        EXPECT_NEAR(out.get(r, c), act_value(a, -2.0 + c + r) * (0.5 * c - r), 1e-6) << act_name(a);
  }
  // The known constants: silu(1) = 1 / (1 + e^-1), gelu(1) = Phi(1) = 0.841344746...
  HostTensor x(DType::f32, 1, 2), out(DType::f32, 1, 1);
  x.set(0, 0, 1.0f);
  x.set(0, 1, 1.0f);
  silu_and_mul(out.view(), x.view());
  EXPECT_NEAR(out.get(0, 0), 0.7310585786, 1e-7);
  gelu_and_mul(out.view(), x.view());
  EXPECT_NEAR(out.get(0, 0), 0.8413447461, 1e-7);
}

// The CPU backward is the derivative of the CPU forward (central differences in f32).
TEST(GatedActivationCpu, BackwardMatchesFiniteDifferences) {
  for (Act a : kActs) {
    HostTensor x(DType::f32, 3, 10), dy(DType::f32, 3, 5), dx(DType::f32, 3, 10);
    x.randomize();
    dy.randomize();
    fused_backward(a, dx.view(), dy.view(), x.view());
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 10; ++c) {
        const float h = 1e-2f, v = x.get(r, c);
        HostTensor plus(DType::f32, 3, 5), minus(DType::f32, 3, 5);
        x.set(r, c, v + h);
        fused(a, plus.view(), x.view());
        x.set(r, c, v - h);
        fused(a, minus.view(), x.view());
        x.set(r, c, v);
        const int col = c % 5;  // gate and up column c % 5 feed output column c % 5
        const double fd = dy.get(r, col) * (double(plus.get(r, col)) - minus.get(r, col)) / (2 * h);
        EXPECT_NEAR(dx.get(r, c), fd, 2e-3 * (1 + std::fabs(fd))) << act_name(a) << " row " << r << " col " << c;
      }
  }
}

TEST(GatedActivationCpu, SwigluEqualsFusedSilu) {
  HostTensor x(DType::bf16, 4, 16), gate(DType::bf16, 4, 8), up(DType::bf16, 4, 8);
  x.randomize();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c) {
      gate.set(r, c, x.get(r, c));
      up.set(r, c, x.get(r, c + 8));
    }
  HostTensor fused_out(DType::bf16, 4, 8), two_out(DType::bf16, 4, 8);
  silu_and_mul(fused_out.view(), x.view());
  swiglu(two_out.view(), gate.view(), up.view());
  expect_equal_elements(two_out, fused_out, "swiglu vs silu_and_mul");
}

// Largest |value| of the rows x d elements: gradients are differences of terms of that size.
float max_abs(const HostTensor& t) {
  float m = 0;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.d; ++c) m = std::max(m, std::fabs(t.get(r, c)));
  return m;
}

// geglu and geglu_backward on the host against the double definition: erf and tanh forms,
// every dtype, odd sizes, strided rows (each tensor its own stride), NaN-poisoned outputs
// and the in-place gradients. The CPU path rounds once from double, so one step of the
// dtype (dtype_rtol) bounds every element.
TEST(GatedActivationCpu, GegluMatchesDoubleReference) {
  struct Shape {
    int64_t rows, d, gate_stride, up_stride, out_stride;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 1}, {3, 7, 7, 7, 7}, {5, 33, 41, 33, 40}, {2, 1000, 3000, 1003, 1000}};
  for (Act a : {Act::gelu, Act::gelu_tanh})
    for (DType dt : all_dtypes())
      for (const Shape& k : shapes) {
        SCOPED_TRACE(testing::Message() << act_name(a) << " " << dtype_name(dt) << " rows " << k.rows << " d "
                                        << k.d << " strides " << k.gate_stride << "/" << k.up_stride << "/"
                                        << k.out_stride);
        HostTensor gate(dt, k.rows, k.d, k.gate_stride), up(dt, k.rows, k.d, k.up_stride),
            dy(dt, k.rows, k.d, k.out_stride);
        gate.randomize(0.0f, 2.0f);
        up.randomize();
        dy.randomize();
        HostTensor want(DType::f32, k.rows, k.d), want_dg(DType::f32, k.rows, k.d), want_du(DType::f32, k.rows, k.d);
        for (int64_t r = 0; r < k.rows; ++r)
          for (int64_t c = 0; c < k.d; ++c) {
            const double g = gate.get(r, c), u = up.get(r, c), dyc = dy.get(r, c);
            want.set(r, c, static_cast<float>(act_value(a, g) * u));
            want_dg.set(r, c, static_cast<float>(dyc * u * act_slope(a, g)));
            want_du.set(r, c, static_cast<float>(dyc * act_value(a, g)));
          }
        const float rtol = dtype_rtol(dt);
        // expect_close's default atol plus float16's subnormal step (values below 2^-14 round
        // to multiples of 2^-24, coarser than rtol).
        auto atol = [&](const HostTensor& w) {
          return 1e-3f * rtol * max_abs(w) + (dt == DType::f16 ? 0x1p-24f : 0.0f);
        };
        HostTensor out(dt, k.rows, k.d, k.out_stride), dg(dt, k.rows, k.d, k.out_stride), du(dt, k.rows, k.d);
        out.poison();
        dg.poison();
        du.poison();
        geglu(out.view(), gate.view(), up.view(), approx(a));
        geglu_backward(dg.view(), du.view(), dy.view(), gate.view(), up.view(), approx(a));
        expect_close(out, want, rtol, "out", atol(want));
        expect_close(dg, want_dg, rtol, "dgate", atol(want_dg));
        expect_close(du, want_du, rtol, "dup", atol(want_du));
        // In place: out = up, then the gradients over their own inputs.
        HostTensor up2 = up, gate3 = gate, up3 = up;
        geglu(up2.view(), gate.view(), up2.view(), approx(a));
        expect_close(up2, want, rtol, "out in place", atol(want));
        geglu_backward(gate3.view(), up3.view(), dy.view(), gate3.view(), up3.view(), approx(a));
        expect_close(gate3, want_dg, rtol, "dgate in place", atol(want_dg));
        expect_close(up3, want_du, rtol, "dup in place", atol(want_du));
      }
}

// geglu is gelu_and_mul with the halves passed separately: the same bits, forward and backward.
TEST(GatedActivationCpu, GegluEqualsFusedGelu) {
  for (Act a : {Act::gelu, Act::gelu_tanh}) {
    SCOPED_TRACE(act_name(a));
    HostTensor x(DType::bf16, 4, 18), gate(DType::bf16, 4, 9), up(DType::bf16, 4, 9), dy(DType::bf16, 4, 9);
    x.randomize(0.0f, 2.0f);
    dy.randomize();
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 9; ++c) {
        gate.set(r, c, x.get(r, c));
        up.set(r, c, x.get(r, c + 9));
      }
    HostTensor fused_out(DType::bf16, 4, 9), two_out(DType::bf16, 4, 9), dx(DType::bf16, 4, 18),
        dg(DType::bf16, 4, 9), du(DType::bf16, 4, 9);
    fused(a, fused_out.view(), x.view());
    geglu(two_out.view(), gate.view(), up.view(), approx(a));
    expect_equal_elements(two_out, fused_out, "geglu vs gelu_and_mul");
    fused_backward(a, dx.view(), dy.view(), x.view());
    geglu_backward(dg.view(), du.view(), dy.view(), gate.view(), up.view(), approx(a));
    HostTensor dx_gate(DType::bf16, 4, 9), dx_up(DType::bf16, 4, 9);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 9; ++c) {
        dx_gate.set(r, c, dx.get(r, c));
        dx_up.set(r, c, dx.get(r, c + 9));
      }
    expect_equal_elements(dg, dx_gate, "geglu_backward dgate vs gelu_and_mul_backward");
    expect_equal_elements(du, dx_up, "geglu_backward dup vs gelu_and_mul_backward");
  }
}

struct Case {
  DType dt;
  int64_t rows, d, x_stride;  // x is [rows, 2d] with rows x_stride apart
};

// The forward and backward of `a` on the GPU (poisoned outputs) against the CPU reference
// over x [rows, 2d] and dy [rows, d]; with `in_place`, the backward again over x itself.
void expect_fused_matches_cpu(Act a, HostTensor& x, HostTensor& dy, bool in_place) {
  const float rtol = dtype_rtol(x.dtype);
  HostTensor ref(x.dtype, x.rows, dy.d), ref_dx(x.dtype, x.rows, x.d, x.row_stride);
  fused(a, ref.view(), x.view());
  fused_backward(a, ref_dx.view(), dy.view(), x.view());

  HostTensor out(x.dtype, x.rows, dy.d), dx(x.dtype, x.rows, x.d, x.row_stride);
  out.poison();
  dx.poison();
  DeviceTensor gx(x), gdy(dy), gout(out), gdx(dx);
  fused(a, gout.view(), gx.view());
  fused_backward(a, gdx.view(), gdy.view(), gx.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(gout.download(), ref, rtol, "out");
  expect_close(gdx.download(), ref_dx, rtol, "dx", rtol * max_abs(ref_dx));
  if (!in_place) return;
  // In place: the gradient overwrites x.
  fused_backward(a, gx.view(), gdy.view(), gx.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(gx.download(), ref_dx, rtol, "dx in place", rtol * max_abs(ref_dx));
}

void run_fused_case(Act a, const Case& k) {
  SCOPED_TRACE(testing::Message() << act_name(a) << " " << dtype_name(k.dt) << " rows " << k.rows
                                  << " d " << k.d << " x_stride " << k.x_stride);
  HostTensor x(k.dt, k.rows, 2 * k.d, k.x_stride), dy(k.dt, k.rows, k.d);
  x.randomize(0.0f, 2.0f);
  dy.randomize();
  expect_fused_matches_cpu(a, x, dy, true);
}

TEST(GatedActivationGpu, FusedFormMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (Act a : kActs)
    for (DType dt : all_dtypes()) {
      for (int64_t d : {1, 7, 8, 33, 1000, 4864, 14336})
        for (int64_t rows : {1, 3, 37}) run_fused_case(a, {dt, rows, d, 2 * d});
      run_fused_case(a, {dt, 19, 512, 3 * 512});      // strided rows, vector path
      run_fused_case(a, {dt, 19, 512, 2 * 512 + 1});  // unaligned rows, scalar path
    }
  // More rows than one grid column of blocks covers (gridDim.y is capped at 65535).
  run_fused_case(Act::silu, {DType::bf16, 70001, 8, 16});
}

void run_two_tensor_case(Act a, DType dt, int64_t rows, int64_t d, int64_t stride, bool in_place) {
  SCOPED_TRACE(testing::Message() << (a == Act::silu ? "swiglu " : "geglu ") << act_name(a) << " "
                                  << dtype_name(dt) << " rows " << rows << " d " << d << " stride " << stride
                                  << " in_place " << in_place);
  const float rtol = dtype_rtol(dt);
  HostTensor gate(dt, rows, d, stride), up(dt, rows, d, stride), dy(dt, rows, d, stride);
  gate.randomize(0.0f, 2.0f);
  up.randomize();
  dy.randomize();
  HostTensor ref(dt, rows, d, stride), ref_dg(dt, rows, d, stride), ref_du(dt, rows, d, stride);
  two_tensor(a, ref.view(), gate.view(), up.view());
  two_tensor_backward(a, ref_dg.view(), ref_du.view(), dy.view(), gate.view(), up.view());

  HostTensor out(dt, rows, d, stride), dg(dt, rows, d, stride), du(dt, rows, d, stride);
  out.poison();
  dg.poison();
  du.poison();
  DeviceTensor ggate(gate), gup(up), gdy(dy), gout(out), gdg(dg), gdu(du);
  if (in_place) {
    two_tensor_backward(a, ggate.view(), gup.view(), gdy.view(), ggate.view(), gup.view());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_close(ggate.download(), ref_dg, rtol, "dgate in place", rtol * max_abs(ref_dg));
    expect_close(gup.download(), ref_du, rtol, "dup in place", rtol * max_abs(ref_du));
    return;
  }
  two_tensor(a, gout.view(), ggate.view(), gup.view());
  two_tensor_backward(a, gdg.view(), gdu.view(), gdy.view(), ggate.view(), gup.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(gout.download(), ref, rtol, "out");
  expect_close(gdg.download(), ref_dg, rtol, "dgate", rtol * max_abs(ref_dg));
  expect_close(gdu.download(), ref_du, rtol, "dup", rtol * max_abs(ref_du));
}

void run_two_tensor_cases(Act a) {
  for (DType dt : all_dtypes()) {
    for (int64_t d : {1, 9, 64, 11008})
      for (int64_t rows : {1, 5}) run_two_tensor_case(a, dt, rows, d, d, false);
    run_two_tensor_case(a, dt, 7, 256, 3 * 256, false);  // slices of a wider tensor
    run_two_tensor_case(a, dt, 7, 100, 100, true);
  }
}

TEST(GatedActivationGpu, TwoTensorFormMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  run_two_tensor_cases(Act::silu);
}

// geglu: the two-tensor form with the erf and tanh GELUs (Gemma's MLP).
TEST(GatedActivationGpu, GegluMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  run_two_tensor_cases(Act::gelu);
  run_two_tensor_cases(Act::gelu_tanh);
  // Unaligned rows (odd stride): the scalar path.
  run_two_tensor_case(Act::gelu_tanh, DType::bf16, 19, 512, 2 * 512 + 1, false);
}

TEST(GatedActivationGpu, LargeInputsStayFinite) {
  LLMK_REQUIRE_GPU();
  // |gate| up to 1e4 (bf16 inputs far out in the tails): silu(-1e4) = -0, gelu(-1e4) = 0,
  // act(1e4) = 1e4; nothing overflows to inf or NaN in the forward or the backward.
  for (Act a : kActs) {
    HostTensor x(DType::bf16, 4, 16), dy(DType::bf16, 4, 8);
    x.randomize(0.0f, 5000.0f);
    dy.randomize();
    SCOPED_TRACE(act_name(a));
    expect_fused_matches_cpu(a, x, dy, false);
  }
}

class GatedActivationBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, out{DType::bf16, 4, 32};
  void SetUp() override {
    x.randomize();
    out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 32);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes) << "a rejected call wrote to out";
  }
};

TEST_F(GatedActivationBadInput, ShapesAndDtypes) {
  HostTensor odd(DType::bf16, 4, 63), wide(DType::bf16, 4, 64), rows3(DType::bf16, 3, 32), f16(DType::f16, 4, 32);
  expect_error([&] { silu_and_mul(out.view(), odd.view()); }, "x's last dim must be even");
  expect_error([&] { silu_and_mul(wide.view(), x.view()); },
               "silu_and_mul: out must have x's leading dims and a last dim of 32, got out [4, 64] and x [4, 64]");
  expect_error([&] { gelu_and_mul(rows3.view(), x.view()); }, "out must have x's leading dims");
  expect_error([&] { silu_and_mul(f16.view(), x.view()); }, "out has dtype float16, expected bfloat16");
  HostTensor gate(DType::bf16, 4, 32), up(DType::bf16, 4, 31);
  expect_error([&] { swiglu(out.view(), gate.view(), up.view()); },
               "swiglu: up must have gate's leading dims and a last dim of 32, got up [4, 31] and gate [4, 32]");
  expect_error([&] { swiglu(out.view(), gate.view(), f16.view()); }, "up has dtype float16");
  HostTensor dy(DType::bf16, 4, 32), dx_bad(DType::bf16, 4, 32);
  expect_error([&] { silu_and_mul_backward(dx_bad.view(), dy.view(), x.view()); },
               "dx must have x's leading dims and a last dim of 64");
  expect_error([&] { gelu_and_mul(out.view(), x.view(), static_cast<GeluApproximation>(7)); },
               "unknown GELU approximation");
  expect_untouched();
}

TEST_F(GatedActivationBadInput, OverlapAndDevices) {
  // out aliasing the gate half of x.
  const int64_t shape[2] = {4, 32}, strides[2] = {64, 1};
  TensorView out_in_x(x.bytes.data(), DType::bf16, Device{}, 2, shape, strides);
  expect_error([&] { silu_and_mul(out_in_x, x.view()); }, "overlap");
  HostTensor gate(DType::bf16, 4, 32), dy(DType::bf16, 4, 32);
  expect_error([&] { swiglu_backward(gate.view(), gate.view(), dy.view(), gate.view(), out.view()); },
               "dgate and dup are the same tensor");
  TensorView xg(x.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {4, 64});
  expect_error([&] { silu_and_mul(out.view(), xg); }, "out is on cpu:0 but x is on cuda:0");
  TensorView x0(x.bytes.data(), DType::bf16, Device{}, {0, 64});
  TensorView o0(out.bytes.data(), DType::bf16, Device{}, {0, 32});
  silu_and_mul(o0, x0);  // empty: a no-op
  expect_untouched();
}

TEST_F(GatedActivationBadInput, Geglu) {
  HostTensor gate(DType::bf16, 4, 32), up(DType::bf16, 4, 32), dy(DType::bf16, 4, 32), dup(DType::bf16, 4, 32);
  gate.randomize();
  up.randomize();
  dy.randomize();
  dup.poison();
  const HostTensor dup_before = dup;
  HostTensor up31(DType::bf16, 4, 31), f16(DType::f16, 4, 32), dy33(DType::bf16, 4, 33);
  expect_error([&] { geglu(out.view(), gate.view(), up31.view()); },
               "geglu: up must have gate's leading dims and a last dim of 32, got up [4, 31] and gate [4, 32]");
  expect_error([&] { geglu(out.view(), gate.view(), f16.view(), GeluApproximation::tanh); },
               "geglu: up has dtype float16, expected bfloat16");
  expect_error([&] { geglu(f16.view(), gate.view(), up.view()); }, "geglu: out has dtype float16, expected bfloat16");
  const int64_t shape[2] = {4, 32}, strides[2] = {32, 1};
  TensorView gate_i32(gate.bytes.data(), DType::i32, Device{}, 2, shape, strides);
  expect_error([&] { geglu(out.view(), gate_i32, up.view()); },
               "geglu: gate has unsupported dtype int32 (expected float32, float16 or bfloat16)");
  expect_error([&] { geglu(out.view(), gate.view(), up.view(), static_cast<GeluApproximation>(7)); },
               "geglu: unknown GELU approximation 7");
  TensorView up_gpu(up.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {4, 32});
  expect_error([&] { geglu(out.view(), gate.view(), up_gpu); }, "geglu: up is on cuda:0 but gate is on cpu:0");
  // out starting one element into gate: a partial overlap.
  const int64_t shape31[2] = {4, 31};
  TensorView out_in_gate(gate.bytes.data() + 2, DType::bf16, Device{}, 2, shape31, strides);
  TensorView gate31(gate.bytes.data(), DType::bf16, Device{}, 2, shape31, strides);
  TensorView up31_view(up.bytes.data(), DType::bf16, Device{}, 2, shape31, strides);
  expect_error([&] { geglu(out_in_gate, gate31, up31_view); },
               "geglu: out and gate overlap in memory; they must be the same tensor or disjoint");

  expect_error([&] { geglu_backward(out.view(), dup.view(), dy33.view(), gate.view(), up.view()); },
               "geglu_backward: dy must have gate's leading dims and a last dim of 32, got dy [4, 33] and "
               "gate [4, 32]");
  expect_error([&] { geglu_backward(out.view(), out.view(), dy.view(), gate.view(), up.view()); },
               "geglu_backward: dgate and dup are the same tensor, which this op does not allow");
  expect_error([&] { geglu_backward(out.view(), dy.view(), dy.view(), gate.view(), up.view()); },
               "geglu_backward: dup and dy are the same tensor, which this op does not allow");
  expect_error([&] { geglu_backward(out.view(), dup.view(), dy.view(), gate.view(), up.view(),
                                    static_cast<GeluApproximation>(7)); },
               "geglu_backward: unknown GELU approximation 7");
  TensorView g0(gate.bytes.data(), DType::bf16, Device{}, {0, 32});
  TensorView o0(out.bytes.data(), DType::bf16, Device{}, {0, 32});
  geglu(o0, g0, g0);  // empty: a no-op
  geglu_backward(o0, o0, g0, g0, g0);
  expect_untouched();
  EXPECT_EQ(dup.bytes, dup_before.bytes) << "a rejected call wrote to dup";
}

}  // namespace
}  // namespace llmk::test
