// rmsnorm: the CPU reference against hand-computed values, the CUDA kernels against the
// CPU reference (fresh random inputs, poisoned outputs, odd and strided shapes, every
// kernel path), and the rejection of bad inputs (nothing written).
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

TEST(RMSNormCpu, MatchesHandComputedValues) {
  HostTensor x(DType::f32, 1, 2), w(DType::f32, 1, 2), out(DType::f32, 1, 2);
  x.set(0, 0, 3.0f); x.set(0, 1, 4.0f);
  w.set(0, 0, 1.0f); w.set(0, 1, 2.0f);
  const double r = 1.0 / std::sqrt(12.5 + 1e-6);
  rmsnorm(out.view(), x.view(), w.view(true), 1e-6);
  EXPECT_NEAR(out.get(0, 0), 3.0 * r, 1e-6);
  EXPECT_NEAR(out.get(0, 1), 8.0 * r, 1e-6);
  // Gemma: (1 + w)
  HostTensor rstd(DType::f32, 1, 1);
  rmsnorm(out.view(), x.view(), w.view(true), 1e-6, 1.0, rstd.view(true));
  EXPECT_NEAR(out.get(0, 0), 6.0 * r, 1e-6);
  EXPECT_NEAR(out.get(0, 1), 12.0 * r, 1e-6);
  EXPECT_NEAR(rstd.get(0, 0), r, 1e-7);
}

TEST(RMSNormCpu, UnitWeightGivesUnitRms) {
  for (DType dt : all_dtypes()) {
    HostTensor x(dt, 5, 301), w(dt, 1, 301), out(dt, 5, 301);
    x.randomize(0.5f, 3.0f);
    for (int c = 0; c < 301; ++c) w.set(0, c, 1.0f);
    rmsnorm(out.view(), x.view(), w.view(true), 1e-12);
    for (int r = 0; r < 5; ++r) {
      double ss = 0;
      for (int c = 0; c < 301; ++c) ss += double(out.get(r, c)) * out.get(r, c);
      EXPECT_NEAR(ss / 301, 1.0, 4 * dtype_rtol(dt)) << dtype_name(dt);
    }
  }
}

struct Case {
  DType dt;
  DType wdt;
  int64_t rows, d, stride;
  double offset;
  bool rstd;
  bool in_place;
};

void run_gpu_case(const Case& k) {
  SCOPED_TRACE(testing::Message() << dtype_name(k.dt) << " weight " << dtype_name(k.wdt)
                                  << " rows " << k.rows << " d " << k.d << " stride "
                                  << k.stride << " offset " << k.offset << " rstd " << k.rstd
                                  << " in_place " << k.in_place);
  HostTensor x(k.dt, k.rows, k.d, k.stride), w(k.wdt, 1, k.d);
  x.randomize(0.0f, 2.0f);
  w.randomize(0.0f, 1.0f);
  HostTensor ref(k.dt, k.rows, k.d, k.stride), ref_rstd(DType::f32, 1, k.rows);
  const float eps = 1e-5f;
  rmsnorm(ref.view(), x.view(), w.view(true), eps, k.offset, ref_rstd.view(true));

  HostTensor out(k.dt, k.rows, k.d, k.stride), rstd(DType::f32, 1, k.rows);
  out.poison();
  rstd.poison();
  DeviceTensor dx(x), dw(w), dout(out), drstd(rstd);
  const TensorView out_view = k.in_place ? dx.view() : dout.view();
  rmsnorm(out_view, dx.view(), dw.view(true), eps, k.offset,
          k.rstd ? std::optional<TensorView>(drstd.view(true)) : std::nullopt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(k.in_place ? dx.download() : dout.download(), ref, dtype_rtol(k.dt), "out");
  if (k.rstd) expect_close(drstd.download(), ref_rstd, 1e-5f, "rstd");
}

TEST(RMSNormGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  // d covers every kernel path: the vector kernel with 1..16 vectors per thread (896,
  // 4096, 5120, 16384, 65536 in bf16), the loop kernel (odd d, unaligned strides, fp32
  // rows longer than the registers hold).
  for (DType dt : all_dtypes())
    for (int64_t d : {1, 7, 8, 33, 896, 1000, 4096, 5120, 16384, 65536})
      for (int64_t rows : {1, 3, 37}) {
        if (d == 65536 && rows == 37) continue;
        run_gpu_case({dt, dt, rows, d, d, 0.0, rows == 3, false});
      }
}

TEST(RMSNormGpu, StridedRowsWeightDtypesOffsetInPlace) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case({dt, dt, 19, 4096, 4096 * 3, 0.0, true, false});   // q slice of fused qkv
    run_gpu_case({dt, dt, 19, 4096, 4096 + 3, 0.0, false, false});  // unaligned stride
    run_gpu_case({dt, DType::f32, 23, 2048, 2048, 0.0, true, false});
    run_gpu_case({dt, dt, 23, 2048, 2048, 1.0, false, false});      // Gemma
    run_gpu_case({dt, dt, 23, 5120, 5120, 0.0, false, true});       // in place
    run_gpu_case({dt, dt, 23, 333, 333, 0.0, false, true});         // in place, loop kernel
    // Short rows share a block (Qwen3's per-head q/k norm): rows not a multiple of the
    // rows per block, with rstd, strided, and the longest short row (32 vectors).
    run_gpu_case({dt, dt, 1001, 128, 128, 0.0, true, false});
    run_gpu_case({dt, dt, 999, 64, 64 * 3, 0.0, false, false});
    run_gpu_case({dt, dt, 77, 32 * (16 / static_cast<int64_t>(dtype_size(dt))), 256, 0.0, true, true});
    // Many rows of 33-128 vectors.
    run_gpu_case({dt, dt, 1500, 896, 896, 0.0, true, false});
    run_gpu_case({dt, DType::f32, 1024, 48 * (16 / static_cast<int64_t>(dtype_size(dt))), 1024, 1.0, false, true});
  }
}

