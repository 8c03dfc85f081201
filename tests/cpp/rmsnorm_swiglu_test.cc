// rmsnorm_swiglu (gated RMSNorm: rmsnorm(x) * w' * silu(gate)) and its backward: the CPU
// reference against the composition rmsnorm -> swiglu and against finite differences, the
// CUDA kernels against the CPU reference on the register and the loop paths (odd and
// strided rows, weight dtypes, Gemma's offset, in-place forward), and bad inputs.
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

TEST(RMSNormSwigluCpu, EqualsRmsnormThenSwiglu) {
  const int64_t rows = 4, d = 33;
  HostTensor x(DType::f32, rows, d), gate(DType::f32, rows, d), w(DType::f32, 1, d);
  x.randomize();
  gate.randomize();
  w.randomize();
  HostTensor fused(DType::f32, rows, d), normed(DType::f32, rows, d), composed(DType::f32, rows, d);
  rmsnorm_swiglu(fused.view(), x.view(), gate.view(), w.view(true), 1e-6, 0.5);
  rmsnorm(normed.view(), x.view(), w.view(true), 1e-6, 0.5);
  swiglu(composed.view(), gate.view(), normed.view());
  expect_close(fused, composed, 1e-6f, "fused vs composed");
}

// Loss L = sum(dy * rmsnorm_swiglu(x, gate)); dL/dx, dL/dgate and dL/dw by central differences.
TEST(RMSNormSwigluCpu, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, d = 13;
  HostTensor x(DType::f32, rows, d), gate(DType::f32, rows, d), w(DType::f32, 1, d), dy(DType::f32, rows, d);
  x.randomize();
  gate.randomize(0.0f, 2.0f);
  w.randomize();
  dy.randomize();
  const double eps = 1e-3, offset = 0.25;
  HostTensor dx(DType::f32, rows, d), dgate(DType::f32, rows, d), dw(DType::f32, 1, d);
  rmsnorm_swiglu_backward(dx.view(), dgate.view(), dw.view(true), dy.view(), x.view(), gate.view(),
                          w.view(true), eps, offset);
  auto loss = [&]() {
    HostTensor y(DType::f32, rows, d);
    rmsnorm_swiglu(y.view(), x.view(), gate.view(), w.view(true), eps, offset);
    double l = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) l += double(dy.get(r, c)) * y.get(r, c);
    return l;
  };
  auto check = [&](HostTensor& t, const HostTensor& grad, const char* what) {
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.d; ++c)
        EXPECT_NEAR(grad.get(r, c), central_difference(t, r, c, loss), 3e-3) << what << " " << r << "," << c;
  };
  check(x, dx, "dx");
  check(gate, dgate, "dgate");
  check(w, dw, "dweight");
}

struct DeviceWorkspace {
  float* data = nullptr;
  int64_t n = 0;
  DeviceWorkspace(int64_t rows, int64_t d) : n(rmsnorm_backward_workspace_size(rows, d)) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), std::max<int64_t>(n, 1) * 4), cudaSuccess);
  }
  ~DeviceWorkspace() { cudaFree(data); }
  TensorView view() const {
    return TensorView(data, DType::f32, Device{DeviceType::cuda, 0}, {std::max<int64_t>(n, 1)});
  }
};

void run_gpu_case(DType dt, DType wdt, int64_t rows, int64_t d, int64_t stride, double offset) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " weight " << dtype_name(wdt) << " rows " << rows
                                  << " d " << d << " stride " << stride << " offset " << offset);
  HostTensor x(dt, rows, d, stride), gate(dt, rows, d, stride), dy(dt, rows, d, stride), w(wdt, 1, d);
  x.randomize();
  gate.randomize(0.0f, 2.0f);
  dy.randomize();
  w.randomize();
  HostTensor ref(dt, rows, d, stride), ref_dx(dt, rows, d, stride), ref_dgate(dt, rows, d, stride);
  HostTensor ref_dw(wdt, 1, d);
  rmsnorm_swiglu(ref.view(), x.view(), gate.view(), w.view(true), 1e-5, offset);
  rmsnorm_swiglu_backward(ref_dx.view(), ref_dgate.view(), ref_dw.view(true), dy.view(), x.view(),
                          gate.view(), w.view(true), 1e-5, offset);

  HostTensor out(dt, rows, d, stride), dx(dt, rows, d, stride), dgate(dt, rows, d, stride), dw(wdt, 1, d);
  for (HostTensor* t : {&out, &dx, &dgate, &dw}) t->poison();
  DeviceTensor gx(x), ggate(gate), gdy(dy), gw(w), gout(out), gdx(dx), gdgate(dgate), gdw(dw);
  DeviceWorkspace ws(rows, d);
  rmsnorm_swiglu(gout.view(), gx.view(), ggate.view(), gw.view(true), 1e-5, offset);
  rmsnorm_swiglu_backward(gdx.view(), gdgate.view(), gdw.view(true), gdy.view(), gx.view(), ggate.view(),
                          gw.view(true), 1e-5, offset, ws.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const float rtol = dtype_rtol(dt);
  expect_close(gout.download(), ref, rtol, "out");
  // Gradients: fp32 cancellation makes their error relative to the terms' scale.
  float dx_scale = 0, dgate_scale = 0, dw_scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += double(x.get(r, c)) * x.get(r, c);
    const double rstd = 1.0 / std::sqrt(ss / d + 1e-5);
    for (int64_t c = 0; c < d; ++c) {
      const double g = gate.get(r, c), act = g / (1 + std::exp(-g));
      const double term = std::fabs(dy.get(r, c) * (offset + w.get(0, c))) * rstd;
      dx_scale = std::max(dx_scale, float(term * std::fabs(act)));
      dgate_scale = std::max(dgate_scale, float(term * std::fabs(x.get(r, c)) * 1.1));
      dw_scale = std::max(dw_scale, float(rstd * std::fabs(dy.get(r, c) * x.get(r, c) * act)));
    }
  }
  expect_close(gdx.download(), ref_dx, rtol, "dx", 2 * rtol * dx_scale);
  expect_close(gdgate.download(), ref_dgate, rtol, "dgate", rtol * dgate_scale);
  expect_close(gdw.download(), ref_dw, dtype_rtol(wdt), "dweight", 4e-6f * rows * dw_scale);
  // In place: out replaces gate.
  rmsnorm_swiglu(ggate.view(), gx.view(), ggate.view(), gw.view(true), 1e-5, offset);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(ggate.download(), ref, rtol, "out in place of gate");
}

