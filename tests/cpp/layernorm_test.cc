// layernorm: the CPU reference against hand-computed values and its defining properties,
// the CUDA kernels against the CPU reference (every kernel path, optional weight and bias,
// fp32 parameters, strided rows, in place, inputs far from zero), and bad inputs. The
// kernel paths are the launch rule's choices (the warp kernel for many rows of 33-128
// vectors, the lean register kernel for longer rows, the register kernel with the weight
// prefetched for few rows, the loop kernel for unaligned rows) and each path that
// LLMK_NORM_PATH names, run on the same cases.
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

TEST(LayerNormCpu, MatchesHandComputedValues) {
  HostTensor x(DType::f32, 1, 4), w(DType::f32, 1, 4), b(DType::f32, 1, 4), out(DType::f32, 1, 4);
  HostTensor mean(DType::f32, 1, 1), rstd(DType::f32, 1, 1);
  for (int c = 0; c < 4; ++c) {
    x.set(0, c, float(c + 1));  // mean 2.5, variance 1.25
    w.set(0, c, 2.0f);
    b.set(0, c, 0.5f);
  }
  const double r = 1.0 / std::sqrt(1.25 + 1e-5);
  layernorm(out.view(), x.view(), w.view(true), b.view(true), 1e-5, mean.view(true), rstd.view(true));
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(out.get(0, c), (c + 1 - 2.5) * r * 2 + 0.5, 1e-6);
  EXPECT_NEAR(mean.get(0, 0), 2.5, 1e-7);
  EXPECT_NEAR(rstd.get(0, 0), r, 1e-6);
  layernorm(out.view(), x.view(), std::nullopt, std::nullopt, 1e-5);  // no affine parameters
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(out.get(0, c), (c + 1 - 2.5) * r, 1e-6);
}

TEST(LayerNormCpu, OutputHasZeroMeanUnitVariance) {
  for (DType dt : all_dtypes()) {
    HostTensor x(dt, 3, 257), out(dt, 3, 257);
    x.randomize(5.0f, 3.0f);
    layernorm(out.view(), x.view(), std::nullopt, std::nullopt, 1e-12);
    for (int r = 0; r < 3; ++r) {
      double s = 0, ss = 0;
      for (int c = 0; c < 257; ++c) {
        s += out.get(r, c);
        ss += double(out.get(r, c)) * out.get(r, c);
      }
      EXPECT_NEAR(s / 257, 0.0, 4 * dtype_rtol(dt)) << dtype_name(dt);
      EXPECT_NEAR(ss / 257, 1.0, 4 * dtype_rtol(dt)) << dtype_name(dt);
    }
  }
}

struct Case {
  DType dt, pdt;
  int64_t rows, d, stride;
  bool weight, bias, in_place;
  float mean;  // inputs are mean + N(0, 1): far from zero tests the centered variance
};

void run_gpu_case(const Case& k) {
  SCOPED_TRACE(testing::Message() << dtype_name(k.dt) << " params " << dtype_name(k.pdt) << " rows "
                                  << k.rows << " d " << k.d << " stride " << k.stride << " weight "
                                  << k.weight << " bias " << k.bias << " in_place " << k.in_place
                                  << " mean " << k.mean);
  HostTensor x(k.dt, k.rows, k.d, k.stride), w(k.pdt, 1, k.d), b(k.pdt, 1, k.d);
  x.randomize(k.mean, 1.0f);
  w.randomize(1.0f, 0.5f);
  b.randomize();
  auto opt = [](bool on, const TensorView& v) { return on ? std::optional<TensorView>(v) : std::nullopt; };
  HostTensor ref(k.dt, k.rows, k.d, k.stride), ref_mean(DType::f32, 1, k.rows), ref_rstd(DType::f32, 1, k.rows);
  layernorm(ref.view(), x.view(), opt(k.weight, w.view(true)), opt(k.bias, b.view(true)), 1e-5,
            ref_mean.view(true), ref_rstd.view(true));

  HostTensor out(k.dt, k.rows, k.d, k.stride), mean(DType::f32, 1, k.rows), rstd(DType::f32, 1, k.rows);
  out.poison();
  mean.poison();
  rstd.poison();
  DeviceTensor gx(x), gw(w), gb(b), gout(out), gmean(mean), grstd(rstd);
  layernorm(k.in_place ? gx.view() : gout.view(), gx.view(), opt(k.weight, gw.view(true)),
            opt(k.bias, gb.view(true)), 1e-5, gmean.view(true), grstd.view(true));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The output is (x - mean) * rstd * w + b: its error is relative to |(x - mean) * rstd * w|
  // and |b|, not to the output (which can cancel to ~0 when b ~ -(...)).
  float scale = 0;
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.d; ++c)
      scale = std::max(scale, std::fabs(ref.get(r, c)) + (k.bias ? std::fabs(b.get(0, c)) : 0.0f));
  expect_close((k.in_place ? gx : gout).download(), ref, dtype_rtol(k.dt), "out", dtype_rtol(k.dt) * scale);
  expect_close(gmean.download(), ref_mean, 1e-5f, "mean", 1e-5f * (std::fabs(k.mean) + 1));
  expect_close(grstd.download(), ref_rstd, 1e-4f, "rstd");
}

