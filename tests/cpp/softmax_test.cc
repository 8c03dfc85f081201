// softmax, log_softmax and their backwards: the CPU reference against hand-computed values,
// masking rules and finite differences; the CUDA kernels against the CPU reference (every
// kernel path: register-resident rows, long rows of the two-pass path, unaligned rows, long
// rows split over a thread-block cluster on sm_90 at few rows and at many; scales, inputs
// of magnitude 1e4, masked rows, strided rows, in place); fp32 accuracy at logits of
// magnitude 1e3; single columns (exactly 1 and 0); bad inputs.
#include "test_util.h"

namespace llmk::test {
namespace {

void forward(bool log, const TensorView& out, const TensorView& x, double scale = 1.0) {
  if (log) log_softmax(out, x, scale);
  else softmax(out, x, scale);
}

void backward(bool log, const TensorView& dx, const TensorView& dy, const TensorView& y, double scale = 1.0) {
  if (log) log_softmax_backward(dx, dy, y, scale);
  else softmax_backward(dx, dy, y, scale);
}

TEST(SoftmaxCpu, MatchesHandComputedValues) {
  HostTensor x(DType::f32, 1, 3), y(DType::f32, 1, 3);
  for (int c = 0; c < 3; ++c) x.set(0, c, float(c + 1));
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  softmax(y.view(), x.view());
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(y.get(0, c), std::exp(c + 1.0) / z, 1e-7);
  log_softmax(y.view(), x.view(), 0.5);
  const double z_half = std::exp(0.5) + std::exp(1.0) + std::exp(1.5);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(y.get(0, c), 0.5 * (c + 1) - std::log(z_half), 1e-6);
}

TEST(SoftmaxCpu, MaskedEntriesAndRows) {
  const float inf = std::numeric_limits<float>::infinity();
  HostTensor x(DType::f32, 2, 4), y(DType::f32, 2, 4);
  for (int c = 0; c < 4; ++c) {
    x.set(0, c, c < 2 ? -inf : 0.0f);  // half masked
    x.set(1, c, -inf);                 // fully masked
  }
  softmax(y.view(), x.view());
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(y.get(0, c), c < 2 ? 0.0f : 0.5f);
    EXPECT_EQ(y.get(1, c), 0.0f);
  }
  log_softmax(y.view(), x.view());
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(y.get(0, c), c < 2 ? -inf : float(-std::log(2.0)));
    EXPECT_EQ(y.get(1, c), -inf);
  }
}

TEST(SoftmaxCpu, BackwardMatchesFiniteDifferences) {
  for (bool log : {false, true}) {
    HostTensor x(DType::f32, 2, 6), y(DType::f32, 2, 6), dy(DType::f32, 2, 6), dx(DType::f32, 2, 6);
    x.randomize();
    dy.randomize();
    const double scale = 0.7;
    forward(log, y.view(), x.view(), scale);
    backward(log, dx.view(), dy.view(), y.view(), scale);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 6; ++c) {
        const float h = 1e-2f, v = x.get(r, c);
        HostTensor plus(DType::f32, 2, 6), minus(DType::f32, 2, 6);
        x.set(r, c, v + h);
        forward(log, plus.view(), x.view(), scale);
        x.set(r, c, v - h);
        forward(log, minus.view(), x.view(), scale);
        x.set(r, c, v);
        double fd = 0;
        for (int j = 0; j < 6; ++j) fd += dy.get(r, j) * (double(plus.get(r, j)) - minus.get(r, j)) / (2 * h);
        EXPECT_NEAR(dx.get(r, c), fd, 2e-3 * (1 + std::fabs(fd))) << "log " << log << " row " << r << " col " << c;
      }
  }
}