TEST(RMSNormGpu, ManyLongRowsTakeTheStreamingKernel) {
  LLMK_REQUIRE_GPU();
  // At least 2 x SM count rows of at least 512 16-byte vectors (norm_launch.cuh): 300
  // rows pass that on GPUs of up to 150 SMs. An odd vector count (641), strided rows (a q
  // slice), rstd, in place, an fp32 weight with offset, and a row longer than a block.
  const int64_t rows = 300;
  for (DType dt : all_dtypes()) {
    const int64_t vec = 16 / static_cast<int64_t>(dtype_size(dt));
    run_gpu_case({dt, dt, rows, 512 * vec, 512 * vec * 3, 0.0, true, false});
    run_gpu_case({dt, dt, rows, 641 * vec, 641 * vec, 0.0, false, true});
    run_gpu_case({dt, DType::f32, rows, 600 * vec, 600 * vec + vec, 1.0, true, false});
    run_gpu_case({dt, dt, rows, 2500 * vec, 2500 * vec, 0.0, true, true});
  }
}

// Every forward path LLMK_NORM_PATH names (RMSNorm has the register and streaming kernels;
// warp and lean follow the rule): warp-sized rows (33-128 vectors: 896 and 1024 in 16-bit
// types), rows it does not take, few and many rows, strided, in place.
TEST(RMSNormGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "lean", "vec", "stream"}, [](DType dt, int64_t vec) {
    for (int64_t d : {33 * vec, 112 * vec, 128 * vec, int64_t{4096}, int64_t{128}})
      for (int64_t rows : {1, 301}) run_gpu_case({dt, dt, rows, d, d, 0.0, true, false});
    run_gpu_case({dt, DType::f32, 1031, 96 * vec, 96 * vec + vec, 1.0, false, false});
    run_gpu_case({dt, dt, 1031, 65 * vec, 65 * vec, 0.0, true, true});
  });
}