TEST(LayerNormGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (int64_t d : {1, 7, 8, 33, 768, 1000, 4096, 5120, 16384, 65536})
      for (int64_t rows : {1, 3, 37}) {
        if (d == 65536 && rows == 37) continue;
        run_gpu_case({dt, dt, rows, d, d, true, true, false, 0.0f});
      }
}

TEST(LayerNormGpu, OptionalParamsStridesInPlaceFarFromZero) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case({dt, dt, 19, 4096, 3 * 4096, true, false, false, 0.0f});
    run_gpu_case({dt, dt, 19, 1024, 1024 + 3, false, true, false, 0.0f});  // loop kernel
    run_gpu_case({dt, dt, 19, 2048, 2048, false, false, true, 0.0f});
    run_gpu_case({dt, DType::f32, 23, 2048, 2048, true, true, true, 0.0f});
    run_gpu_case({dt, dt, 23, 4096, 4096, true, true, false, dt == DType::f32 ? 1000.0f : 30.0f});
    // Many rows of 64 and 112 vectors, far from zero.
    run_gpu_case({dt, dt, 1100, 64 * 16 / dtype_size(dt), 64 * 16 / dtype_size(dt), true, true, false, 0.0f});
    run_gpu_case({dt, dt, 1031, 112 * 16 / dtype_size(dt), 112 * 16 / dtype_size(dt), true, true, false, 20.0f});
  }
}

// Many rows (>= 2 per SM on GPUs of up to 150 SMs, so the rule takes the warp or the lean
// kernel), rows not a multiple of the warp kernel's 8 rows per block, and each row length
// class of the warp kernel: 33 (the shortest), 64, 65, 96 (768 in 16-bit types), 112 and 128
// (1024 in 16-bit types) 16-byte vectors; then the lean kernel's rows of 300-520 vectors.
TEST(LayerNormGpu, ManyRowsTakeTheWarpAndLeanKernels) {
  LLMK_REQUIRE_GPU();
  NormPathScope rule(nullptr);
  for (DType dt : all_dtypes()) {
    const int64_t vec = 16 / static_cast<int64_t>(dtype_size(dt));
    for (int64_t vectors : {33, 64, 65, 96, 112, 128}) {
      const int64_t d = vectors * vec;
      run_gpu_case({dt, dt, 1031, d, d, true, true, false, 0.0f});
      run_gpu_case({dt, dt, 301, d, d + 3 * vec, true, true, false, 10.0f});  // strided, far from zero
    }
    run_gpu_case({dt, DType::f32, 333, 96 * vec, 96 * vec, true, true, false, 0.0f});  // fp32 parameters
    run_gpu_case({dt, dt, 333, 128 * vec, 128 * vec, false, true, false, 0.0f});       // bias only
    run_gpu_case({dt, dt, 333, 128 * vec, 128 * vec, true, false, true, 0.0f});        // weight only, in place
    run_gpu_case({dt, dt, 333, 100 * vec, 100 * vec, false, false, false, 0.0f});      // neither
    run_gpu_case({dt, dt, 300, 4096, 4096, true, true, false, 0.0f});                  // lean kernel
    run_gpu_case({dt, DType::f32, 300, 4096, 2 * 4096, true, true, true, 0.0f});
    run_gpu_case({dt, dt, 300, 520 * vec, 520 * vec, false, true, false, 5.0f});
    // The lean kernel at VPT 2 with its loads first: 300 vectors on 160 threads, so the last
    // 20 threads' second vectors lie past the row (read as zeros, left out of the variance).
    run_gpu_case({dt, dt, 300, 300 * vec, 300 * vec + vec, true, true, false, 3.0f});
  }
}

