// add_rmsnorm and add_rmsnorm_: the CPU reference against its definition (add, round,
// rmsnorm), the CUDA kernels against the CPU reference in both forms (in place and out of
// place), and bad inputs (aliasing that is not the in-place form, shape and dtype
// mismatches).
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

TEST(AddRMSNormCpu, EqualsAddThenRMSNorm) {
  for (DType dt : all_dtypes()) {
    HostTensor x(dt, 7, 129), res(dt, 7, 129), w(dt, 1, 129);
    x.randomize();
    res.randomize();
    w.randomize();
    HostTensor sum(dt, 7, 129), want(dt, 7, 129);
    for (int r = 0; r < 7; ++r)
      for (int c = 0; c < 129; ++c) sum.set(r, c, x.get(r, c) + res.get(r, c));
    rmsnorm(want.view(), sum.view(), w.view(true), 1e-6);
    HostTensor out(dt, 7, 129), res_out(dt, 7, 129);
    add_rmsnorm(out.view(), res_out.view(), x.view(), res.view(), w.view(true), 1e-6);
    EXPECT_EQ(res_out.bytes, sum.bytes) << dtype_name(dt);
    EXPECT_EQ(out.bytes, want.bytes) << dtype_name(dt);
    // In place gives the same bytes.
    add_rmsnorm_(x.view(), res.view(), w.view(true), 1e-6);
    EXPECT_EQ(res.bytes, sum.bytes) << dtype_name(dt);
    EXPECT_EQ(x.bytes, want.bytes) << dtype_name(dt);
  }
}

void run_gpu_case(DType dt, DType wdt, int64_t rows, int64_t d, int64_t stride, bool in_place,
                  double offset) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " weight " << dtype_name(wdt) << " rows "
                                  << rows << " d " << d << " stride " << stride << " in_place "
                                  << in_place << " offset " << offset);
  HostTensor x(dt, rows, d, stride), res(dt, rows, d, stride), w(wdt, 1, d);
  x.randomize();
  res.randomize(0.0f, 4.0f);
  w.randomize();
  HostTensor ref(dt, rows, d, stride), ref_res(dt, rows, d, stride);
  add_rmsnorm(ref.view(), ref_res.view(), x.view(), res.view(), w.view(true), 1e-6, offset);

  HostTensor out(dt, rows, d, stride), res_out(dt, rows, d, stride);
  out.poison();
  res_out.poison();
  DeviceTensor dx(x), dres(res), dw(w), dout(out), dres_out(res_out);
  if (in_place) {
    add_rmsnorm_(dx.view(), dres.view(), dw.view(true), 1e-6, offset);
  } else {
    add_rmsnorm(dout.view(), dres_out.view(), dx.view(), dres.view(), dw.view(true), 1e-6, offset);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The sum is one fp32 add rounded to the dtype on both sides: bit-exact.
  expect_equal_elements((in_place ? dres : dres_out).download(), ref_res, "residual_out");
  expect_close((in_place ? dx : dout).download(), ref, dtype_rtol(dt), "out");
}

TEST(AddRMSNormGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (int64_t d : {1, 9, 64, 896, 2048, 4096, 8192, 16384, 65536})
      for (bool in_place : {false, true}) run_gpu_case(dt, dt, d == 65536 ? 2 : 13, d, d, in_place, 0.0);
}

TEST(AddRMSNormGpu, StridedRowsAndWeightDtypes) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case(dt, dt, 11, 4096, 3 * 4096, false, 0.0);
    run_gpu_case(dt, dt, 11, 1024, 1024 + 1, true, 0.0);
    run_gpu_case(dt, DType::f32, 11, 2048, 2048, true, 1.0);
    run_gpu_case(dt, dt, 1200, 896, 896, true, 0.0);  // many rows (in place)
    run_gpu_case(dt, dt, 1200, 128, 128, false, 0.0);
  }
}

TEST(AddRMSNormGpu, ManyLongRowsTakeTheStreamingKernel) {
  LLMK_REQUIRE_GPU();
  // At least 2 x SM count rows of at least 512 16-byte vectors (norm_launch.cuh), on GPUs
  // of up to 150 SMs: an odd vector count, strided rows, in place, an fp32 weight with offset.
  for (DType dt : all_dtypes()) {
    const int64_t vec = 16 / static_cast<int64_t>(dtype_size(dt));
    run_gpu_case(dt, dt, 300, 641 * vec, 641 * vec * 2, false, 0.0);
    run_gpu_case(dt, dt, 300, 512 * vec, 512 * vec, true, 0.0);
    run_gpu_case(dt, DType::f32, 300, 2500 * vec, 2500 * vec + vec, true, 1.0);
  }
}

// Every forward path LLMK_NORM_PATH names (warp and lean follow the rule: add_rmsnorm has the
// register and streaming kernels): warp-sized rows, few and many rows, in place, strided, an
// fp32 weight.
TEST(AddRMSNormGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "vec", "stream"}, [](DType dt, int64_t vec) {
    for (int64_t d : {33 * vec, 128 * vec, int64_t{4096}})
      for (bool in_place : {false, true}) run_gpu_case(dt, dt, 301, d, d, in_place, 0.0);
    run_gpu_case(dt, DType::f32, 7, 96 * vec, 2 * 96 * vec, false, 1.0);
  });
}