// A single column: softmax is exactly 1 and log_softmax exactly 0, whatever the logit.
void check_one_column(bool on_gpu) {
  for (DType dt : all_dtypes())
    for (double scale : {1.0, 100.0, -3.0, 0.37}) {
      HostTensor x(dt, 37, 1), y(dt, 37, 1);
      x.randomize(0.0f, 1000.0f);
      for (bool log : {false, true}) {
        y.poison();
        if (on_gpu) {
          DeviceTensor gx(x), gy(y);
          forward(log, gy.view(), gx.view(), scale);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          y = gy.download();
        } else {
          forward(log, y.view(), x.view(), scale);
        }
        for (int64_t r = 0; r < 37; ++r)
          ASSERT_EQ(y.get(r, 0), log ? 0.0f : 1.0f)
              << (log ? "log_softmax " : "softmax ") << dtype_name(dt) << " scale " << scale << " x " << x.get(r, 0);
      }
    }
}

TEST(SoftmaxCpu, OneColumnIsExact) { check_one_column(false); }

struct Case {
  DType dt;
  int64_t rows, n, stride;
  double scale = 1.0;
  float magnitude = 3.0f;  // inputs are N(0, magnitude)
  bool in_place = false;
  int masked_rows = 0;     // the first rows are entirely -inf
};

void run_gpu_case(bool log, const Case& k) {
  SCOPED_TRACE(testing::Message() << (log ? "log_softmax " : "softmax ") << dtype_name(k.dt) << " rows "
                                  << k.rows << " n " << k.n << " stride " << k.stride << " scale " << k.scale
                                  << " magnitude " << k.magnitude << " in_place " << k.in_place
                                  << " masked rows " << k.masked_rows);
  const float rtol = dtype_rtol(k.dt);
  HostTensor x(k.dt, k.rows, k.n, k.stride), dy(k.dt, k.rows, k.n, k.stride);
  x.randomize(0.0f, k.magnitude);
  dy.randomize();
  // A sprinkle of masked entries in every row, and the fully masked rows: -inf after the
  // scale (a negative scale maps -inf inputs to +inf, which makes the row NaN, as in torch).
  const float masked = k.scale > 0 ? -INFINITY : INFINITY;
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.n; ++c)
      if (r < k.masked_rows || (c % 5 == 3 && k.n > 4)) x.set(r, c, masked);
  HostTensor ref(k.dt, k.rows, k.n, k.stride), ref_dx(k.dt, k.rows, k.n, k.stride);
  forward(log, ref.view(), x.view(), k.scale);
  backward(log, ref_dx.view(), dy.view(), ref.view(), k.scale);

  HostTensor out(k.dt, k.rows, k.n, k.stride), dx(k.dt, k.rows, k.n, k.stride);
  out.poison();
  dx.poison();
  DeviceTensor gx(x), gdy(dy), gout(out), gdx(dx), gy(ref);  // gy: the backward's y, the reference output
  forward(log, k.in_place ? gx.view() : gout.view(), gx.view(), k.scale);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got = (k.in_place ? gx : gout).download(), want = ref;
  if (log) {
    // -inf must match exactly; the finite values are differences u - lse, with an error
    // that scales with their magnitude.
    float scale = 1;
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t c = 0; c < k.n; ++c)
        if (std::isinf(want.get(r, c))) {
          ASSERT_EQ(got.get(r, c), want.get(r, c)) << "row " << r << " col " << c;
          got.set(r, c, 0.0f);
          want.set(r, c, 0.0f);
        } else {
          scale = std::max(scale, std::fabs(want.get(r, c)));
        }
    expect_close(got, want, rtol, "out", rtol * scale);
  } else {
    expect_close(got, want, rtol, "out");
  }
  backward(log, k.in_place ? gdy.view() : gdx.view(), gdy.view(), gy.view(), k.scale);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float gscale = 0;  // dx is a difference of terms of size |s dy| (times y)
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.n; ++c) gscale = std::max(gscale, std::fabs(float(k.scale) * dy.get(r, c)));
  expect_close((k.in_place ? gdy : gdx).download(), ref_dx, rtol, "dx", rtol * gscale);
}