// Every path LLMK_NORM_PATH names, on rows it takes and on rows it does not (those follow
// the rule): few and many rows, short, warp-sized, long and unaligned rows.
TEST(LayerNormGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "lean", "vec", "stream"}, [](DType dt, int64_t vec) {
    for (int64_t d : {int64_t{8}, 33 * vec, 96 * vec, 128 * vec, int64_t{4096}, 129 * vec, int64_t{1000}})
      for (int64_t rows : {1, 37, 300}) run_gpu_case({dt, dt, rows, d, d, true, true, false, 0.0f});
    run_gpu_case({dt, DType::f32, 77, 64 * vec, 64 * vec + vec, false, true, true, 20.0f});
    run_gpu_case({dt, dt, 77, 2048, 3 * 2048, true, false, false, 0.0f});
    run_gpu_case({dt, dt, 19, 1024, 1024 + 3, true, true, false, 0.0f});  // unaligned: loop kernel
  });
}

TEST(LayerNormGpu, UnknownNormPathIsAnError) {
  LLMK_REQUIRE_GPU();
  NormPathScope scope("fastest");
  HostTensor x(DType::bf16, 4, 1024), out(DType::bf16, 4, 1024);
  x.randomize();
  out.poison();
  DeviceTensor gx(x), gout(out);
  expect_error([&] { layernorm(gout.view(), gx.view(), std::nullopt, std::nullopt, 1e-5); },
               "layernorm: LLMK_NORM_PATH=fastest is not one of auto, warp, lean, vec, stream");
}

class LayerNormBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, w{DType::bf16, 1, 64}, b{DType::bf16, 1, 64}, out{DType::bf16, 4, 64};
  void SetUp() override {
    x.randomize();
    w.randomize();
    b.randomize();
    out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 64);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes) << "a rejected call wrote to out";
  }
};

TEST_F(LayerNormBadInput, ParameterDtypesAndShapes) {
  HostTensor b32(DType::f32, 1, 64), b16(DType::f16, 1, 64), b_short(DType::bf16, 1, 63);
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), b32.view(true), 1e-5); },
               "weight is bfloat16 but bias is float32");
  expect_error([&] { layernorm(out.view(), x.view(), std::nullopt, b16.view(true), 1e-5); },
               "bias has dtype float16");
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), b_short.view(true), 1e-5); },
               "bias must have shape [64]");
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), b.view(true), 0.0); }, "eps must be");
  HostTensor mean_short(DType::f32, 1, 3);
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), b.view(true), 1e-5, mean_short.view(true)); },
               "mean must have shape [4]");
  expect_untouched();
}

TEST_F(LayerNormBadInput, ParametersOfWrongRankShowTheirShape) {
  HostTensor w2(DType::bf16, 2, 64);
  const TensorView scalar(b.bytes.data(), DType::bf16, Device{}, 0, nullptr, nullptr);
  expect_error([&] { layernorm(out.view(), x.view(), w2.view(), b.view(true), 1e-5); },
               "layernorm: weight must have shape [64], got [2, 64]");
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), scalar, 1e-5); },
               "layernorm: bias must have shape [64], got []");
  expect_untouched();
}

TEST_F(LayerNormBadInput, DeviceMismatchAndEmpty) {
  TensorView bg(b.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {64});
  expect_error([&] { layernorm(out.view(), x.view(), w.view(true), bg, 1e-5); },
               "bias is on cuda:0 but x is on cpu");
  TensorView x0(x.bytes.data(), DType::bf16, Device{}, {0, 64});
  TensorView o0(out.bytes.data(), DType::bf16, Device{}, {0, 64});
  layernorm(o0, x0, w.view(true), b.view(true), 1e-5);
  expect_untouched();
}

}  // namespace
}  // namespace llmk::test