TEST(RMSNormSwigluGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    for (int64_t d : {1, 7, 128, 1000, 4096, 20000})  // 7, 1000: loop path; 20000: long rows
      for (int64_t rows : {1, 37})
        run_gpu_case(dt, dt, rows, d, d, 0.0);
    run_gpu_case(dt, DType::f32, 3000, 256, 256 + 8, 1.0);  // more rows than partial sums, strided
    run_gpu_case(dt, dt, 500, 96, 96 + 3, 0.0);             // unaligned rows: loop path
    run_gpu_case(dt, dt, 5001, 128, 128, 0.0);             // per-head rows: several per block
    run_gpu_case(dt, dt, 2000, 1000, 1000, 0.0);           // many rows of 125 (bf16) vectors
  }
}

// Every forward path LLMK_NORM_PATH names: the lean register kernel (auto: many rows of 33
// or more vectors), the register kernel with the weight and gate prefetched (vec, and auto
// for few rows); warp and stream follow the rule (the gated form has neither kernel). The backward has no warp path for the gate: its vector path keeps one row in
// flight at VPT 1 except under vec (two, as before).
TEST(RMSNormSwigluGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "lean", "vec", "stream"}, [](DType dt, int64_t vec) {
    for (int64_t d : {33 * vec, 128 * vec, int64_t{4096}})
      for (int64_t rows : {3, 301}) run_gpu_case(dt, dt, rows, d, d, 0.0);
    run_gpu_case(dt, DType::f32, 1031, 96 * vec, 96 * vec + vec, 1.0);      // warp VPL 3, strided
    run_gpu_case(dt, dt, 301, 129 * vec, 129 * vec + 2 * vec, 0.0);         // lean VPT 1, 160 threads
    run_gpu_case(dt, DType::f32, 300, 1793 * vec, 1793 * vec + vec, 1.0);   // lean VPT 4-8, odd row
    run_gpu_case(dt, dt, 700, 1792 * vec, 1792 * vec, 0.0);  // staged weight and gate, rows past the grid
  });
}

TEST(RMSNormSwigluBadInput, ShapesDtypesAndAliasing) {
  HostTensor x(DType::bf16, 4, 64), gate(DType::bf16, 4, 64), w(DType::bf16, 1, 64), out(DType::bf16, 4, 64);
  HostTensor dx(DType::bf16, 4, 64), dgate(DType::bf16, 4, 64), dw(DType::bf16, 1, 64), dy(DType::bf16, 4, 64);
  HostTensor narrow(DType::bf16, 4, 32), f16(DType::f16, 4, 64);
  for (HostTensor* t : {&x, &gate, &w, &dy}) t->randomize();
  const HostTensor out0 = out, dx0 = dx;
  expect_error([&] { rmsnorm_swiglu(out.view(), x.view(), narrow.view(), w.view(true), 1e-6); },
               "rmsnorm_swiglu: gate has shape [4, 32] but x has shape [4, 64]");
  expect_error([&] { rmsnorm_swiglu(out.view(), x.view(), f16.view(), w.view(true), 1e-6); },
               "rmsnorm_swiglu: gate has dtype float16, expected bfloat16");
  expect_error([&] { rmsnorm_swiglu(out.view(), x.view(), gate.view(), w.view(true), 0.0); }, "eps must be");
  expect_error([&] {
    rmsnorm_swiglu_backward(dx.view(), gate.view(), dw.view(true), dy.view(), x.view(), gate.view(), w.view(true), 1e-6);
  }, "rmsnorm_swiglu_backward: dgate and gate are the same tensor");
  expect_error([&] {
    rmsnorm_swiglu_backward(dx.view(), dx.view(), dw.view(true), dy.view(), x.view(), gate.view(), w.view(true), 1e-6);
  }, "dx and dgate are the same tensor");
  expect_equal_elements(out, out0, "out after a rejected call");
  expect_equal_elements(dx, dx0, "dx after a rejected call");
  if (has_gpu()) {
    DeviceTensor gx(x), ggate(gate), gw(w), gdy(dy), gdx(dx), gdgate(dgate), gdw(dw);
    expect_error([&] {
      rmsnorm_swiglu_backward(gdx.view(), gdgate.view(), gdw.view(true), gdy.view(), gx.view(), ggate.view(),
                              gw.view(true), 1e-6);
    }, "need a float32 workspace");
  }
}

}  // namespace
}  // namespace llmk::test