TEST(RMSNormGpu, MoreThan2To31Elements) {
  LLMK_REQUIRE_GPU();
  const int64_t d = 4096, rows = (int64_t{1} << 31) / d + 2;  // 2^31 + 8192 elements
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < size_t(rows * d * 2 * 2 + (1 << 30))) GTEST_SKIP() << "not enough GPU memory";
  void *x = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&x, rows * d * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, rows * d * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 0x3f, rows * d * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0xff, rows * d * 2), cudaSuccess);  // NaN
  // Random values in the last 3 rows, past element 2^31.
  HostTensor tail(DType::bf16, 3, d), w(DType::bf16, 1, d), ref(DType::bf16, 3, d);
  tail.randomize();
  w.randomize();
  char* x_tail = static_cast<char*>(x) + (rows - 3) * d * 2;
  ASSERT_EQ(cudaMemcpy(x_tail, tail.bytes.data(), 3 * d * 2, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceTensor dw(w);
  const Device gpu{DeviceType::cuda, 0};
  rmsnorm(TensorView(out, DType::bf16, gpu, {rows, d}), TensorView(x, DType::bf16, gpu, {rows, d}),
          dw.view(true), 1e-6);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  rmsnorm(ref.view(), tail.view(), w.view(true), 1e-6);
  HostTensor got(DType::bf16, 3, d);
  ASSERT_EQ(cudaMemcpy(got.bytes.data(), static_cast<char*>(out) + (rows - 3) * d * 2, 3 * d * 2,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  expect_close(got, ref, dtype_rtol(DType::bf16), "tail rows");
  cudaFree(x);
  cudaFree(out);
}

// Bad inputs are rejected on the host before any work, so host tensors exercise them; a
// rejected call must leave the poisoned output untouched.
class RMSNormBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, w{DType::bf16, 1, 64}, out{DType::bf16, 4, 64};
  void SetUp() override {
    x.randomize();
    w.randomize();
    out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 64);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes) << "a rejected call wrote to out";
  }
};

TEST_F(RMSNormBadInput, WrongWeightDtype) {
  HostTensor w16(DType::f16, 1, 64);
  expect_error([&] { rmsnorm(out.view(), x.view(), w16.view(true), 1e-6); }, "weight has dtype float16");
  expect_untouched();
}

TEST_F(RMSNormBadInput, WrongOutDtypeAndShape) {
  HostTensor out32(DType::f32, 4, 64), out_short(DType::bf16, 4, 32);
  expect_error([&] { rmsnorm(out32.view(), x.view(), w.view(true), 1e-6); }, "out has dtype float32");
  expect_error([&] { rmsnorm(out_short.view(), x.view(), w.view(true), 1e-6); }, "out has shape [4, 32]");
  HostTensor w_short(DType::bf16, 1, 63);
  expect_error([&] { rmsnorm(out.view(), x.view(), w_short.view(true), 1e-6); }, "weight must have shape [64]");
  expect_untouched();
}

TEST_F(RMSNormBadInput, WeightOfWrongRankShowsItsShape) {
  HostTensor w2(DType::bf16, 2, 64);
  expect_error([&] { rmsnorm(out.view(), x.view(), w2.view(), 1e-6); },
               "rmsnorm: weight must have shape [64], got [2, 64]");
  const TensorView scalar(w.bytes.data(), DType::bf16, Device{}, 0, nullptr, nullptr);
  expect_error([&] { rmsnorm(out.view(), x.view(), scalar, 1e-6); },
               "rmsnorm: weight must have shape [64], got []");
  expect_untouched();
}

TEST_F(RMSNormBadInput, NonContiguousLastDim) {
  const int64_t shape[2] = {4, 32}, strides[2] = {64, 2};
  TensorView xs(x.bytes.data(), DType::bf16, Device{}, 2, shape, strides);
  TensorView os(out.bytes.data(), DType::bf16, Device{}, 2, shape, strides);
  HostTensor w32(DType::bf16, 1, 32);
  expect_error([&] { rmsnorm(os, xs, w32.view(true), 1e-6); }, "contiguous in its last dim");
  expect_untouched();
}

TEST_F(RMSNormBadInput, MisalignedPointer) {
  TensorView xm(x.bytes.data() + 1, DType::bf16, Device{}, {2, 32});
  TensorView om(out.bytes.data(), DType::bf16, Device{}, {2, 32});
  HostTensor w32(DType::bf16, 1, 32);
  expect_error([&] { rmsnorm(om, xm, w32.view(true), 1e-6); }, "x data pointer");
  expect_untouched();
}

TEST_F(RMSNormBadInput, BadEps) {
  expect_error([&] { rmsnorm(out.view(), x.view(), w.view(true), 0.0); }, "eps must be");
  expect_error([&] { rmsnorm(out.view(), x.view(), w.view(true), -1e-6); }, "eps must be");
  expect_error([&] { rmsnorm(out.view(), x.view(), w.view(true), std::nan("")); }, "eps must be");
  expect_untouched();
}

TEST_F(RMSNormBadInput, DeviceMismatch) {
  TensorView wg(w.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {64});
  expect_error([&] { rmsnorm(out.view(), x.view(), wg, 1e-6); }, "weight is on cuda:0 but x is on cpu");
  expect_untouched();
}

