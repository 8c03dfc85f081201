// bias_gelu and bias_gelu_backward: the CPU reference against hand values and finite
// differences, the backward's launch geometry (host arithmetic: runs without a GPU), the
// CUDA kernels against the CPU reference (both GELU forms, every dtype, odd and strided
// rows, the geometry's boundaries, split rows, in place), dbias determinism across calls
// and CUDA-graph replays, bad inputs.
#include "activation/bias_gelu_params.h"
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

// The backward's geometry on GPUs of 1, 108 (A100) and 132 (H100) SMs: blocks of 256
// threads cover every vector of a row; the splits fill at most one wave of 4 blocks per SM
// with >= 4 rows per thread and >= 64 per block, only where a thread would otherwise loop
// over > 8 rows.
TEST(BiasGeluGeometry, CoversTheRowsAndFillsAtMostOneWave) {
  struct Width {
    int vector, bytes;  // elements per access and their bytes
  };
  for (int sms : {1, 108, 132})
    for (Width w : {Width{4, 16}, Width{8, 16}, Width{1, 4}, Width{1, 2}})
      for (int64_t rows : {1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 5000, 70000, 1 << 24})
        for (int64_t vectors : {1, 3, 129, 384, 2048, 4800, 1 << 20}) {
          SCOPED_TRACE(testing::Message() << sms << " SMs, vector " << w.vector << " of " << w.bytes
                                          << " bytes, rows " << rows << " vectors " << vectors);
          const int64_t d = vectors * w.vector, wave = int64_t{4} * sms;
          const detail::BiasGeluBackwardGeometry g =
              detail::bias_gelu_backward_geometry(rows, d, w.vector, w.bytes, sms);
          ASSERT_TRUE(g.tx >= 1 && g.tx <= 256 && (g.tx & (g.tx - 1)) == 0) << "tx " << g.tx;
          ASSERT_EQ(g.tx * g.ty, 256);
          EXPECT_EQ(g.column_blocks, (vectors + g.tx - 1) / g.tx);
          EXPECT_GE(g.splits, 1);
          if (g.splits > 1) {
            EXPECT_LE(g.column_blocks * g.splits, wave);
            EXPECT_GE(rows, 4 * g.ty * g.splits) << "fewer than 4 rows per thread";
            EXPECT_GE(rows, 64 * g.splits) << "fewer than 64 rows per block";
            EXPECT_GT((rows + g.ty - 1) / g.ty, 8);
            EXPECT_EQ(g.workspace(d), g.splits * d + g.column_blocks);
            // The partial rows, written and read in fp32: <= 1 / (24 * element bytes) of the
            // rows' traffic (dy, x, dx).
            const int elem = w.bytes / w.vector;
            EXPECT_LE(2.0 * g.splits * d * 4, rows * 3.0 * d * elem / (24.0 * elem) + 1e-9);
          } else {
            EXPECT_EQ(g.workspace(d), 0);
          }
        }
}

// The shapes of the benchmark (bf16, H100): what the geometry's comment promises.
TEST(BiasGeluGeometry, BenchmarkShapesOnTheH100) {
  struct Want {
    int64_t rows, d;
    int tx, ty;
    int64_t column_blocks, splits;
  };
  for (const Want& w : {Want{1, 3072, 256, 1, 2, 1}, Want{16, 3072, 16, 16, 24, 1}, Want{2048, 3072, 16, 16, 24, 22},
                        Want{8192, 3072, 16, 16, 24, 22}, Want{16, 16384, 16, 16, 128, 1},
                        Want{2048, 16384, 16, 16, 128, 4}, Want{8192, 16384, 16, 16, 128, 4}}) {
    SCOPED_TRACE(testing::Message() << w.rows << " x " << w.d);
    const detail::BiasGeluBackwardGeometry g = detail::bias_gelu_backward_geometry(w.rows, w.d, 8, 16, 132);
    EXPECT_EQ(g.tx, w.tx);
    EXPECT_EQ(g.ty, w.ty);
    EXPECT_EQ(g.column_blocks, w.column_blocks);
    EXPECT_EQ(g.splits, w.splits);
  }
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

float abs_max(const HostTensor& t) {
  float m = 0;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.d; ++c) m = std::max(m, std::fabs(t.get(r, c)));
  return m;
}

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
  const float dy_max = abs_max(dy);
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
      run_gpu_case(a, dt, 3000, 256, 256);       // split rows, one or two column blocks
      run_gpu_case(a, dt, 300, 100, 100 + 3);    // unaligned rows: the scalar kernels
      run_gpu_case(a, dt, 70000, 8, 8 + 16);     // one vector per row: 256-row blocks, many rows each
    }
}

