// layernorm_backward: the CPU reference against finite differences of the CPU forward, the
// CUDA kernels against the CPU reference on every path (with and without weight and
// gradients; statistics recomputed from x and given as the forward's), determinism, and bad
// inputs. The paths: the warp path (many rows of 33-128
// vectors), the vector path (other aligned rows; LLMK_NORM_PATH=vec also for those), the
// loop path (unaligned or very long rows).
#include <cstdlib>

#include "test_util.h"

namespace llmk::test {
namespace {

// Loss L = sum(dy * layernorm(x)); checks dL/dx, dL/dw and dL/db by central differences.
TEST(LayerNormBackwardCpu, MatchesFiniteDifferences) {
  const int64_t rows = 3, d = 13;
  HostTensor x(DType::f32, rows, d), w(DType::f32, 1, d), b(DType::f32, 1, d), dy(DType::f32, rows, d);
  x.randomize(0.5f, 1.0f);
  w.randomize();
  b.randomize();
  dy.randomize();
  const double eps = 1e-3;
  HostTensor dx(DType::f32, rows, d), dw(DType::f32, 1, d), db(DType::f32, 1, d);
  layernorm_backward(dx.view(), dw.view(true), db.view(true), dy.view(), x.view(), w.view(true), eps);
  auto loss = [&]() {
    HostTensor y(DType::f32, rows, d);
    layernorm(y.view(), x.view(), w.view(true), b.view(true), eps);
    double l = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) l += double(dy.get(r, c)) * y.get(r, c);
    return l;
  };
  auto central = [&](HostTensor& t, int r, int c) { return central_difference(t, r, c, loss); };
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) EXPECT_NEAR(dx.get(r, c), central(x, r, c), 2e-3) << "dx " << r << "," << c;
  for (int c = 0; c < d; ++c) {
    EXPECT_NEAR(dw.get(0, c), central(w, 0, c), 2e-3) << "dw " << c;
    EXPECT_NEAR(db.get(0, c), central(b, 0, c), 2e-3) << "db " << c;
  }
}

// With the CPU forward's mean and rstd, moved off (mean + 0.1, rstd * 1.25): the GPU must
// read the statistics it is given (the same moved ones in the reference), not recompute them.
void stats_of(HostTensor& x, HostTensor& mean, HostTensor& rstd) {
  HostTensor y(x.dtype, x.rows, x.d);
  layernorm(y.view(), x.view(), std::nullopt, std::nullopt, 1e-5, mean.view(true),
            rstd.view(true));
  for (int64_t r = 0; r < x.rows; ++r) {
    mean.set(0, r, mean.get(0, r) + 0.1f);
    rstd.set(0, r, rstd.get(0, r) * 1.25f);
  }
}

// The CPU reference with the forward's own statistics gives the recomputing form's gradients
// (to fp32 rounding of the statistics); with moved ones it gives other gradients: it uses them.
TEST(LayerNormBackwardCpu, SavedStatisticsAreUsed) {
  const int64_t rows = 5, d = 37;
  HostTensor x(DType::f32, rows, d), w(DType::f32, 1, d), dy(DType::f32, rows, d);
  x.randomize(0.5f, 1.0f);
  w.randomize();
  dy.randomize();
  HostTensor y(DType::f32, rows, d), mean(DType::f32, 1, rows), rstd(DType::f32, 1, rows);
  layernorm(y.view(), x.view(), w.view(true), std::nullopt, 1e-5, mean.view(true), rstd.view(true));
  auto backward = [&](bool saved, HostTensor& dx, HostTensor& dw, HostTensor& db) {
    layernorm_backward(dx.view(), dw.view(true), db.view(true), dy.view(), x.view(), w.view(true), 1e-5,
                       saved ? std::optional<TensorView>(mean.view(true)) : std::nullopt,
                       saved ? std::optional<TensorView>(rstd.view(true)) : std::nullopt);
  };
  HostTensor dx0(DType::f32, rows, d), dw0(DType::f32, 1, d), db0(DType::f32, 1, d);
  HostTensor dx1(DType::f32, rows, d), dw1(DType::f32, 1, d), db1(DType::f32, 1, d);
  backward(false, dx0, dw0, db0);
  backward(true, dx1, dw1, db1);
  expect_close(dx1, dx0, 1e-5f, "dx", 1e-6f);
  expect_close(dw1, dw0, 1e-5f, "dweight", 1e-6f);
  expect_close(db1, db0, 0.0f, "dbias", 0.0f);
  for (int64_t r = 0; r < rows; ++r) rstd.set(0, r, rstd.get(0, r) * 1.25f);
  backward(true, dx1, dw1, db1);
  double moved = 0;
  for (int64_t c = 0; c < d; ++c) moved = std::max(moved, std::fabs(double(dw1.get(0, c)) - dw0.get(0, c)));
  EXPECT_GT(moved, 1e-3) << "a moved rstd left dweight as it was";
}

