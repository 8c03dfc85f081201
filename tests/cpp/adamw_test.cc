// Fused AdamW (adamw_step_): the CPU reference against a hand-computed step and an
// independent double-precision loop over many steps; the CUDA kernel against the CPU
// reference over parameter dtypes, sizes (empty, odd, chunk edges, more tensors than one
// launch holds), unaligned tensors, per-tensor step counts, a device lr and CUDA-graph
// replay; bad inputs.
#include <memory>

#include "test_util.h"

namespace llmk::test {
namespace {

// A parameter with its gradient, moments and step count, on the host.
struct HostParam {
  HostTensor param, grad, m, v, step;
  HostParam(DType dt, int64_t n, float t, int64_t offset = 0)
      : param(dt, 1, n + offset), grad(dt, 1, n + offset), m(DType::f32, 1, n + offset),
        v(DType::f32, 1, n + offset), step(DType::f32, 1, 1), offset_(offset), n_(n) {
    param.randomize();
    grad.randomize(0.0f, 0.1f);
    m.randomize(0.0f, 0.01f);
    v.randomize(0.0f, 1e-3f);
    for (int64_t c = 0; c < n + offset; ++c) v.set(0, c, std::fabs(v.get(0, c)));  // v >= 0
    step.set(0, 0, t);
  }
  // Views of the n elements after `offset` (offset 1: not 16-byte aligned).
  static TensorView slice(const HostTensor& h, void* base, bool gpu, int64_t offset, int64_t n) {
    const int64_t shape[1] = {n}, strides[1] = {1};
    return TensorView(static_cast<unsigned char*>(base) + offset * dtype_size(h.dtype), h.dtype,
                      Device{gpu ? DeviceType::cuda : DeviceType::cpu, 0}, 1, shape, strides);
  }
  AdamWParam host_view() {
    return {slice(param, param.bytes.data(), false, offset_, n_), slice(grad, grad.bytes.data(), false, offset_, n_),
            slice(m, m.bytes.data(), false, offset_, n_), slice(v, v.bytes.data(), false, offset_, n_),
            slice(step, step.bytes.data(), false, 0, 1)};
  }
  int64_t offset_, n_;
};

struct DeviceParam {
  DeviceTensor param, grad, m, v, step;
  explicit DeviceParam(const HostParam& h) : param(h.param), grad(h.grad), m(h.m), v(h.v), step(h.step) {}
  AdamWParam view(const HostParam& h) const {
    return {HostParam::slice(h.param, param.data, true, h.offset_, h.n_),
            HostParam::slice(h.grad, grad.data, true, h.offset_, h.n_),
            HostParam::slice(h.m, m.data, true, h.offset_, h.n_), HostParam::slice(h.v, v.data, true, h.offset_, h.n_),
            HostParam::slice(h.step, step.data, true, 0, 1)};
  }
};

TEST(AdamWCpu, MatchesHandComputedStep) {
  HostParam a(DType::f32, 1, 1.0f);
  a.param.set(0, 0, 1.0f);
  a.grad.set(0, 0, 0.5f);
  a.m.set(0, 0, 0.0f);
  a.v.set(0, 0, 0.0f);
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  adamw_step_({a.host_view()}, o);
  // m = 0.05, v = 2.5e-4; step size lr / 0.1 = 1, denom sqrt(v) / sqrt(1e-3) + eps = 0.5 + 1e-8.
  EXPECT_NEAR(a.m.get(0, 0), 0.05, 1e-9);
  EXPECT_NEAR(a.v.get(0, 0), 2.5e-4, 1e-10);
  EXPECT_NEAR(a.param.get(0, 0), 1.0 * (1 - 0.001) - 0.05 / (0.5 + 1e-8), 1e-7);
  o.maximize = true;  // gradient ascent: the same step with g = -0.5
  HostParam b(DType::f32, 1, 1.0f);
  b.param.set(0, 0, 1.0f);
  b.grad.set(0, 0, 0.5f);
  b.m.set(0, 0, 0.0f);
  b.v.set(0, 0, 0.0f);
  adamw_step_({b.host_view()}, o);
  EXPECT_NEAR(b.param.get(0, 0), 1.0 * (1 - 0.001) + 0.05 / (0.5 + 1e-8), 1e-7);
}

// 50 steps of the CPU backend against the update rule written out in double here.
TEST(AdamWCpu, ManyStepsMatchIndependentLoop) {
  const int64_t n = 37;
  HostParam a(DType::f32, n, 0.0f);
  std::vector<double> p(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) p[i] = a.param.get(0, i), m[i] = a.m.get(0, i), v[i] = a.v.get(0, i);
  AdamWOptions o;
  o.lr = 3e-3;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  for (int t = 1; t <= 50; ++t) {
    a.grad.randomize();
    a.step.set(0, 0, static_cast<float>(t));
    adamw_step_({a.host_view()}, o);
    for (int64_t i = 0; i < n; ++i) {
      const double g = a.grad.get(0, i);
      m[i] = 0.8 * m[i] + 0.2 * g;
      v[i] = 0.99 * v[i] + 0.01 * g * g;
      p[i] = p[i] * (1 - 3e-4) - 3e-3 / (1 - std::pow(0.8, t)) * m[i] / (std::sqrt(v[i] / (1 - std::pow(0.99, t))) + 1e-6);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(a.param.get(0, i), p[i], 1e-6 * (1 + std::fabs(p[i]))) << i;
    EXPECT_NEAR(a.m.get(0, i), m[i], 1e-6 * (1 + std::fabs(m[i]))) << i;
    EXPECT_NEAR(a.v.get(0, i), v[i], 1e-6 * v[i] + 1e-12) << i;
  }
}

// The moments and the f32 parameters carry fp32-math error; f16/bf16 parameters one rounding.
void expect_params_close(HostParam& got, HostParam& want, const char* what) {
  SCOPED_TRACE(what);
  const float rtol = want.param.dtype == DType::f32 ? 2e-6f : dtype_rtol(want.param.dtype);
  // atol: fp32 error of an update of size ~lr (f32), a rounding near zero (f16/bf16).
  expect_close(got.param, want.param, rtol, "param", want.param.dtype == DType::f32 ? 1e-7f : rtol * 1e-3f);
  expect_close(got.m, want.m, 2e-6f, "exp_avg", 1e-8f);
  expect_close(got.v, want.v, 2e-6f, "exp_avg_sq", 1e-12f);
}

HostParam download(const DeviceParam& d, const HostParam& h) {
  HostParam out = h;
  out.param = d.param.download();
  out.grad = d.grad.download();
  out.m = d.m.download();
  out.v = d.v.download();
  return out;
}

TEST(AdamWGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  // 900 tensors, 300 per dtype: more than one launch holds (256); empty, odd,
  // chunk edges, unaligned.
  std::vector<HostParam> host;
  const int64_t sizes[] = {0, 1, 3, 4, 1000, 4095, 4096, 4097, 9001, 20011};
  for (int i = 0; i < 900; ++i) {
    const DType dt = all_dtypes()[i % 3];
    host.emplace_back(dt, sizes[i % 10], static_cast<float>(1 + (i * 37) % 1000), i % 7 == 3 ? 1 : 0);
  }
  for (const bool device_lr : {false, true}) {
    SCOPED_TRACE(device_lr ? "device lr" : "host lr");
    std::vector<std::unique_ptr<DeviceParam>> dev;
    std::vector<AdamWParam> dviews, hviews;
    std::vector<HostParam> ref = host;
    for (size_t i = 0; i < host.size(); ++i) {
      dev.push_back(std::make_unique<DeviceParam>(host[i]));
      dviews.push_back(dev.back()->view(host[i]));
      hviews.push_back(ref[i].host_view());
    }
    AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.05;
    HostTensor lr(DType::f32, 1, 1);
    lr.set(0, 0, 2e-2f);
    DeviceTensor glr(lr);
    AdamWOptions gpu_options = o;
    if (device_lr) {
      o.lr = 2e-2;               // the CPU reference gets the device value from options,
      gpu_options.lr = 1e3;      // the GPU must ignore this one
    }
    adamw_step_(hviews, o);
    std::optional<TensorView> lr_view;
    if (device_lr) lr_view = HostParam::slice(lr, glr.data, true, 0, 1);
    adamw_step_(dviews, gpu_options, lr_view);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < host.size(); ++i) {
      HostParam got = download(*dev[i], host[i]);
      expect_params_close(got, ref[i], dtype_name(host[i].param.dtype));
    }
  }
}

// The step count and lr live in device memory: a captured graph replays with new values.
TEST(AdamWGpu, GraphReplayReadsStepAndLrFromDevice) {
  LLMK_REQUIRE_GPU();
  HostParam h(DType::bf16, 5000, 1.0f);
  DeviceParam d(h);
  HostTensor lr(DType::f32, 1, 1);
  lr.set(0, 0, 1e-3f);
  DeviceTensor glr(lr);
  const TensorView lr_view = HostParam::slice(lr, glr.data, true, 0, 1);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  adamw_step_({d.view(h)}, AdamWOptions{}, lr_view, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  HostParam ref = h;
  AdamWOptions o;
  for (int t = 1; t <= 3; ++t) {
    const float step = static_cast<float>(t), new_lr = 1e-3f * t;
    ASSERT_EQ(cudaMemcpy(d.step.data, &step, 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(glr.data, &new_lr, 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ref.step.set(0, 0, step);
    o.lr = new_lr;
    adamw_step_({ref.host_view()}, o);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  HostParam got = download(d, h);
  expect_params_close(got, ref, "graph replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

class AdamWBadInput : public testing::Test {
 protected:
  HostParam a{DType::bf16, 64, 1.0f};
  HostParam b{DType::f32, 64, 1.0f};
  void expect_rejected(std::vector<AdamWParam> list, const std::string& needle,
                       const AdamWOptions& o = AdamWOptions{},
                       const std::optional<TensorView>& lr = std::nullopt) {
    const HostParam a0 = a, b0 = b;
    expect_error([&] { adamw_step_(list, o, lr); }, needle);
    for (auto [got, want] : {std::pair{&a, &a0}, {&b, &b0}}) {
      expect_equal_elements(got->param, want->param, "param after a rejected call");
      expect_equal_elements(got->m, want->m, "exp_avg after a rejected call");
      expect_equal_elements(got->v, want->v, "exp_avg_sq after a rejected call");
    }
  }
};

TEST_F(AdamWBadInput, TensorsAndOptions) {
  AdamWParam bad = a.host_view();
  bad.grad = b.host_view().grad;
  expect_rejected({b.host_view(), bad}, "adamw_step_: params[1].grad has dtype float32, expected bfloat16");
  bad = a.host_view();
  bad.exp_avg = a.host_view().param;
  expect_rejected({bad}, "params[0].exp_avg has dtype bfloat16, expected float32");
  bad = b.host_view();
  bad.grad = HostParam::slice(b.grad, b.grad.bytes.data(), false, 0, 63);
  expect_rejected({bad}, "params[0].grad has shape [63] but params[0].param has shape [64]");
  bad = b.host_view();
  const int64_t shape[1] = {32}, strides[1] = {2};
  bad.param = TensorView(b.param.bytes.data(), DType::f32, Device{}, 1, shape, strides);
  bad.grad = TensorView(b.grad.bytes.data(), DType::f32, Device{}, 1, shape, strides);
  bad.exp_avg = TensorView(b.m.bytes.data(), DType::f32, Device{}, 1, shape, strides);
  bad.exp_avg_sq = TensorView(b.v.bytes.data(), DType::f32, Device{}, 1, shape, strides);
  expect_rejected({bad}, "adamw_step_: params[0].param must be contiguous, got shape [32] with strides [2]");
  bad = b.host_view();
  bad.exp_avg_sq = bad.exp_avg;
  expect_rejected({bad}, "params[0].exp_avg and params[0].exp_avg_sq are the same tensor");
  bad = b.host_view();
  bad.step = HostParam::slice(b.m, b.m.bytes.data(), false, 0, 2);
  expect_rejected({bad}, "params[0].step must hold one element, got 2");
  b.step.set(0, 0, 0.0f);
  expect_rejected({a.host_view(), b.host_view()}, "params[1].step must be >= 1, got 0");
  b.step.set(0, 0, 1.0f);
  AdamWOptions o;
  o.beta2 = 1.0;
  expect_rejected({a.host_view()}, "betas must be in [0, 1)", o);
  o = AdamWOptions{};
  o.lr = -1;
  expect_rejected({a.host_view()}, "lr must be finite and >= 0", o);
  o = AdamWOptions{};
  expect_rejected({a.host_view()}, "lr_tensor has dtype bfloat16, expected float32", o, a.host_view().param);
  if (has_gpu()) {
    DeviceParam d(b);
    AdamWParam mixed = d.view(b);
    mixed.step = b.host_view().step;
    expect_rejected({mixed}, "adamw_step_: params[0].step is on cpu:0 but params[0].param is on cuda:0");
  }
}

}  // namespace
}  // namespace llmk::test
