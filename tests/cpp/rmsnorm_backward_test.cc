// rmsnorm_backward: the CPU reference against finite differences of the CPU forward (in
// double-precision spirit: f32 tensors, central differences), the CUDA kernels against the
// CPU reference on every path, determinism of dweight, and bad inputs.
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

// Loss L = sum(dy * rmsnorm(x)); checks dL/dx and dL/dw by central differences.
TEST(RMSNormBackwardCpu, MatchesFiniteDifferences) {
  const int64_t rows = 3, d = 17;
  HostTensor x(DType::f32, rows, d), w(DType::f32, 1, d), dy(DType::f32, rows, d);
  x.randomize();
  w.randomize();
  dy.randomize();
  const double eps = 1e-3, offset = 0.5;
  HostTensor dx(DType::f32, rows, d), dw(DType::f32, 1, d);
  rmsnorm_backward(dx.view(), dw.view(true), dy.view(), x.view(), w.view(true), eps, offset);
  auto loss = [&]() {
    HostTensor y(DType::f32, rows, d);
    rmsnorm(y.view(), x.view(), w.view(true), eps, offset);
    double l = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) l += double(dy.get(r, c)) * y.get(r, c);
    return l;
  };
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c)
      EXPECT_NEAR(dx.get(r, c), central_difference(x, r, c, loss), 2e-3) << "dx " << r << "," << c;
  for (int c = 0; c < d; ++c) EXPECT_NEAR(dw.get(0, c), central_difference(w, 0, c, loss), 2e-3) << "dw " << c;
}

struct DeviceWorkspace {
  float* data = nullptr;
  int64_t n = 0;
  DeviceWorkspace(int64_t rows, int64_t d) : n(rmsnorm_backward_workspace_size(rows, d)) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), std::max<int64_t>(n, 1) * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0xff, std::max<int64_t>(n, 1) * 4), cudaSuccess);
  }
  ~DeviceWorkspace() { cudaFree(data); }
  TensorView view() const {
    return TensorView(data, DType::f32, Device{DeviceType::cuda, 0}, {std::max<int64_t>(n, 1)});
  }
};

void run_gpu_case(DType dt, DType wdt, int64_t rows, int64_t d, int64_t stride, bool with_dres,
                  double offset) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " weight " << dtype_name(wdt) << " rows "
                                  << rows << " d " << d << " stride " << stride << " dresidual "
                                  << with_dres << " offset " << offset);
  HostTensor x(dt, rows, d, stride), dy(dt, rows, d, stride), dres(dt, rows, d, stride);
  HostTensor w(wdt, 1, d);
  x.randomize();
  dy.randomize();
  dres.randomize();
  w.randomize();
  HostTensor ref_dx(dt, rows, d, stride), ref_dw(wdt, 1, d);
  rmsnorm_backward(ref_dx.view(), ref_dw.view(true), dy.view(), x.view(), w.view(true), 1e-5,
                   offset, with_dres ? std::optional<TensorView>(dres.view()) : std::nullopt);

  HostTensor dx(dt, rows, d, stride), dw(wdt, 1, d);
  dx.poison();
  dw.poison();
  DeviceTensor gx(x), gdy(dy), gdres(dres), gw(w), gdx(dx), gdw(dw);
  DeviceWorkspace ws(rows, d);
  auto run = [&] {
    rmsnorm_backward(gdx.view(), gdw.view(true), gdy.view(), gx.view(), gw.view(true), 1e-5,
                     offset, with_dres ? std::optional<TensorView>(gdres.view()) : std::nullopt,
                     ws.view());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  run();
  // dx = r*g - x*c (+ dresidual): fp32 cancellation makes its error relative to the
  // terms' scale, max over rows of r * max|dy * w'| (and |dresidual|).
  // dweight sums `rows` terms dy * x * r: its error is relative to the sum of their sizes.
  float term_scale = 0, dw_term_scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += double(x.get(r, c)) * x.get(r, c);
    const double rstd = 1.0 / std::sqrt(ss / d + 1e-5);
    for (int64_t c = 0; c < d; ++c) {
      term_scale = std::max(term_scale, float(rstd * std::fabs(dy.get(r, c) * (offset + w.get(0, c)))));
      dw_term_scale = std::max(dw_term_scale, float(rstd * std::fabs(dy.get(r, c) * x.get(r, c))));
      if (with_dres) term_scale = std::max(term_scale, std::fabs(dres.get(r, c)));
    }
  }
  expect_close(gdx.download(), ref_dx, dtype_rtol(dt), "dx", 2 * dtype_rtol(dt) * term_scale);
  const HostTensor dw1 = gdw.download();
  expect_close(dw1, ref_dw, dtype_rtol(wdt), "dweight", 4e-6f * rows * dw_term_scale);
  run();
  EXPECT_EQ(gdw.download().bytes, dw1.bytes) << "dweight is not deterministic";
}