// The geometry's boundaries on the GPU: ty ~ rows up to 16 rows; unsplit up to 128 rows
// (127 in the N = 1 kernels), split from 129 (128): arrival counters, partial rows; d an
// odd multiple of the vector (a ragged last column block), the same with strided rows, and
// d odd (the N = 1 kernels).
TEST(BiasGeluGpu, GeometryBoundaries) {
  LLMK_REQUIRE_GPU();
  int k = 0;
  for (DType dt : all_dtypes()) {
    const int64_t vec = 16 / dtype_size(dt);
    for (int64_t rows : {1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 5000}) {
      const GeluApproximation a = kForms[k++ % 2];
      run_gpu_case(a, dt, rows, vec * 129, vec * 129);
      run_gpu_case(a, dt, rows, vec * 129, vec * 131);
      run_gpu_case(a, dt, rows, 129, 129);
    }
  }
}

// Repeated calls with the same shape give the same dbias bits, eagerly and as replays of a
// captured CUDA graph (the counter memset is part of the graph; the workspace starts as
// NaN bits: garbage counters); a replay with new dy matches the reference.
TEST(BiasGeluGpu, RepeatedCallsAndGraphReplaysAreBitwiseIdentical) {
  LLMK_REQUIRE_GPU();
  for (DType dt : {DType::bf16, DType::f32})
    for (int64_t d : {int64_t{16} / dtype_size(dt) * 129, int64_t{129}}) {
      const int64_t rows = 5000;  // split rows in both the vector and the N = 1 kernels
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " d " << d);
      const GeluApproximation a = GeluApproximation::tanh;
      HostTensor x(dt, rows, d), dy(dt, rows, d), b(dt, 1, d), dx(dt, rows, d), db(dt, 1, d);
      x.randomize(0.0f, 2.0f);
      dy.randomize();
      b.randomize();
      db.poison();
      DeviceTensor gx(x), gdy(dy), gb(b), gdx(dx), gdb(db);
      DeviceWorkspace ws(rows, d);
      auto call = [&](cudaStream_t stream) {
        bias_gelu_backward(gdx.view(), gdb.view(true), gdy.view(), gx.view(), gb.view(true), a, ws.view(), stream);
      };
      call(nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor first = gdb.download();
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(cudaMemset(gdb.data, 0xff, gdb.size), cudaSuccess);
        call(nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        expect_equal_elements(gdb.download(), first, "dbias of a repeated call");
      }
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      call(stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaMemset(ws.data, 0xff, ws.n * 4), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(cudaMemset(gdb.data, 0xff, gdb.size), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        expect_equal_elements(gdb.download(), first, "dbias of a graph replay");
      }
      dy.randomize();
      ASSERT_EQ(cudaMemcpy(gdy.data, dy.bytes.data(), gdy.size, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      HostTensor ref_dx(dt, rows, d), ref_db(dt, 1, d);
      bias_gelu_backward(ref_dx.view(), ref_db.view(true), dy.view(), x.view(), b.view(true), a);
      const float dy_max = abs_max(dy), rtol = dtype_rtol(dt);
      expect_close(gdx.download(), ref_dx, rtol, "dx of a replay with new dy", rtol * 1e-2f * dy_max);
      expect_close(gdb.download(), ref_db, rtol, "dbias of a replay with new dy", 2e-6f * rows * 1.13f * dy_max);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
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