TEST(SoftmaxGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (bool log : {false, true})
    for (DType dt : all_dtypes()) {
      for (int64_t n : {1, 7, 8, 33, 1000, 4096, 32000})  // 32000: a cluster of 3 on sm_90
        for (int64_t rows : {1, 3, 37}) run_gpu_case(log, {dt, rows, n, n});
      run_gpu_case(log, {dt, 3, 65536, 65536});    // the longest register-resident bf16 row (sm_90: cluster)
      // The longest register-resident row (512 threads x 16 vectors) at a row count that the
      // cluster rule leaves to one block per row in the forward (rows > SMs / 2 with fewer
      // than 160 SMs); the backward, which holds 8 vectors per thread, takes a cluster of 2.
      const int64_t longest = 512 * 16 * (16 / static_cast<int64_t>(dtype_size(dt)));
      run_gpu_case(log, {dt, 80, longest, longest});
      run_gpu_case(log, {dt, 2, 65544, 65544});    // two-pass path, vector loads (sm_90: cluster)
      run_gpu_case(log, {dt, 2, 262144, 262144});  // a long row (vocabulary-sized x 2; sm_90: cluster)
      run_gpu_case(log, {dt, 2, 524296, 524296});  // two-pass everywhere: past 8 blocks x 8192 vectors
    }
}

TEST(SoftmaxGpu, ScalesMagnitudesMaskingStridesInPlace) {
  LLMK_REQUIRE_GPU();
  for (bool log : {false, true})
    for (DType dt : all_dtypes()) {
      run_gpu_case(log, {dt, 19, 4096, 3 * 4096, 0.0883883});           // 1/sqrt(128), strided rows
      run_gpu_case(log, {dt, 19, 1024, 1024 + 3, -2.0});                 // unaligned rows, negative scale
      run_gpu_case(log, {dt, 7, 2048, 2048, 1.0, 1e4f});                 // magnitude 1e4
      run_gpu_case(log, {dt, 9, 512, 512, 1.0, 3.0f, false, 4});         // fully masked rows
      // Few rows at VPT 1 and 2 (16-bit softmax: the kept exponentials), a negative scale
      // (masked entries are +inf inputs), magnitude 1e4, a fully masked row.
      run_gpu_case(log, {dt, 5, 8192, 8192 + 8, -0.7, 3.0f, false, 1});
      run_gpu_case(log, {dt, 3, 4096, 4096, 1.0, 1e4f, false, 1});
      run_gpu_case(log, {dt, 3, 70000, 70000, 1.0, 3.0f, false, 1});     // masked row, two-pass (sm_90: cluster)
      run_gpu_case(log, {dt, 2, 524296, 524296, 1.0, 3.0f, false, 1});   // masked row, two-pass path
      run_gpu_case(log, {dt, 23, 2048, 2048, 0.5, 3.0f, true});          // in place
      run_gpu_case(log, {dt, 2, 100003, 100003, 1.0, 3.0f, true});       // in place, two-pass scalar
    }
}

// Vocabulary-sized rows at small batch. On sm_90 (H100: 132 SMs) softmax_cluster_launch.cuh's
// rule splits each row over a cluster of C blocks: C = min(8, max(ceil(V / M), SMs / rows),
// V / 1024) for V 16-byte vectors per row (M = 8192 forward, 4096 backward), when rows < 2 x
// SMs and C >= 2. Every case below takes it there (C = 8, except 80 x 70000: forward C = 2
// for 16-bit types and 3 for fp32, backward 3 and 5); elsewhere the one-block kernels run the
// same cases. run_gpu_case masks every fifth column.
TEST(SoftmaxGpu, VocabularyRowsOverClusters) {
  LLMK_REQUIRE_GPU();
  for (bool log : {false, true})
    for (DType dt : all_dtypes()) {
      for (int64_t n : {128256, 151936})
        for (int64_t rows : {1, 16}) run_gpu_case(log, {dt, rows, n, n});
      run_gpu_case(log, {dt, 3, 128264, 128264, 0.37});  // odd vector count: a shorter last slice
      // strided rows (NaN between them), negative scale, two fully masked rows
      run_gpu_case(log, {dt, 16, 151936, 151936 + 72, -1.5, 3.0f, false, 2});
      run_gpu_case(log, {dt, 1, 128256, 128256, 1.0, 1e4f});             // magnitude 1e4
      run_gpu_case(log, {dt, 4, 128256, 128256, 0.5, 3.0f, true});       // in place
      run_gpu_case(log, {dt, 80, 70000, 70000});  // rows past SMs / 2: as few blocks as hold the row
    }
}