void run_gpu_case(DType dt, DType pdt, int64_t rows, int64_t d, int64_t stride, bool with_weight,
                  bool saved_stats = false) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " params " << dtype_name(pdt) << " rows " << rows
                                  << " d " << d << " stride " << stride << " weight " << with_weight
                                  << " saved stats " << saved_stats);
  HostTensor x(dt, rows, d, stride), dy(dt, rows, d, stride), w(pdt, 1, d);
  x.randomize(0.5f, 1.0f);
  dy.randomize();
  w.randomize(1.0f, 0.5f);
  HostTensor mean(DType::f32, 1, rows), rstd(DType::f32, 1, rows);
  if (saved_stats) stats_of(x, mean, rstd);
  auto stat = [&](HostTensor& t) { return saved_stats ? std::optional<TensorView>(t.view(true)) : std::nullopt; };
  const auto wopt = with_weight ? std::optional<TensorView>(w.view(true)) : std::nullopt;
  HostTensor ref_dx(dt, rows, d, stride), ref_dw(pdt, 1, d), ref_db(pdt, 1, d);
  layernorm_backward(ref_dx.view(), with_weight ? std::optional<TensorView>(ref_dw.view(true)) : std::nullopt,
                     ref_db.view(true), dy.view(), x.view(), wopt, 1e-5, stat(mean), stat(rstd));

  HostTensor dx(dt, rows, d, stride), dw(pdt, 1, d), db(pdt, 1, d);
  dx.poison();
  dw.poison();
  db.poison();
  DeviceTensor gx(x), gdy(dy), gw(w), gdx(dx), gdw(dw), gdb(db), gmean(mean), grstd(rstd);
  auto gstat = [&](const DeviceTensor& t) {
    return saved_stats ? std::optional<TensorView>(t.view(true)) : std::nullopt;
  };
  float* ws = nullptr;
  const int64_t ws_n = std::max<int64_t>(layernorm_backward_workspace_size(rows, d), 1);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ws), ws_n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0xff, ws_n * 4), cudaSuccess);
  const TensorView ws_view(ws, DType::f32, Device{DeviceType::cuda, 0}, {ws_n});
  auto run = [&] {
    layernorm_backward(gdx.view(), with_weight ? std::optional<TensorView>(gdw.view(true)) : std::nullopt,
                       gdb.view(true), gdy.view(), gx.view(),
                       with_weight ? std::optional<TensorView>(gw.view(true)) : std::nullopt, 1e-5, gstat(gmean),
                       gstat(grstd), ws_view);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  run();
  // dx is a difference of terms of size rstd * |dy * w|: its error is relative to them;
  // dweight and dbias sum `rows` terms of size |dy * xhat| and |dy|.
  float term = 0, dw_term = 0;
  const float stat_scale = saved_stats ? 1.25f : 1.0f;  // rstd moved up, xhat with it
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) {
      term = std::max(term, std::fabs(dy.get(r, c) * (with_weight ? w.get(0, c) : 1.0f)) * 4 * stat_scale);
      dw_term = std::max(dw_term, std::fabs(dy.get(r, c)) * 4 * stat_scale);
    }
  expect_close(gdx.download(), ref_dx, dtype_rtol(dt), "dx", 2 * dtype_rtol(dt) * term);
  const HostTensor db1 = gdb.download();
  expect_close(db1, ref_db, dtype_rtol(pdt), "dbias", 4e-6f * rows * dw_term);
  if (with_weight) expect_close(gdw.download(), ref_dw, dtype_rtol(pdt), "dweight", 4e-6f * rows * dw_term);
  run();
  EXPECT_EQ(gdb.download().bytes, db1.bytes) << "dbias is not deterministic";
  cudaFree(ws);
}

TEST(LayerNormBackwardGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (int64_t d : {1, 7, 64, 768, 1000, 4096, 5120, 16384, 32768})
      for (int64_t rows : {1, 5, 300}) {
        if (d >= 16384 && rows == 300) continue;
        run_gpu_case(dt, dt, rows, d, d, true);
      }
}

// The forward's statistics given (moved off what x gives: see stats_of) on every path: the
// vector path (few and many rows, VPT 1-16), the warp path, the loop path (unaligned rows,
// rows too long for registers), with and without weight, fp32 parameters, strided rows.
TEST(LayerNormBackwardGpu, SavedStatisticsOnEveryPath) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "vec"}, [](DType dt, int64_t vec) {
    // d = 7, not 1: a row of one element has variance 0, and the moved mean over rstd = 1 /
    // sqrt(eps) sends 16-bit dx to inf (on both sides, which the comparison counts as a miss).
    for (int64_t d : {int64_t{7}, int64_t{1000}, 33 * vec, 128 * vec, int64_t{4096}, int64_t{16384}})
      for (int64_t rows : {1, 300, 1031})
        if (d < 16384 || rows < 1031) run_gpu_case(dt, dt, rows, d, d, true, true);
    run_gpu_case(dt, dt, 2000, 256, 256 + 5, true, true);  // unaligned: loop path, many rows
    run_gpu_case(dt, dt, 5, 40000, 40000, true, true);      // long rows: loop path
    run_gpu_case(dt, DType::f32, 77, 64 * vec, 3 * 64 * vec, false, true);
  });
}