TEST(AddRMSNormGpu, MoreThan2To31Elements) {
  LLMK_REQUIRE_GPU();
  const int64_t d = 4096, rows = (int64_t{1} << 31) / d + 2;  // 2^31 + 8192 elements
  const size_t bytes = size_t(rows * d * 2);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < 4 * bytes + (size_t(1) << 30)) GTEST_SKIP() << "not enough GPU memory";
  void *x = nullptr, *res = nullptr, *out = nullptr, *res_out = nullptr;
  for (void** p : {&x, &res, &out, &res_out}) ASSERT_EQ(cudaMalloc(p, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 0x3f, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(res, 0x3e, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0xff, bytes), cudaSuccess);  // NaN
  ASSERT_EQ(cudaMemset(res_out, 0xff, bytes), cudaSuccess);
  // Random values in the last 3 rows, past element 2^31.
  HostTensor tx(DType::bf16, 3, d), tres(DType::bf16, 3, d), w(DType::bf16, 1, d);
  tx.randomize();
  tres.randomize();
  w.randomize();
  const size_t tail = size_t((rows - 3) * d * 2);
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(x) + tail, tx.bytes.data(), 3 * d * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(res) + tail, tres.bytes.data(), 3 * d * 2, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceTensor dw(w);
  const Device gpu{DeviceType::cuda, 0};
  auto view = [&](void* p) { return TensorView(p, DType::bf16, gpu, {rows, d}); };
  add_rmsnorm(view(out), view(res_out), view(x), view(res), dw.view(true), 1e-6);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor ref(DType::bf16, 3, d), ref_res(DType::bf16, 3, d), got(DType::bf16, 3, d), got_res(DType::bf16, 3, d);
  add_rmsnorm(ref.view(), ref_res.view(), tx.view(), tres.view(), w.view(true), 1e-6);
  ASSERT_EQ(cudaMemcpy(got.bytes.data(), static_cast<char*>(out) + tail, 3 * d * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_res.bytes.data(), static_cast<char*>(res_out) + tail, 3 * d * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  expect_close(got, ref, dtype_rtol(DType::bf16), "tail rows");
  expect_equal_elements(got_res, ref_res, "tail residual rows");
  for (void* p : {x, res, out, res_out}) cudaFree(p);
}

class AddRMSNormBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, res{DType::bf16, 4, 64}, w{DType::bf16, 1, 64};
  HostTensor out{DType::bf16, 4, 64}, res_out{DType::bf16, 4, 64};
  void SetUp() override {
    x.randomize();
    res.randomize();
    w.randomize();
    out.poison();
    res_out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 64);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes);
    EXPECT_EQ(res_out.bytes, fresh.bytes);
  }
};

TEST_F(AddRMSNormBadInput, AliasingOtherThanInPlace) {
  expect_error([&] { add_rmsnorm(out.view(), x.view(), x.view(), res.view(), w.view(true), 1e-6); },
               "residual_out and x");
  expect_error([&] { add_rmsnorm(res.view(), res_out.view(), x.view(), res.view(), w.view(true), 1e-6); },
               "out and residual");
  expect_error([&] { add_rmsnorm(out.view(), out.view(), x.view(), res.view(), w.view(true), 1e-6); },
               "out and residual_out");
  expect_untouched();
}

TEST_F(AddRMSNormBadInput, InPlaceNeedsDisjointTensors) {
  const HostTensor x0 = x, res0 = res;
  expect_error([&] { add_rmsnorm_(x.view(), x.view(), w.view(true), 1e-6); },
               "add_rmsnorm_: x and residual are the same tensor, which this op does not allow");
  TensorView shifted(x.bytes.data() + 2 * 64, DType::bf16, Device{}, {3, 64});
  TensorView x3(x.bytes.data(), DType::bf16, Device{}, {3, 64});
  expect_error([&] { add_rmsnorm_(x3, shifted, w.view(true), 1e-6); },
               "add_rmsnorm_: x and residual overlap in memory; they must be disjoint");
  EXPECT_EQ(x.bytes, x0.bytes);
  EXPECT_EQ(res.bytes, res0.bytes);
}

TEST_F(AddRMSNormBadInput, MismatchedResidual) {
  HostTensor res16(DType::f16, 4, 64), res_short(DType::bf16, 3, 64);
  expect_error([&] { add_rmsnorm(out.view(), res_out.view(), x.view(), res16.view(), w.view(true), 1e-6); },
               "residual has dtype float16");
  expect_error([&] { add_rmsnorm(out.view(), res_out.view(), x.view(), res_short.view(), w.view(true), 1e-6); },
               "residual has shape [3, 64]");
  expect_untouched();
}

TEST_F(AddRMSNormBadInput, BadEpsAndDevice) {
  expect_error([&] { add_rmsnorm(out.view(), res_out.view(), x.view(), res.view(), w.view(true), 0.0); },
               "eps must be");
  TensorView rg(res.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {4, 64});
  expect_error([&] { add_rmsnorm(out.view(), res_out.view(), x.view(), rg, w.view(true), 1e-6); },
               "residual is on cuda:0 but x is on cpu");
  expect_untouched();
}

}  // namespace
}  // namespace llmk::test