// Long rows at many rows. On sm_90 softmax_cluster_launch.cuh's rule splits rows of more than
// 2048 16-byte vectors (16384 bf16 columns; backward 1024) over C = min(8, ceil(V / 2048))
// blocks (backward ceil(V / 1024)) when rows >= 2 x SMs (264 on the H100; on a GPU of more
// than 133 SMs these cases take the few-rows rule instead): 300 x 32000 bf16 takes C = 2
// (fp32: 4; backward 4 and 8), 300 x 128264 C = 8 with a shorter last slice; elsewhere the
// one-block kernels (two-pass past 65536 bf16 columns) run the same cases. run_gpu_case
// masks every fifth column and runs the backward on each case.
TEST(SoftmaxGpu, ManyLongRowsOverClusters) {
  LLMK_REQUIRE_GPU();
  for (bool log : {false, true})
    for (DType dt : all_dtypes()) {
      run_gpu_case(log, {dt, 300, 32000, 32000});
      run_gpu_case(log, {dt, 300, 128264, 128264, 0.37});
      // strided rows (NaN between them), negative scale, three fully masked rows
      run_gpu_case(log, {dt, 280, 24000, 24000 + 40, -1.5, 3.0f, false, 3});
      run_gpu_case(log, {dt, 270, 20008, 20008, 1.0, 1e4f});            // magnitude 1e4
      run_gpu_case(log, {dt, 266, 40000, 40000, 0.5, 3.0f, true});       // in place
    }
}

TEST(SoftmaxGpu, OneColumnIsExact) {
  LLMK_REQUIRE_GPU();
  check_one_column(true);
}

// fp32 logits s x of magnitude ~1e3 against the double reference. The bound is what an
// fp32 softmax reaches when it forms each exponent z = s x - max(s x) with a relative error
// of 2^-23 (one rounding of x - max, one of the product) and rounds a few more times
// (expf's 2 ulp, as torch.softmax; the sum; the division):
//   softmax:     |y - ref| <= (1e-6 + 2^-23 |z|) |ref|
//   log_softmax: |y - ref| <= 1e-6 (1 + |ref|)
// An exponent formed as fl(s x) - max carries an absolute error of |s x| 2^-24, 6e-5 here.
void check_large_logits(bool log, int64_t rows, int64_t n, double scale, float mean, float stddev) {
  SCOPED_TRACE(testing::Message() << (log ? "log_softmax" : "softmax") << " n " << n << " scale " << scale
                                  << " x = " << mean << " + " << stddev << " randn");
  HostTensor x(DType::f32, rows, n), want(DType::f32, rows, n), out(DType::f32, rows, n);
  x.randomize(mean, stddev);
  forward(log, want.view(), x.view(), scale);
  out.poison();
  DeviceTensor gx(x), gout(out);
  forward(log, gout.view(), gx.view(), scale);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = gout.download();
  double worst = 0;  // the largest |y - ref| / bound
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = std::max(m, scale * x.get(r, c));
    for (int64_t c = 0; c < n; ++c) {
      const double z = scale * x.get(r, c) - m, w = want.get(r, c), g = got.get(r, c);
      const double bound = log ? 1e-6 * (1 + std::fabs(w)) : (1e-6 + std::ldexp(std::fabs(z), -23)) * std::fabs(w) + 1e-40;
      const double ratio = std::fabs(g - w) / bound;
      if (!(ratio <= 1) && worst <= 1)
        ADD_FAILURE() << "row " << r << " col " << c << ": got " << g << ", want " << w << " (z " << z << ")";
      worst = std::isnan(ratio) ? INFINITY : std::max(worst, ratio);
    }
  }
  EXPECT_LE(worst, 1.0) << "largest error / bound";
}