TEST_F(RMSNormBadInput, PartialOverlap) {
  TensorView shifted(x.bytes.data() + 2 * 64, DType::bf16, Device{}, {3, 64});
  TensorView x3(x.bytes.data(), DType::bf16, Device{}, {3, 64});
  expect_error([&] { rmsnorm(shifted, x3, w.view(true), 1e-6); }, "overlap");
}

TEST_F(RMSNormBadInput, WrongRstd) {
  HostTensor rstd_short(DType::f32, 1, 3), rstd16(DType::bf16, 1, 4);
  expect_error([&] { rmsnorm(out.view(), x.view(), w.view(true), 1e-6, 0.0, rstd_short.view(true)); },
               "rstd must have shape [4]");
  expect_error([&] { rmsnorm(out.view(), x.view(), w.view(true), 1e-6, 0.0, rstd16.view(true)); },
               "rstd has dtype bfloat16");
  expect_untouched();
}

TEST_F(RMSNormBadInput, RowsThatDoNotFlatten) {
  // [2, 2, 16] with the middle dim strided by 32 and the outer by 48: not one row stride.
  const int64_t shape[3] = {2, 2, 16}, strides[3] = {48, 32, 1};
  TensorView xv(x.bytes.data(), DType::bf16, Device{}, 3, shape, strides);
  TensorView ov(out.bytes.data(), DType::bf16, Device{}, 3, shape, strides);
  HostTensor w16(DType::bf16, 1, 16);
  expect_error([&] { rmsnorm(ov, xv, w16.view(true), 1e-6); }, "do not flatten");
  expect_untouched();
}

TEST_F(RMSNormBadInput, EmptyTensors) {
  TensorView x0(x.bytes.data(), DType::bf16, Device{}, {0, 64});
  TensorView o0(out.bytes.data(), DType::bf16, Device{}, {0, 64});
  rmsnorm(o0, x0, w.view(true), 1e-6);  // no rows: a no-op
  expect_untouched();
  TensorView xe(x.bytes.data(), DType::bf16, Device{}, {4, 0});
  TensorView oe(out.bytes.data(), DType::bf16, Device{}, {4, 0});
  TensorView we(w.bytes.data(), DType::bf16, Device{}, {0});
  expect_error([&] { rmsnorm(oe, xe, we, 1e-6); }, "rmsnorm: x has an empty last dim (shape [4, 0])");
}

// CUDA views of dummy addresses: the calls below must fail before any is dereferenced.
struct DummyCudaViews {
  TensorView x, w, out;
  explicit DummyCudaViews(int device) {
    const Device cuda{DeviceType::cuda, device};
    auto at = [](uintptr_t mib) { return reinterpret_cast<void*>(mib << 20); };
    x = TensorView(at(1), DType::bf16, cuda, {4, 64});
    w = TensorView(at(2), DType::bf16, cuda, {64});
    out = TensorView(at(3), DType::bf16, cuda, {4, 64});
  }
};

TEST(RMSNormNoGpu, CudaTensorSaysNoGpuIsPresent) {
  if (has_gpu()) GTEST_SKIP() << "a CUDA GPU is present: this checks the message of a machine without one";
  const DummyCudaViews v(0);
  expect_error([&] { rmsnorm(v.out, v.x, v.w, 1e-6); }, "rmsnorm: x is a CUDA tensor but no CUDA GPU is present (cudaError");
}

TEST(RMSNormGpuBadInput, DeviceIndexOutOfRange) {
  LLMK_REQUIRE_GPU();
  const int count = cuda_device_count();
  const DummyCudaViews v(count);
  expect_error([&] { rmsnorm(v.out, v.x, v.w, 1e-6); },
               "rmsnorm: x is on cuda:" + std::to_string(count) + " but " + std::to_string(count) +
                   (count == 1 ? " CUDA device is present" : " CUDA devices are present"));
}

TEST(RMSNormGpuBadInput, HostWeightWithDeviceInput) {
  LLMK_REQUIRE_GPU();
  HostTensor x(DType::bf16, 2, 64), w(DType::bf16, 1, 64), out(DType::bf16, 2, 64);
  x.randomize();
  out.poison();
  DeviceTensor dx(x), dout(out);
  expect_error([&] { rmsnorm(dout.view(), dx.view(), w.view(true), 1e-6); },
               "weight is on cpu:0 but x is on cuda:0");
  EXPECT_EQ(dout.download().bytes, out.bytes);
}

}  // namespace
}  // namespace llmk::test
