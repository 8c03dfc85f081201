// bias_gelu and bias_gelu_backward: the CPU reference against hand values and finite
// differences, the CUDA kernels against the CPU reference (both GELU forms, every dtype,
// odd and strided rows, more rows than partial sums, in place), dbias determinism, bad
// inputs.
#include "test_util.h"

namespace llmk::test {
namespace {

const GeluApproximation kForms[] = {GeluApproximation::none, GeluApproximation::tanh};
const char* form_name(GeluApproximation a) { return a == GeluApproximation::none ? "erf" : "tanh"; }

double gelu(double z, GeluApproximation a) {
  if (a == GeluApproximation::none) return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
  return 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
}

TEST(BiasGeluCpu, MatchesHandValuesAndFiniteDifferences) {
  for (GeluApproximation a : kForms) {
    SCOPED_TRACE(form_name(a));
    const int64_t rows = 3, d = 5;
    HostTensor x(DType::f32, rows, d), b(DType::f32, 1, d), dy(DType::f32, rows, d), out(DType::f32, rows, d);
    x.randomize(0.0f, 2.0f);
    b.randomize();
    dy.randomize();
    bias_gelu(out.view(), x.view(), b.view(true), a);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) EXPECT_NEAR(out.get(r, c), gelu(double(x.get(r, c)) + b.get(0, c), a), 1e-6);
    HostTensor dx(DType::f32, rows, d), db(DType::f32, 1, d);
    bias_gelu_backward(dx.view(), db.view(true), dy.view(), x.view(), b.view(true), a);
    auto loss = [&]() {
      HostTensor y(DType::f32, rows, d);
      bias_gelu(y.view(), x.view(), b.view(true), a);
      double l = 0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < d; ++c) l += double(dy.get(r, c)) * y.get(r, c);
      return l;
    };
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) EXPECT_NEAR(dx.get(r, c), central_difference(x, r, c, loss), 2e-3);
    for (int c = 0; c < d; ++c) EXPECT_NEAR(db.get(0, c), central_difference(b, 0, c, loss), 3e-3);
  }
  // gelu(1) = Phi(1) = 0.841344746...
  HostTensor x(DType::f32, 1, 1), b(DType::f32, 1, 1), out(DType::f32, 1, 1);
  x.set(0, 0, 0.25f);
  b.set(0, 0, 0.75f);
  bias_gelu(out.view(), x.view(), b.view(true));
  EXPECT_NEAR(out.get(0, 0), 0.8413447461, 1e-7);
}

struct DeviceWorkspace {
  float* data = nullptr;
  int64_t n = 0;
  DeviceWorkspace(int64_t rows, int64_t d) : n(std::max<int64_t>(bias_gelu_backward_workspace_size(rows, d), 1)) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0xff, n * 4), cudaSuccess);  // NaN: unwritten partial sums show
  }
  ~DeviceWorkspace() { cudaFree(data); }
  TensorView view() const { return TensorView(data, DType::f32, Device{DeviceType::cuda, 0}, {n}); }
};