TEST(SoftmaxGpu, LargeLogitsKeepFp32Accuracy) {
  LLMK_REQUIRE_GPU();
  for (bool log : {false, true})
    // register-resident, two-pass (sm_90: cluster), unaligned rows, cluster on sm_90, two-pass
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{8, 1000}, {8, 70000}, {8, 1003}, {1, 151936}, {2, 524296}}) {
      check_large_logits(log, rows, n, 1.0, 0.0f, 1000.0f);
      check_large_logits(log, rows, n, 100.0, 0.0f, 10.0f);
      check_large_logits(log, rows, n, 100.0, 10.0f, 0.03f);  // many entries near the max
      check_large_logits(log, rows, n, -100.0, 10.0f, 0.03f);
    }
}

class SoftmaxBadInput : public testing::Test {
 protected:
  HostTensor x{DType::bf16, 4, 64}, out{DType::bf16, 4, 64};
  void SetUp() override {
    x.randomize();
    out.poison();
  }
  void expect_untouched() {
    HostTensor fresh(DType::bf16, 4, 64);
    fresh.poison();
    EXPECT_EQ(out.bytes, fresh.bytes) << "a rejected call wrote to out";
  }
};

TEST_F(SoftmaxBadInput, ShapesDtypesScale) {
  HostTensor short_out(DType::bf16, 4, 63), f16(DType::f16, 4, 64);
  expect_error([&] { softmax(short_out.view(), x.view()); }, "softmax: out has shape [4, 63] but x has shape [4, 64]");
  expect_error([&] { log_softmax(f16.view(), x.view()); }, "log_softmax: out has dtype float16");
  expect_error([&] { softmax(out.view(), x.view(), std::nan("")); }, "scale must be finite");
  expect_error([&] { softmax(out.view(), x.view(), 1e300); }, "scale must be finite in float32");
  expect_error([&] { softmax(out.view(), x.view(), 3e38); },
               "softmax: scale must be finite in float32, times log2(e) (|scale| < 2.3e38), got 3e+38");
  HostTensor i32(DType::i32, 4, 64);
  expect_error([&] { softmax(out.view(), i32.view()); },
               "softmax: x has unsupported dtype int32 (expected float32, float16 or bfloat16)");
  HostTensor dy(DType::bf16, 4, 64);
  expect_error([&] { softmax_backward(out.view(), dy.view(), f16.view()); }, "dy has dtype bfloat16, expected float16");
  expect_untouched();
}

TEST_F(SoftmaxBadInput, OverlapDevicesEmpty) {
  const int64_t shape[2] = {4, 64}, strides[2] = {64, 1};
  TensorView shifted(x.bytes.data() + 2, DType::bf16, Device{}, 2, shape, strides);
  expect_error([&] { softmax(shifted, x.view()); }, "overlap");
  TensorView xg(x.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, {4, 64});
  expect_error([&] { softmax(out.view(), xg); }, "out is on cpu:0 but x is on cuda:0");
  TensorView x0(x.bytes.data(), DType::bf16, Device{}, {0, 64});
  TensorView o0(out.bytes.data(), DType::bf16, Device{}, {0, 64});
  softmax(o0, x0);
  expect_untouched();
}

}  // namespace
}  // namespace llmk::test
