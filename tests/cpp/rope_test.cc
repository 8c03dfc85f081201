// RoPE (rope_, rope_backward_): the CPU reference against hand-computed rotations, an
// independent cos/sin cache and Llama 3.1 frequencies, and its own inverse; the CUDA kernel
// against the CPU reference over dtypes, styles, angle sources, partial rotary, GQA, fused
// qkv slices, 4-d and transposed layouts and unaligned heads (every element outside the
// rotated part must come back bit-identical); out-of-range positions; bad inputs.
#include "test_util.h"

namespace llmk::test {
namespace {

const RopeStyle kStyles[] = {RopeStyle::neox, RopeStyle::gptj};
const char* style_name(RopeStyle s) { return s == RopeStyle::neox ? "neox" : "gptj"; }

// Host memory for an index tensor, with a device copy on demand.
struct Positions {
  DType dtype = DType::i64;
  std::vector<int64_t> values;
  std::vector<unsigned char> bytes;
  void* device = nullptr;

  Positions(std::vector<int64_t> v, DType dt) : dtype(dt), values(std::move(v)) {
    bytes.resize(values.size() * dtype_size(dt) + 1);
    for (size_t i = 0; i < values.size(); ++i) {
      if (dt == DType::i64) std::memcpy(bytes.data() + 8 * i, &values[i], 8);
      else {
        const int32_t x = static_cast<int32_t>(values[i]);
        std::memcpy(bytes.data() + 4 * i, &x, 4);
      }
    }
  }
  ~Positions() { cudaFree(device); }
  // [n] or, with `shape2`, [shape2[0], shape2[1]].
  TensorView view(bool on_gpu, std::vector<int64_t> shape = {}) {
    if (on_gpu && !device) {
      EXPECT_EQ(cudaMalloc(&device, bytes.size()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    std::vector<int64_t> strides(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    const Device dev{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0};
    return TensorView(on_gpu ? device : bytes.data(), dtype, dev, static_cast<int>(shape.size()),
                      shape.data(), strides.data());
  }
};

std::vector<int64_t> random_positions(int64_t n, int64_t max_pos) {
  std::uniform_int_distribution<int64_t> dist(0, max_pos - 1);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

// A strided view into `data`: `offset` elements in, the given shape and strides.
TensorView strided(void* data, DType dt, bool on_gpu, int64_t offset, std::vector<int64_t> shape,
                   std::vector<int64_t> strides) {
  const Device dev{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0};
  return TensorView(static_cast<unsigned char*>(data) + offset * dtype_size(dt), dt, dev,
                    static_cast<int>(shape.size()), shape.data(), strides.data());
}

// cos/sin cache [max_pos, rot_dim] in double, rounded to float, from inv_freq.
HostTensor make_cache(int64_t max_pos, int64_t rot_dim, const std::vector<double>& inv_freq) {
  HostTensor cache(DType::f32, max_pos, rot_dim);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
      cache.set(p, i, static_cast<float>(std::cos(p * inv_freq[i])));
      cache.set(p, rot_dim / 2 + i, static_cast<float>(std::sin(p * inv_freq[i])));
    }
  return cache;
}

std::vector<double> theta_inv_freq(int64_t rot_dim, double theta) {
  std::vector<double> f(rot_dim / 2);
  for (int64_t i = 0; i < rot_dim / 2; ++i) f[i] = std::pow(theta, -2.0 * i / rot_dim);
  return f;
}

TEST(RopeCpu, MatchesHandComputedRotation) {
  // One head of 4: inv_freq = (1, 0.01) at theta 1e4; position 2.
  for (RopeStyle style : kStyles) {
    HostTensor q(DType::f32, 1, 4);
    const float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    for (int c = 0; c < 4; ++c) q.set(0, c, x[c]);
    Positions pos({2}, DType::i32);
    rope_(strided(q.bytes.data(), DType::f32, false, 0, {1, 1, 4}, {4, 4, 1}), std::nullopt,
         pos.view(false), RopeTheta{}, style);
    // NeoX pairs (x0, x2) at angle 2 and (x1, x3) at 0.02; GPT-J (x0, x1) and (x2, x3).
    const int a1 = 0, b1 = style == RopeStyle::neox ? 2 : 1;
    const int a2 = style == RopeStyle::neox ? 1 : 2, b2 = 3;
    const double c1 = std::cos(2.0), s1 = std::sin(2.0), c2 = std::cos(0.02), s2 = std::sin(0.02);
    EXPECT_NEAR(q.get(0, a1), x[a1] * c1 - x[b1] * s1, 1e-6) << style_name(style);
    EXPECT_NEAR(q.get(0, b1), x[b1] * c1 + x[a1] * s1, 1e-6) << style_name(style);
    EXPECT_NEAR(q.get(0, a2), x[a2] * c2 - x[b2] * s2, 1e-6) << style_name(style);
    EXPECT_NEAR(q.get(0, b2), x[b2] * c2 + x[a2] * s2, 1e-6) << style_name(style);
  }
}

// Runs rope on a [tokens, heads, dim] f32 host tensor with the given angle source.
HostTensor rotated(const HostTensor& x, int64_t heads, const std::vector<int64_t>& positions,
                   const RopeTheta* theta, HostTensor* cache, RopeStyle style, bool backward = false) {
  HostTensor out = x;
  const int64_t dim = x.d / heads;
  const TensorView q = strided(out.bytes.data(), x.dtype, false, 0, {x.rows, heads, dim},
                               {x.row_stride, dim, 1});
  Positions pos(positions, DType::i64);
  if (cache && backward) rope_backward_(q, std::nullopt, pos.view(false), cache->view(), style);
  else if (cache) rope_(q, std::nullopt, pos.view(false), cache->view(), style);
  else if (backward) rope_backward_(q, std::nullopt, pos.view(false), *theta, style);
  else rope_(q, std::nullopt, pos.view(false), *theta, style);
  return out;
}

TEST(RopeCpu, ThetaMatchesIndependentCacheAndLlama3) {
  const int64_t tokens = 5, heads = 3, dim = 64, rot = 48, max_pos = 9000;
  HostTensor x(DType::f32, tokens, heads * dim);
  x.randomize();
  const std::vector<int64_t> positions = {0, 1, 77, 4096, 8999};
  Llama3RopeScaling ll;
  ll.factor = 8;
  ll.low_freq_factor = 1;
  ll.high_freq_factor = 4;
  ll.original_max_position = 2048;
  for (bool llama3 : {false, true}) {
    // Hugging Face's _compute_llama3_parameters, written out independently.
    std::vector<double> inv = theta_inv_freq(rot, 500000.0);
    if (llama3)
      for (double& f : inv) {
        const double wavelen = 2 * M_PI / f, low = 2048 / 1.0, high = 2048 / 4.0;
        if (wavelen > low) f /= 8;
        else if (wavelen >= high) {
          const double smooth = (2048 / wavelen - 1) / (4 - 1);
          f = (1 - smooth) * f / 8 + smooth * f;
        }
      }
    RopeTheta theta{rot, 500000.0, llama3 ? std::optional(ll) : std::nullopt};
    HostTensor cache = make_cache(max_pos, rot, inv);
    for (RopeStyle style : kStyles) {
      SCOPED_TRACE(testing::Message() << style_name(style) << " llama3 " << llama3);
      // The cache is rounded to float: |error| <= |x| * 2^-24 per term.
      expect_close(rotated(x, heads, positions, &theta, nullptr, style),
                   rotated(x, heads, positions, nullptr, &cache, style), 0, "theta vs cache", 1e-6f);
    }
  }
  // The scaling changes the low frequencies only: the first pair keeps inv_freq 1.
  const RopeTheta unscaled{rot, 5e5, std::nullopt}, llama3{rot, 5e5, ll};
  const HostTensor plain = rotated(x, heads, positions, &unscaled, nullptr, RopeStyle::neox);
  const HostTensor scaled = rotated(x, heads, positions, &llama3, nullptr, RopeStyle::neox);
  EXPECT_EQ(plain.get(3, 0), scaled.get(3, 0));
  EXPECT_NE(plain.get(3, rot / 2 - 1), scaled.get(3, rot / 2 - 1));
}

TEST(RopeCpu, BackwardInvertsForwardAndTailIsUntouched) {
  const int64_t tokens = 7, heads = 2, dim = 10, rot = 6;
  HostTensor x(DType::f32, tokens, heads * dim, heads * dim + 3);
  x.randomize();
  const std::vector<int64_t> positions = random_positions(tokens, 100000);
  for (RopeStyle style : kStyles) {
    const RopeTheta theta{rot, 10000.0, std::nullopt};
    const HostTensor y = rotated(x, heads, positions, &theta, nullptr, style);
    const HostTensor back = rotated(y, heads, positions, &theta, nullptr, style, true);
    expect_close(back, x, 0, "rope_backward_(rope_(x))", 1e-5f);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < heads * dim; ++c)
        if (c % dim >= rot) ASSERT_EQ(y.get(t, c), x.get(t, c)) << "tail changed at " << t << ", " << c;
  }
}

// The GPU kernel against the CPU reference on one layout. `buffer` holds q (and k) at
// the given offsets/strides; everything in it but the rotated elements must come back
// bit-identical.
struct GpuCase {
  DType dt;
  RopeStyle style;
  bool use_cache;
  int64_t batch, seq, heads_q, heads_k, dim, rot;
  bool four_d, transposed, fused_qkv, broadcast_positions;
  int64_t pad;  // extra elements per token row (unaligned strides when odd)
};

void run_gpu_case(const GpuCase& k, bool backward) {
  SCOPED_TRACE(testing::Message() << dtype_name(k.dt) << " " << style_name(k.style)
               << (k.use_cache ? " cache" : " theta") << " batch " << k.batch << " seq " << k.seq
               << " heads " << k.heads_q << "/" << k.heads_k << " dim " << k.dim << " rot " << k.rot
               << (k.four_d ? " 4d" : "") << (k.transposed ? " transposed" : "")
               << (k.fused_qkv ? " qkv" : "") << " pad " << k.pad << (backward ? " backward" : ""));
  const int64_t tokens = k.batch * k.seq, hk = k.heads_k, D = k.dim;
  // Buffer rows are tokens (or batch*heads*seq rows of D for the transposed layout).
  const int64_t width = (k.heads_q + (k.fused_qkv ? 2 * hk : 0)) * D;
  HostTensor buf(k.dt, tokens, width, width + k.pad);
  HostTensor kbuf(k.dt, tokens, hk * D, hk * D + k.pad);
  buf.randomize();
  kbuf.randomize();
  const int64_t max_pos = 5000;
  std::vector<int64_t> pos_values = random_positions(k.broadcast_positions ? k.seq : tokens, max_pos);
  Positions pos(pos_values, k.dt == DType::f16 ? DType::i32 : DType::i64);
  const HostTensor cache = make_cache(max_pos, k.rot, theta_inv_freq(k.rot, 10000.0));
  const RopeTheta theta{k.rot, 10000.0, std::nullopt};

  // Views of q and k over host or device memory.
  auto views = [&](void* qb, void* kb, bool gpu, TensorView* q, TensorView* kv) {
    const int64_t rs = buf.row_stride, krs = kbuf.row_stride;
    if (k.transposed) {
      // Memory [batch, heads, seq, D] (rows of D), viewed as [batch, seq, heads, D].
      *q = strided(qb, k.dt, gpu, 0, {k.batch, k.seq, k.heads_q, D},
                   {k.heads_q * k.seq * D, D, k.seq * D, 1});
      *kv = strided(kb, k.dt, gpu, 0, {k.batch, k.seq, hk, D}, {hk * k.seq * D, D, k.seq * D, 1});
      return;
    }
    void* kbase = k.fused_qkv ? qb : kb;
    const int64_t koff = k.fused_qkv ? k.heads_q * D : 0, kstride = k.fused_qkv ? rs : krs;
    if (k.four_d) {
      *q = strided(qb, k.dt, gpu, 0, {k.batch, k.seq, k.heads_q, D}, {k.seq * rs, rs, D, 1});
      *kv = strided(kbase, k.dt, gpu, koff, {k.batch, k.seq, hk, D}, {k.seq * kstride, kstride, D, 1});
    } else {
      *q = strided(qb, k.dt, gpu, 0, {tokens, k.heads_q, D}, {rs, D, 1});
      *kv = strided(kbase, k.dt, gpu, koff, {tokens, hk, D}, {kstride, D, 1});
    }
  };
  std::vector<int64_t> pshape;
  if (k.four_d || k.transposed) pshape = k.broadcast_positions ? std::vector<int64_t>{1, k.seq}
                                                               : std::vector<int64_t>{k.batch, k.seq};
  auto call = [&](const TensorView& q, const TensorView& kv, const TensorView& p, const TensorView& c) {
    if (k.use_cache && backward) rope_backward_(q, kv, p, c, k.style);
    else if (k.use_cache) rope_(q, kv, p, c, k.style);
    else if (backward) rope_backward_(q, kv, p, theta, k.style);
    else rope_(q, kv, p, theta, k.style);
  };
  // The transposed layout keeps rows of D per (batch, head, seq): reuse buf as that memory.
  ASSERT_TRUE(!k.transposed || (k.pad == 0 && !k.fused_qkv));

  HostTensor ref = buf, kref = kbuf, cache_h = cache;
  TensorView q, kv;
  views(ref.bytes.data(), kref.bytes.data(), false, &q, &kv);
  call(q, kv, pos.view(false, pshape), cache_h.view());

  DeviceTensor gbuf(buf), gk(kbuf), gcache(cache);
  views(gbuf.data, gk.data, true, &q, &kv);
  call(q, kv, pos.view(true, pshape), gcache.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = gbuf.download(), kgot = gk.download();

  // Rotated elements within one rounding (rtol) plus the fp32 math's absolute error on
  // terms of the inputs' size (atol); all other bytes identical.
  const float rtol = dtype_rtol(k.dt);
  auto compare = [&](const HostTensor& g, const HostTensor& w, const HostTensor& in, int64_t rotated_width) {
    float max_in = 0;
    for (int64_t r = 0; r < in.rows; ++r)
      for (int64_t c = 0; c < in.d; ++c) max_in = std::max(max_in, std::fabs(in.get(r, c)));
    const float atol = 1e-5f * (1.0f + max_in);
    int64_t bad = 0;
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < w.row_stride && r * w.row_stride + c < static_cast<int64_t>(w.bytes.size() / dtype_size(k.dt)); ++c) {
        const bool rotated = c < rotated_width && c % D < k.rot;
        const float gv = g.get(r, c), wv = w.get(r, c);
        const bool ok = rotated ? std::fabs(gv - wv) <= atol + rtol * std::fabs(wv)
                                : std::memcmp(&g.bytes[(r * w.row_stride + c) * dtype_size(k.dt)],
                                              &w.bytes[(r * w.row_stride + c) * dtype_size(k.dt)],
                                              dtype_size(k.dt)) == 0;
        if (!ok && bad++ < 5)
          ADD_FAILURE() << "row " << r << " col " << c << (rotated ? " (rotated)" : " (untouched)")
                        << ": got " << gv << ", want " << wv;
      }
    EXPECT_EQ(bad, 0);
  };
  compare(got, ref, buf, k.fused_qkv ? (k.heads_q + hk) * D : width);
  if (!k.fused_qkv) compare(kgot, kref, kbuf, hk * D);
}

TEST(RopeGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for (DType dt : all_dtypes())
    for (RopeStyle style : kStyles)
      for (bool use_cache : {true, false}) {
        // Llama-like fused qkv with GQA; rows padded so the vector path is off when pad is odd.
        run_gpu_case({dt, style, use_cache, 1, 37, 8, 2, 128, 128, false, false, true, false, 0}, false);
        run_gpu_case({dt, style, use_cache, 1, 21, 5, 3, 64, 32, false, false, true, false, 3}, false);
        // Separate q/k, 4-d with per-batch and shared positions, partial rotary.
        run_gpu_case({dt, style, use_cache, 3, 11, 4, 1, 80, 64, true, false, false, false, 8}, false);
        run_gpu_case({dt, style, use_cache, 2, 9, 3, 3, 96, 96, true, false, true, true, 0}, true);
        // [batch, heads, seq, dim] memory seen through its transpose; odd head_dim.
        run_gpu_case({dt, style, use_cache, 2, 13, 3, 2, 64, 64, false, true, false, false, 0}, false);
        run_gpu_case({dt, style, use_cache, 1, 5, 2, 1, 7, 6, false, false, false, false, 1}, true);
      }
}

TEST(RopeGpu, LongSequencesAndManyTokens) {
  LLMK_REQUIRE_GPU();
  // More tokens than a 1-d grid of 65535 blocks would cover one per block, and rot_dim 256.
  run_gpu_case({DType::bf16, RopeStyle::neox, false, 1, 70001, 1, 1, 16, 16, false, false, true, false, 0}, false);
  run_gpu_case({DType::f32, RopeStyle::gptj, true, 1, 3, 2, 2, 256, 256, false, false, true, false, 0}, false);
}

// Theta mode keeps fp32 accuracy at large positions (the angle is reduced in double).
TEST(RopeGpu, LargePositionsStayAccurate) {
  LLMK_REQUIRE_GPU();
  const int64_t tokens = 4, dim = 128;
  HostTensor x(DType::f32, tokens, dim);
  x.randomize();
  Positions pos({131071, 1000000, 1 << 24, 123456789}, DType::i64);
  const RopeTheta theta{dim, 500000.0, std::nullopt};
  HostTensor ref = x;
  rope_(strided(ref.bytes.data(), DType::f32, false, 0, {tokens, 1, dim}, {dim, dim, 1}), std::nullopt,
       pos.view(false), theta, RopeStyle::neox);
  DeviceTensor g(x);
  rope_(strided(g.data, DType::f32, true, 0, {tokens, 1, dim}, {dim, dim, 1}), std::nullopt,
       pos.view(true), theta, RopeStyle::neox);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(g.download(), ref, 0, "large positions", 2e-5f);
}

TEST(RopeGpu, OutOfRangePositionsGiveNaN) {
  LLMK_REQUIRE_GPU();
  const int64_t tokens = 4, heads = 2, dim = 8, max_pos = 16;
  HostTensor x(DType::bf16, tokens, heads * dim), cache = make_cache(max_pos, dim, theta_inv_freq(dim, 1e4));
  x.randomize();
  Positions pos({3, 16, -1, 15}, DType::i32);
  DeviceTensor g(x), gc(cache);
  rope_(strided(g.data, DType::bf16, true, 0, {tokens, heads, dim}, {heads * dim, dim, 1}), std::nullopt,
       pos.view(true), gc.view(), RopeStyle::neox);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = g.download();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < heads * dim; ++c)
      EXPECT_EQ(std::isnan(got.get(t, c)), t == 1 || t == 2) << "token " << t << " col " << c;
}

class RopeBadInput : public testing::Test {
 protected:
  // q [4, 2, 8] and k [4, 1, 8] in one fused buffer; theta over rot_dim 8.
  HostTensor buf{DType::bf16, 4, 32};
  HostTensor cache = make_cache(16, 8, theta_inv_freq(8, 1e4));
  Positions pos{{0, 1, 2, 3}, DType::i64};
  TensorView q() { return strided(buf.bytes.data(), DType::bf16, false, 0, {4, 2, 8}, {32, 8, 1}); }
  TensorView k() { return strided(buf.bytes.data(), DType::bf16, false, 16, {4, 1, 8}, {32, 8, 1}); }
  void SetUp() override { buf.randomize(); }
  void expect_untouched(const HostTensor& before) { expect_equal_elements(buf, before, "buffer after a rejected call"); }
};

TEST_F(RopeBadInput, ShapesDtypesAndFrequencies) {
  const HostTensor before = buf;
  const RopeTheta ok{8, 1e4, std::nullopt};
  expect_error([&] { rope_(q(), k(), pos.view(false), RopeTheta{5, 1e4, std::nullopt}, RopeStyle::gptj); },
               "rot_dim must be even");
  expect_error([&] { rope_(q(), k(), pos.view(false), RopeTheta{10, 1e4, std::nullopt}, RopeStyle::neox); },
               "rot_dim must be even, in [2, min(head_dim = 8");
  expect_error([&] { rope_(q(), k(), pos.view(false), RopeTheta{8, -1.0, std::nullopt}, RopeStyle::neox); },
               "theta must be finite and > 0");
  Llama3RopeScaling bad;
  bad.high_freq_factor = 0.5;
  expect_error([&] { rope_(q(), k(), pos.view(false), RopeTheta{8, 1e4, bad}, RopeStyle::neox); },
               "llama3 scaling needs");
  Positions short_pos({0, 1, 2}, DType::i64);
  expect_error([&] { rope_(q(), k(), short_pos.view(false), ok, RopeStyle::neox); },
               "rope_: positions must have q's leading dims ([tokens] = [4]), got [3]");
  const TensorView q4 = strided(buf.bytes.data(), DType::bf16, false, 0, {2, 2, 2, 8}, {64, 32, 8, 1});
  expect_error([&] { rope_(q4, std::nullopt, short_pos.view(false), ok, RopeStyle::neox); },
               "rope_: positions must have q's leading dims ([batch, seq] = [2, 2] or [seq] = [2]), got [3]");
  HostTensor fpos(DType::f32, 1, 4);
  expect_error([&] { rope_(q(), k(), fpos.view(true), ok, RopeStyle::neox); }, "positions must be int32 or int64");
  const TensorView k_dim = strided(buf.bytes.data(), DType::bf16, false, 16, {4, 1, 6}, {32, 8, 1});
  expect_error([&] { rope_(q(), k_dim, pos.view(false), ok, RopeStyle::neox); },
               "rope_: k must have q's leading (token) dims and head_dim 8, got k [4, 1, 6] and q [4, 2, 8]");
  expect_error([&] { rope_backward_(q(), k_dim, pos.view(false), ok, RopeStyle::neox); },
               "rope_backward_: dk must have dq's leading (token) dims and head_dim 8, got dk [4, 1, 6] and dq [4, 2, 8]");
  HostTensor kf(DType::f32, 4, 8);
  const TensorView k_f32 = strided(kf.bytes.data(), DType::f32, false, 0, {4, 1, 8}, {8, 8, 1});
  expect_error([&] { rope_(q(), k_f32, pos.view(false), ok, RopeStyle::neox); }, "k has dtype float32, expected bfloat16");
  expect_error([&] { rope_(buf.view(), k(), pos.view(false), ok, RopeStyle::neox); },
               "rope_: q must be [tokens, heads, head_dim] or [batch, seq, heads, head_dim], got [4, 32]");
  HostTensor cache16(DType::f16, 16, 8);
  expect_error([&] { rope_(q(), k(), pos.view(false), cache16.view(), RopeStyle::neox); },
               "cos_sin_cache has dtype float16, expected float32");
  HostTensor cache_wide(DType::f32, 16, 12);
  expect_error([&] { rope_(q(), k(), pos.view(false), cache_wide.view(), RopeStyle::neox); },
               "rot_dim must be even, in [2, min(head_dim = 8");
  expect_error([&] { rope_(q(), k(), pos.view(false), cache.view(true), RopeStyle::neox); },
               "rope_: cos_sin_cache must be [max_pos, rot_dim] with rot_dim > 0, got [8]");
  // Position 16 lies past the cache's 16 rows: the CPU backend rejects the call.
  Positions far({0, 1, 16, 3}, DType::i32);
  expect_error([&] { rope_(q(), k(), far.view(false), cache.view(), RopeStyle::neox); },
               "position 16 (index 2) is outside the cos_sin_cache's 16 rows");
  expect_untouched(before);
}

TEST_F(RopeBadInput, OverlapAndDevices) {
  const HostTensor before = buf;
  const RopeTheta ok{8, 1e4, std::nullopt};
  expect_error([&] { rope_(q(), q(), pos.view(false), ok, RopeStyle::neox); }, "q and k overlap");
  const TensorView k_overlapping = strided(buf.bytes.data(), DType::bf16, false, 12, {4, 1, 8}, {32, 8, 1});
  expect_error([&] { rope_(q(), k_overlapping, pos.view(false), ok, RopeStyle::neox); }, "q and k overlap");
  const TensorView heads_overlap = strided(buf.bytes.data(), DType::bf16, false, 0, {4, 2, 8}, {32, 4, 1});
  expect_error([&] { rope_(heads_overlap, std::nullopt, pos.view(false), ok, RopeStyle::neox); }, "share memory");
  if (has_gpu()) {
    DeviceTensor gbuf(buf);
    const TensorView gq = strided(gbuf.data, DType::bf16, true, 0, {4, 2, 8}, {32, 8, 1});
    expect_error([&] { rope_(gq, std::nullopt, pos.view(false), ok, RopeStyle::neox); },
                 "positions is on cpu:0 but q is on cuda:0");
    expect_error([&] { rope_(q(), std::nullopt, pos.view(true), ok, RopeStyle::neox); },
                 "positions is on cuda:0 but q is on cpu:0");
    HostTensor after = gbuf.download();
    expect_equal_elements(after, before, "device buffer after a rejected call");
  }
  expect_untouched(before);
}

}  // namespace
}  // namespace llmk::test