void run_gpu_case(GeluApproximation a, DType dt, int64_t rows, int64_t d, int64_t stride) {
  SCOPED_TRACE(testing::Message() << form_name(a) << " " << dtype_name(dt) << " rows " << rows << " d " << d
                                  << " stride " << stride);
  HostTensor x(dt, rows, d, stride), dy(dt, rows, d, stride), b(dt, 1, d);
  x.randomize(0.0f, 2.0f);
  dy.randomize();
  b.randomize();
  HostTensor ref(dt, rows, d, stride), ref_dx(dt, rows, d, stride), ref_db(dt, 1, d);
  bias_gelu(ref.view(), x.view(), b.view(true), a);
  bias_gelu_backward(ref_dx.view(), ref_db.view(true), dy.view(), x.view(), b.view(true), a);

  HostTensor out(dt, rows, d, stride), dx(dt, rows, d, stride), db(dt, 1, d);
  for (HostTensor* t : {&out, &dx, &db}) t->poison();
  DeviceTensor gx(x), gdy(dy), gb(b), gout(out), gdx(dx), gdb(db);
  DeviceWorkspace ws(rows, d);
  bias_gelu(gout.view(), gx.view(), gb.view(true), a);
  bias_gelu_backward(gdx.view(), gdb.view(true), gdy.view(), gx.view(), gb.view(true), a, ws.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const float rtol = dtype_rtol(dt);
  expect_close(gout.download(), ref, rtol, "out", rtol * 1e-2f);
  float dy_max = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) dy_max = std::max(dy_max, std::fabs(dy.get(r, c)));
  expect_close(gdx.download(), ref_dx, rtol, "dx", rtol * 1e-2f * dy_max);
  // dbias sums `rows` fp32 terms of size <= 1.13 |dy|, each rounded differently from the CPU.
  const HostTensor db1 = gdb.download();
  expect_close(db1, ref_db, rtol, "dbias", 2e-6f * rows * 1.13f * dy_max);
  // Deterministic; and in place: dx replaces dy.
  bias_gelu_backward(gdy.view(), gdb.view(true), gdy.view(), gx.view(), gb.view(true), a, ws.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(gdb.download().bytes, db1.bytes) << "dbias is not deterministic";
  expect_close(gdy.download(), ref_dx, rtol, "dx in place of dy", rtol * 1e-2f * dy_max);
  bias_gelu(gx.view(), gx.view(), gb.view(true), a);  // out replaces x
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(gx.download(), ref, rtol, "out in place of x", rtol * 1e-2f);
}

TEST(BiasGeluGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (GeluApproximation a : kForms)
    for (DType dt : all_dtypes()) {
      for (int64_t d : {1, 7, 768, 3072, 14336})
        for (int64_t rows : {1, 37})
          run_gpu_case(a, dt, rows, d, d);
      run_gpu_case(a, dt, 3000, 256, 256);       // more rows than partial sums
      run_gpu_case(a, dt, 300, 100, 100 + 3);    // unaligned rows: the scalar kernels
      run_gpu_case(a, dt, 70000, 8, 8 + 16);     // more rows than gridDim.y covers at once
    }
}

TEST(BiasGeluBadInput, ShapesDtypesAndAliasing) {
  HostTensor x(DType::bf16, 4, 64), b(DType::bf16, 1, 64), out(DType::bf16, 4, 64), dy(DType::bf16, 4, 64);
  HostTensor b32(DType::f32, 1, 64), short_b(DType::bf16, 1, 32), dx(DType::bf16, 4, 64), db(DType::bf16, 1, 64);
  for (HostTensor* t : {&x, &b, &dy}) t->randomize();
  const HostTensor out0 = out, dx0 = dx;
  expect_error([&] { bias_gelu(out.view(), x.view(), b32.view(true)); }, "bias_gelu: bias has dtype float32, expected bfloat16");
  expect_error([&] { bias_gelu(out.view(), x.view(), short_b.view(true)); }, "bias_gelu: bias must have shape [64], got [32]");
  HostTensor b2(DType::bf16, 2, 64);
  expect_error([&] { bias_gelu(out.view(), x.view(), b2.view()); }, "bias_gelu: bias must have shape [64], got [2, 64]");
  const TensorView scalar(b.bytes.data(), DType::bf16, Device{}, 0, nullptr, nullptr);
  expect_error([&] { bias_gelu(out.view(), x.view(), scalar); }, "bias_gelu: bias must have shape [64], got []");
  expect_error([&] { bias_gelu(out.view(), x.view(), b.view(true), static_cast<GeluApproximation>(5)); },
               "unknown GELU approximation");
  expect_error([&] { bias_gelu_backward(dx.view(), x.view(), dy.view(), x.view(), b.view(true)); },
               "bias_gelu_backward: dbias must have shape [64]");
  expect_error([&] { bias_gelu_backward(dx.view(), b.view(true), dy.view(), x.view(), b.view(true)); },
               "dbias and bias are the same tensor");
  expect_equal_elements(out, out0, "out after a rejected call");
  expect_equal_elements(dx, dx0, "dx after a rejected call");
  if (has_gpu()) {
    DeviceTensor gx(x), gb(b), gdy(dy), gdx(dx), gdb(db);
    expect_error([&] { bias_gelu_backward(gdx.view(), gdb.view(true), gdy.view(), gx.view(), gb.view(true)); },
                 "need a float32 workspace");
  }
}

}  // namespace
}  // namespace llmk::test