TEST(LayerNormBackwardGpu, ManyRowsStridesNoWeightFp32Params) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes()) {
    run_gpu_case(dt, dt, 3000, 512, 512, true);          // more rows than partial sums
    run_gpu_case(dt, dt, 2000, 256, 256 + 5, true);      // unaligned: loop path, many rows
    run_gpu_case(dt, dt, 77, 2048, 3 * 2048, false);
    run_gpu_case(dt, DType::f32, 77, 2048, 2048, true);
  }
}

// The warp path: at least 2 rows per SM (GPUs of up to 150 SMs) of 33-128 vectors, rows not
// a multiple of the 16 warps per block, more rows than one pass of the persistent grid
// (3000 > 16 x 150), strided rows, no weight, fp32 parameters; determinism is checked by
// run_gpu_case (dbias bit for bit over two calls).
TEST(LayerNormBackwardGpu, ManyRowsTakeTheWarpPath) {
  LLMK_REQUIRE_GPU();
  NormPathScope rule(nullptr);
  for (DType dt : all_dtypes()) {
    const int64_t vec = 16 / static_cast<int64_t>(dtype_size(dt));
    for (int64_t vectors : {33, 64, 65, 96, 128}) run_gpu_case(dt, dt, 1031, vectors * vec, vectors * vec, true);
    run_gpu_case(dt, dt, 3000, 128 * vec, 128 * vec, true);
    run_gpu_case(dt, dt, 301, 96 * vec, 96 * vec + 2 * vec, true);
    run_gpu_case(dt, dt, 301, 100 * vec, 100 * vec, false);
    run_gpu_case(dt, DType::f32, 333, 128 * vec, 128 * vec, true);
  }
}

// Every path LLMK_NORM_PATH names (the backward has the warp and vector paths; the others
// follow the rule): few rows, many rows, warp-sized and longer rows.
TEST(LayerNormBackwardGpu, EveryNormPathMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_norm_path({"auto", "warp", "vec", "lean"}, [](DType dt, int64_t vec) {
    for (int64_t d : {33 * vec, 128 * vec, int64_t{4096}, int64_t{1000}})
      for (int64_t rows : {1, 5, 300}) run_gpu_case(dt, dt, rows, d, d, true);
    run_gpu_case(dt, DType::f32, 77, 64 * vec, 3 * 64 * vec, false);
  });
}

TEST(LayerNormBackwardBadInput, Arguments) {
  HostTensor x(DType::bf16, 4, 64), w(DType::bf16, 1, 64), dy(DType::bf16, 4, 64);
  HostTensor dx(DType::bf16, 4, 64), dw(DType::bf16, 1, 64), db32(DType::f32, 1, 64);
  x.randomize();
  dy.randomize();
  w.randomize();
  dx.poison();
  expect_error([&] { layernorm_backward(dx.view(), dw.view(true), std::nullopt, dy.view(), x.view(), std::nullopt, 1e-5); },
               "dweight needs the weight");
  expect_error([&] { layernorm_backward(dx.view(), dw.view(true), db32.view(true), dy.view(), x.view(), w.view(true), 1e-5); },
               "weight is bfloat16 but bias is float32");
  expect_error([&] { layernorm_backward(dy.view(), dw.view(true), std::nullopt, dy.view(), x.view(), w.view(true), 1e-5); },
               "dx and dy");
  HostTensor mean(DType::f32, 1, 4), rstd(DType::f32, 1, 4), mean3(DType::f32, 1, 3), mean16(DType::bf16, 1, 4);
  auto with_stats = [&](HostTensor& m, HostTensor* r) {
    layernorm_backward(dx.view(), dw.view(true), std::nullopt, dy.view(), x.view(), w.view(true), 1e-5,
                       m.view(true), r != nullptr ? std::optional<TensorView>(r->view(true)) : std::nullopt);
  };
  expect_error([&] { with_stats(mean, nullptr); }, "mean and rstd go together");
  expect_error([&] { with_stats(mean3, &rstd); }, "mean");
  expect_error([&] { with_stats(mean16, &rstd); }, "mean");
  expect_error([&] {
    layernorm_backward(dx.view(), dw.view(true), std::nullopt, dy.view(), x.view(), w.view(true), 1e-5, std::nullopt,
                       rstd.view(true));
  }, "mean and rstd go together");
  HostTensor fresh(DType::bf16, 4, 64);
  fresh.poison();
  EXPECT_EQ(dx.bytes, fresh.bytes);
}

}  // namespace
}  // namespace llmk::test