TEST(RMSNormBackwardGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (int64_t d : {1, 7, 64, 896, 1000, 4096, 5120, 16384, 32768})
      for (int64_t rows : {1, 5, 300}) {
        if (d >= 16384 && rows == 300) continue;
        run_gpu_case(dt, dt, rows, d, d, false, 0.0);
      }
}

TEST(RMSNormBackwardGpu, ManyRowsStridedDresidualWeightDtypes) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case(dt, dt, 3000, 512, 512, true, 0.0);       // more rows than partial sums
    run_gpu_case(dt, dt, 2000, 256, 256 + 5, false, 0.0);  // unaligned: loop path, many rows
    run_gpu_case(dt, DType::f32, 77, 2048, 3 * 2048, true, 1.0);
  }
}

// dx past element 2^31 (int64 indexing). dweight sums every row, so it is not compared here:
// the smaller shapes above check it.
// Every path LLMK_NORM_PATH names: warp follows the rule (the warp path is LayerNorm's),
// with and without dresidual; the vector path with and without the resident-block limit.
TEST(RMSNormBackwardGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "vec"}, [](DType dt, int64_t vec) {
    for (int64_t d : {33 * vec, 112 * vec, 128 * vec, int64_t{8192}})
      for (int64_t rows : {5, 1031}) run_gpu_case(dt, dt, rows, d, d, rows == 1031, 0.0);
    run_gpu_case(dt, DType::f32, 3000, 96 * vec, 96 * vec + vec, true, 1.0);
  });
}

TEST(RMSNormBackwardGpu, MoreThan2To31Elements) {
  LLMK_REQUIRE_GPU();
  const int64_t d = 4096, rows = (int64_t{1} << 31) / d + 2;
  const size_t bytes = size_t(rows * d * 2);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < 3 * bytes + (size_t(1) << 30)) GTEST_SKIP() << "not enough GPU memory";
  void *x = nullptr, *dy = nullptr, *dx = nullptr;
  for (void** p : {&x, &dy, &dx}) ASSERT_EQ(cudaMalloc(p, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 0x3f, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy, 0x3e, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dx, 0xff, bytes), cudaSuccess);  // NaN
  HostTensor tx(DType::bf16, 3, d), tdy(DType::bf16, 3, d), w(DType::bf16, 1, d), dw(DType::bf16, 1, d);
  tx.randomize();
  tdy.randomize();
  w.randomize();
  const size_t tail = size_t((rows - 3) * d * 2);
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(x) + tail, tx.bytes.data(), 3 * d * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(dy) + tail, tdy.bytes.data(), 3 * d * 2, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceTensor gw(w), gdw(dw);
  DeviceWorkspace ws(rows, d);
  const Device gpu{DeviceType::cuda, 0};
  auto view = [&](void* p) { return TensorView(p, DType::bf16, gpu, {rows, d}); };
  rmsnorm_backward(view(dx), gdw.view(true), view(dy), view(x), gw.view(true), 1e-5, 0.0,
                   std::nullopt, ws.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor ref(DType::bf16, 3, d), ref_dw(DType::bf16, 1, d), got(DType::bf16, 3, d);
  rmsnorm_backward(ref.view(), ref_dw.view(true), tdy.view(), tx.view(), w.view(true), 1e-5);
  ASSERT_EQ(cudaMemcpy(got.bytes.data(), static_cast<char*>(dx) + tail, 3 * d * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  float scale = 0;
  for (int64_t c = 0; c < 3 * d; ++c) scale = std::max(scale, std::fabs(tdy.get(0, c) * w.get(0, c % d)));
  expect_close(got, ref, dtype_rtol(DType::bf16), "tail rows of dx", 2 * dtype_rtol(DType::bf16) * 4 * scale);
  for (void* p : {x, dy, dx}) cudaFree(p);
}

TEST(RMSNormBackwardGpu, NoRowsGivesZeroWeightGradient) {
  LLMK_REQUIRE_GPU();
  HostTensor x(DType::bf16, 0, 64), w(DType::bf16, 1, 64), dw(DType::bf16, 1, 64);
  w.randomize();
  dw.poison();
  DeviceTensor gx(x), gw(w), gdw(dw);
  rmsnorm_backward(gx.view(), gdw.view(true), gx.view(), gx.view(), gw.view(true), 1e-6);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = gdw.download();
  for (int c = 0; c < 64; ++c) EXPECT_EQ(got.get(0, c), 0.0f);
}

TEST(RMSNormBackwardGpuBadInput, MissingOrShortWorkspace) {
  LLMK_REQUIRE_GPU();
  HostTensor x(DType::bf16, 8, 64), w(DType::bf16, 1, 64), dx(DType::bf16, 8, 64), dw(DType::bf16, 1, 64);
  x.randomize();
  w.randomize();
  dx.poison();
  DeviceTensor gx(x), gdy(x), gw(w), gdx(dx), gdw(dw);
  expect_error([&] { rmsnorm_backward(gdx.view(), gdw.view(true), gdy.view(), gx.view(), gw.view(true), 1e-6); },
               "need a float32 workspace");
  float* small = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&small), 16), cudaSuccess);
  const std::string needed = std::to_string(rmsnorm_backward_workspace_size(8, 64));
  for (const TensorView& ws : {TensorView(small, DType::f32, Device{DeviceType::cuda, 0}, {4}),
                               TensorView(small, DType::f32, Device{DeviceType::cuda, 0}, {2, 2})})
    expect_error([&] { rmsnorm_backward(gdx.view(), gdw.view(true), gdy.view(), gx.view(), gw.view(true), 1e-6, 0.0, std::nullopt, ws); },
                 "rmsnorm_backward: workspace must be a 1-d float32 tensor of at least " + needed +
                     " elements, got shape " + (ws.ndim() == 1 ? "[4]" : "[2, 2]"));
  cudaFree(small);
  EXPECT_EQ(gdx.download().bytes, dx.bytes);
}

TEST(RMSNormBackwardBadInput, ShapesDtypesAliasing) {
  HostTensor x(DType::bf16, 4, 64), w(DType::bf16, 1, 64), dy(DType::bf16, 4, 64);
  HostTensor dx(DType::bf16, 4, 64), dw(DType::bf16, 1, 64), dw32(DType::f32, 1, 64), dy_short(DType::bf16, 4, 63);
  x.randomize();
  dy.randomize();
  w.randomize();
  dx.poison();
  expect_error([&] { rmsnorm_backward(dx.view(), dw32.view(true), dy.view(), x.view(), w.view(true), 1e-6); },
               "dweight has dtype float32");
  expect_error([&] { rmsnorm_backward(dx.view(), dw.view(true), dy_short.view(), x.view(), w.view(true), 1e-6); },
               "dy has shape [4, 63]");
  expect_error([&] { rmsnorm_backward(dy.view(), dw.view(true), dy.view(), x.view(), w.view(true), 1e-6); },
               "dx and dy");
  expect_error([&] { rmsnorm_backward(dx.view(), dw.view(true), dy.view(), x.view(), w.view(true), -1.0); },
               "eps must be");
  HostTensor fresh(DType::bf16, 4, 64);
  fresh.poison();
  EXPECT_EQ(dx.bytes, fresh.bytes);
}

}  // namespace
}  // namespace llmk::test
