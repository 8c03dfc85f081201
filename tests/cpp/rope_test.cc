// RoPE (rope_, rope_backward_, and out of place rope, rope_backward): the CPU reference
// against hand-computed rotations, an independent cos/sin cache and Llama 3.1 frequencies,
// and its own inverse; out of place against in place on a copy (bit for bit, tail copied,
// inputs untouched, outputs that are their inputs, inputs that share memory or have a
// stride of 0); the CUDA kernel in both forms against the CPU reference over dtypes,
// styles, angle sources, int32/int64 positions, partial rotary, GQA, fused qkv slices, 4-d
// and transposed layouts, unaligned heads and padded outputs (every element outside the
// rotated part must come back bit-identical: NaN-poisoned gaps unwritten); out-of-range
// positions; bad inputs (a rejected call writes nothing).
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

// One layout of q and k: the in-place GPU kernel against the CPU reference, and the
// out-of-place op (CPU and GPU) against the in-place CPU reference on a copy.
struct GpuCase {
  DType dt;
  RopeStyle style;
  bool use_cache;
  int64_t batch, seq, heads_q, heads_k, dim, rot;
  bool four_d, transposed, fused_qkv, broadcast_positions;
  int64_t pad;  // extra elements per token row (unaligned strides when odd)
};

testing::Message case_trace(const GpuCase& k, bool backward) {
  return testing::Message() << dtype_name(k.dt) << " " << style_name(k.style)
                            << (k.use_cache ? " cache" : " theta") << " batch " << k.batch << " seq " << k.seq
                            << " heads " << k.heads_q << "/" << k.heads_k << " dim " << k.dim << " rot " << k.rot
                            << (k.four_d ? " 4d" : "") << (k.transposed ? " transposed" : "")
                            << (k.fused_qkv ? " qkv" : "") << " pad " << k.pad << (backward ? " backward" : "");
}

// Where a [batch, seq, heads, dim] tensor lies in its buffer, in elements.
struct Layout {
  int64_t offset, batch, seq, head;
  int64_t at(int64_t b, int64_t s, int64_t h) const { return offset + b * batch + s * seq + h * head; }
};

// The case's view of a layout: [batch, seq, heads, dim] when four_d or transposed, else
// [tokens, heads, dim].
TensorView case_view(const GpuCase& k, void* data, bool gpu, const Layout& l, int64_t heads) {
  if (k.four_d || k.transposed)
    return strided(data, k.dt, gpu, l.offset, {k.batch, k.seq, heads, k.dim}, {l.batch, l.seq, l.head, 1});
  return strided(data, k.dt, gpu, l.offset, {k.batch * k.seq, heads, k.dim}, {l.seq, l.head, 1});
}

// k (or k_out) of the case: absent when it has no heads (q rotated alone).
std::optional<TensorView> case_k_view(const GpuCase& k, void* data, bool gpu, const Layout& l) {
  if (k.heads_k == 0) return std::nullopt;
  return case_view(k, data, gpu, l, k.heads_k);
}

// The largest |element| (gaps between rows not read): the scale of the fp32 math's error.
float max_abs(std::initializer_list<const HostTensor*> tensors) {
  float m = 0;
  for (const HostTensor* t : tensors)
    for (int64_t r = 0; r < t->rows; ++r)
      for (int64_t c = 0; c < t->d; ++c) m = std::max(m, std::fabs(t->get(r, c)));
  return m;
}

// The inputs of a case, fresh random values: q in `buf` (with k beside it and v after it
// when fused_qkv; its [batch, heads, seq, dim] memory when transposed), else k in `kbuf`.
struct CaseInputs {
  HostTensor buf, kbuf;
  Layout q, k;
  std::vector<int64_t> positions, positions_shape;
  HostTensor cache;

  explicit CaseInputs(const GpuCase& c)
      : buf(c.dt, c.batch * c.seq, width(c), width(c) + c.pad),
        kbuf(c.dt, c.batch * c.seq, c.heads_k * c.dim, c.heads_k * c.dim + c.pad),
        positions(random_positions(c.broadcast_positions ? c.seq : c.batch * c.seq, kMaxPos)),
        cache(make_cache(kMaxPos, c.rot, theta_inv_freq(c.rot, 10000.0))) {
    buf.randomize();
    kbuf.randomize();
    const int64_t D = c.dim, rs = buf.row_stride, krs = kbuf.row_stride;
    if (c.transposed) {
      q = {0, c.heads_q * c.seq * D, D, c.seq * D};
      k = {0, c.heads_k * c.seq * D, D, c.seq * D};
    } else {
      q = {0, c.seq * rs, rs, D};
      k = c.fused_qkv ? Layout{c.heads_q * D, c.seq * rs, rs, D} : Layout{0, c.seq * krs, krs, D};
    }
    if (c.four_d || c.transposed)
      positions_shape = c.broadcast_positions ? std::vector<int64_t>{1, c.seq} : std::vector<int64_t>{c.batch, c.seq};
  }
  static constexpr int64_t kMaxPos = 5000;
  static int64_t width(const GpuCase& c) { return (c.heads_q + (c.fused_qkv ? 2 * c.heads_k : 0)) * c.dim; }
};

// rope_ / rope_backward_ (q_out absent) or rope / rope_backward of the case.
void call_rope(const GpuCase& c, bool backward, const TensorView& q, const std::optional<TensorView>& k,
               const std::optional<TensorView>& q_out, const std::optional<TensorView>& k_out,
               const TensorView& positions, const TensorView& cache) {
  const RopeTheta theta{c.rot, 10000.0, std::nullopt};
  if (!q_out) {
    if (c.use_cache && backward) rope_backward_(q, k, positions, cache, c.style);
    else if (c.use_cache) rope_(q, k, positions, cache, c.style);
    else if (backward) rope_backward_(q, k, positions, theta, c.style);
    else rope_(q, k, positions, theta, c.style);
  } else {
    if (c.use_cache && backward) rope_backward(*q_out, k_out, q, k, positions, cache, c.style);
    else if (c.use_cache) rope(*q_out, k_out, q, k, positions, cache, c.style);
    else if (backward) rope_backward(*q_out, k_out, q, k, positions, theta, c.style);
    else rope(*q_out, k_out, q, k, positions, theta, c.style);
  }
}

// got against want over every element of the buffer: the rotated ones (columns below
// rotated_width whose place in their head is below rot) within one rounding (rtol) plus
// the fp32 math's absolute error on terms of the inputs' size (atol); all other bytes
// identical (untouched, or copied: the tail of an out-of-place output).
void expect_rotated(const HostTensor& got, const HostTensor& want, float max_in, int64_t rotated_width,
                    int64_t dim, int64_t rot) {
  const int64_t elem = dtype_size(want.dtype), count = static_cast<int64_t>(want.bytes.size()) / elem;
  const float rtol = dtype_rtol(want.dtype), atol = 1e-5f * (1.0f + max_in);
  ASSERT_EQ(got.bytes.size(), want.bytes.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = i / want.row_stride, c = i % want.row_stride;
    const bool rotated = c < rotated_width && c % dim < rot;
    const float g = got.get(r, c), w = want.get(r, c);
    const bool ok = rotated ? std::fabs(g - w) <= atol + rtol * std::fabs(w)
                            : std::memcmp(&got.bytes[i * elem], &want.bytes[i * elem], elem) == 0;
    if (!ok && bad++ < 5)
      ADD_FAILURE() << "row " << r << " col " << c << (rotated ? " (rotated)" : " (not rotated)") << ": got "
                    << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0);
}

// The in-place GPU kernel against the CPU reference on one layout.
void run_gpu_case(const GpuCase& k, bool backward) {
  SCOPED_TRACE(case_trace(k, backward));
  // The transposed layout keeps rows of D per (batch, head, seq): buf is that memory.
  ASSERT_TRUE(!k.transposed || (k.pad == 0 && !k.fused_qkv));
  CaseInputs in(k);
  Positions pos(in.positions, k.dt == DType::f16 ? DType::i32 : DType::i64);

  HostTensor ref = in.buf, kref = in.kbuf;
  call_rope(k, backward, case_view(k, ref.bytes.data(), false, in.q, k.heads_q),
            case_k_view(k, k.fused_qkv ? ref.bytes.data() : kref.bytes.data(), false, in.k),
            std::nullopt, std::nullopt, pos.view(false, in.positions_shape), in.cache.view());

  DeviceTensor gbuf(in.buf), gk(in.kbuf), gcache(in.cache);
  call_rope(k, backward, case_view(k, gbuf.data, true, in.q, k.heads_q),
            case_k_view(k, k.fused_qkv ? gbuf.data : gk.data, true, in.k), std::nullopt,
            std::nullopt, pos.view(true, in.positions_shape), gcache.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const float max_in = max_abs({&in.buf, &in.kbuf});
  expect_rotated(gbuf.download(), ref, max_in, (k.heads_q + (k.fused_qkv ? k.heads_k : 0)) * k.dim, k.dim, k.rot);
  if (!k.fused_qkv && k.heads_k > 0) expect_rotated(gk.download(), kref, max_in, k.heads_k * k.dim, k.dim, k.rot);
}

// Out of place: q_out and k_out are head slices of one NaN-poisoned output buffer [tokens,
// (heads_q + heads_k) * dim + out_pad] (4-d when q is). Expected: the CPU in-place result on
// a copy of the inputs, moved into that buffer (its gaps stay NaN). The CPU must match it
// bit for bit, the GPU within rounding in the rotated part and bit for bit elsewhere (the
// tail copied, the gaps unwritten); the inputs must come back unchanged.
void run_out_of_place_case(const GpuCase& k, bool backward, bool gpu, DType positions_dtype, int64_t out_pad) {
  SCOPED_TRACE(case_trace(k, backward) << " out of place" << (gpu ? " gpu" : " cpu") << " positions "
                                       << dtype_name(positions_dtype) << " out_pad " << out_pad);
  ASSERT_TRUE(!k.transposed || (k.pad == 0 && !k.fused_qkv));
  CaseInputs in(k);
  Positions pos(in.positions, positions_dtype);
  const int64_t D = k.dim, width = (k.heads_q + k.heads_k) * D;
  HostTensor out(k.dt, k.batch * k.seq, width, width + out_pad);
  out.poison();
  const Layout q_out{0, k.seq * out.row_stride, out.row_stride, D};
  const Layout k_out{k.heads_q * D, k.seq * out.row_stride, out.row_stride, D};

  HostTensor ref = in.buf, kref = in.kbuf, want = out;
  const HostTensor& kref_buf = k.fused_qkv ? ref : kref;
  call_rope(k, backward, case_view(k, ref.bytes.data(), false, in.q, k.heads_q),
            case_k_view(k, k.fused_qkv ? ref.bytes.data() : kref.bytes.data(), false, in.k),
            std::nullopt, std::nullopt, pos.view(false, in.positions_shape), in.cache.view());
  const int64_t elem = dtype_size(k.dt);
  for (int64_t b = 0; b < k.batch; ++b)
    for (int64_t s = 0; s < k.seq; ++s)
      for (int64_t h = 0; h < k.heads_q + k.heads_k; ++h) {
        const bool is_q = h < k.heads_q;
        const int64_t from = is_q ? in.q.at(b, s, h) : in.k.at(b, s, h - k.heads_q);
        const int64_t to = is_q ? q_out.at(b, s, h) : k_out.at(b, s, h - k.heads_q);
        std::memcpy(&want.bytes[to * elem], &(is_q ? ref : kref_buf).bytes[from * elem], D * elem);
      }

  if (!gpu) {
    HostTensor buf = in.buf, kbuf = in.kbuf;
    call_rope(k, backward, case_view(k, buf.bytes.data(), false, in.q, k.heads_q),
              case_k_view(k, k.fused_qkv ? buf.bytes.data() : kbuf.bytes.data(), false, in.k),
              case_view(k, out.bytes.data(), false, q_out, k.heads_q),
              case_k_view(k, out.bytes.data(), false, k_out), pos.view(false, in.positions_shape),
              in.cache.view());
    EXPECT_TRUE(out.bytes == want.bytes) << "the CPU's out-of-place output differs from its in-place result";
    EXPECT_TRUE(buf.bytes == in.buf.bytes && kbuf.bytes == in.kbuf.bytes) << "an input was written";
    return;
  }
  DeviceTensor gbuf(in.buf), gk(in.kbuf), gout(out), gcache(in.cache);
  call_rope(k, backward, case_view(k, gbuf.data, true, in.q, k.heads_q),
            case_k_view(k, k.fused_qkv ? gbuf.data : gk.data, true, in.k),
            case_view(k, gout.data, true, q_out, k.heads_q), case_k_view(k, gout.data, true, k_out),
            pos.view(true, in.positions_shape), gcache.view());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_rotated(gout.download(), want, max_abs({&in.buf, &in.kbuf}), width, D, k.rot);
  EXPECT_TRUE(gbuf.download().bytes == in.buf.bytes && gk.download().bytes == in.kbuf.bytes)
      << "an input was written";
}

// The layouts every in-place and out-of-place comparison runs over, with the output
// buffer's row padding of each (3: unaligned, the out-of-place kernel's scalar path).
struct CaseShape {
  int64_t batch, seq, heads_q, heads_k, dim, rot;
  bool four_d, transposed, fused_qkv, broadcast_positions;
  int64_t pad, out_pad;
};
const CaseShape kCaseShapes[] = {
    // Llama-like fused qkv with GQA; rows padded so the vector path is off when pad is odd.
    {1, 37, 8, 2, 128, 128, false, false, true, false, 0, 0},
    {1, 21, 5, 3, 64, 32, false, false, true, false, 3, 8},
    // Separate q/k, 4-d with per-batch and shared positions, partial rotary.
    {3, 11, 4, 1, 80, 64, true, false, false, false, 8, 0},
    {2, 9, 3, 3, 96, 96, true, false, true, true, 0, 3},
    // [batch, heads, seq, dim] memory seen through its transpose; odd head_dim.
    {2, 13, 3, 2, 64, 64, false, true, false, false, 0, 0},
    {1, 5, 2, 1, 7, 6, false, false, false, false, 1, 1},
    // Partial rotary with a tail of whole vectors (NeoX-style 25%), and q alone (heads_k 0).
    {2, 6, 3, 2, 128, 32, false, false, false, false, 0, 8},
    {1, 4, 16, 0, 64, 16, false, false, false, false, 0, 0},
};

template <class F>
void for_each_case(F&& f) {
  for (DType dt : all_dtypes())
    for (RopeStyle style : kStyles)
      for (bool use_cache : {true, false})
        for (const CaseShape& c : kCaseShapes)
          f(GpuCase{dt, style, use_cache, c.batch, c.seq, c.heads_q, c.heads_k, c.dim, c.rot, c.four_d,
                    c.transposed, c.fused_qkv, c.broadcast_positions, c.pad},
            c.out_pad);
}

TEST(RopeCpu, OutOfPlaceEqualsInPlaceOnACopy) {
  int n = 0;
  for_each_case([&](const GpuCase& k, int64_t out_pad) {
    for (bool backward : {false, true})
      run_out_of_place_case(k, backward, false, ++n % 2 ? DType::i32 : DType::i64, out_pad);
  });
}

TEST(RopeCpu, OutOfPlaceHandComputedWithTail) {
  // One head of 6 rotated over its first 4 (inv_freq 1 and 0.01 at theta 1e4), position 2:
  // elements 4 and 5 are copied.
  for (RopeStyle style : kStyles)
    for (bool backward : {false, true}) {
      HostTensor q(DType::f32, 1, 6), q_out(DType::f32, 1, 6);
      const float x[6] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
      for (int c = 0; c < 6; ++c) q.set(0, c, x[c]);
      q_out.poison();
      const HostTensor before = q;
      Positions pos({2}, DType::i64);
      const TensorView qv = strided(q.bytes.data(), DType::f32, false, 0, {1, 1, 6}, {6, 6, 1});
      const TensorView ov = strided(q_out.bytes.data(), DType::f32, false, 0, {1, 1, 6}, {6, 6, 1});
      const RopeTheta theta{4, 10000.0, std::nullopt};
      if (backward) rope_backward(ov, std::nullopt, qv, std::nullopt, pos.view(false), theta, style);
      else rope(ov, std::nullopt, qv, std::nullopt, pos.view(false), theta, style);
      const double sign = backward ? -1.0 : 1.0;
      const int a1 = 0, b1 = style == RopeStyle::neox ? 2 : 1;
      const int a2 = style == RopeStyle::neox ? 1 : 2, b2 = 3;
      const double c1 = std::cos(2.0), s1 = sign * std::sin(2.0), c2 = std::cos(0.02), s2 = sign * std::sin(0.02);
      SCOPED_TRACE(testing::Message() << style_name(style) << (backward ? " backward" : ""));
      EXPECT_NEAR(q_out.get(0, a1), x[a1] * c1 - x[b1] * s1, 1e-6);
      EXPECT_NEAR(q_out.get(0, b1), x[b1] * c1 + x[a1] * s1, 1e-6);
      EXPECT_NEAR(q_out.get(0, a2), x[a2] * c2 - x[b2] * s2, 1e-6);
      EXPECT_NEAR(q_out.get(0, b2), x[b2] * c2 + x[a2] * s2, 1e-6);
      EXPECT_EQ(q_out.get(0, 4), 5.0f);
      EXPECT_EQ(q_out.get(0, 5), 6.0f);
      expect_equal_elements(q, before, "q after rope out of place");
    }
}

// An output that is exactly its input is rotated in place; inputs may share memory with
// each other (only read) and have a stride of 0.
void check_aliasing(bool gpu) {
  const int64_t tokens = 5, hq = 3, hk = 2, D = 24, rot = 16;
  HostTensor qkv(DType::bf16, tokens, (hq + hk) * D), k_out(DType::bf16, tokens, hk * D);
  qkv.randomize();
  k_out.poison();
  Positions pos(random_positions(tokens, 1000), DType::i32);
  const RopeTheta theta{rot, 10000.0, std::nullopt};
  const int64_t row = (hq + hk) * D;
  auto q_at = [&](void* d, bool g) { return strided(d, DType::bf16, g, 0, {tokens, hq, D}, {row, D, 1}); };
  auto k_at = [&](void* d, bool g) { return strided(d, DType::bf16, g, hq * D, {tokens, hk, D}, {row, D, 1}); };
  auto ko_at = [&](void* d, bool g) { return strided(d, DType::bf16, g, 0, {tokens, hk, D}, {hk * D, D, 1}); };
  // Expected: rope_ in place on a copy; k_out the rotated k (its tail copied).
  HostTensor want = qkv;
  rope_(q_at(want.bytes.data(), false), k_at(want.bytes.data(), false), pos.view(false), theta, RopeStyle::neox);
  HostTensor want_k(DType::bf16, tokens, hk * D);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hk * D; ++c) want_k.set(t, c, want.get(t, hq * D + c));
  // q rotated in place (q_out is q), k out of place into k_out: k stays as it was.
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hk * D; ++c) want.set(t, hq * D + c, qkv.get(t, hq * D + c));
  HostTensor got = qkv, got_k = k_out;
  if (gpu) {
    DeviceTensor g(qkv), gk(k_out);
    rope(q_at(g.data, true), ko_at(gk.data, true), q_at(g.data, true), k_at(g.data, true), pos.view(true), theta,
         RopeStyle::neox);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got = g.download();
    got_k = gk.download();
    expect_rotated(got, want, max_abs({&qkv}), hq * D, D, rot);
    expect_rotated(got_k, want_k, max_abs({&qkv}), hk * D, D, rot);
  } else {
    rope(q_at(got.bytes.data(), false), ko_at(got_k.bytes.data(), false), q_at(got.bytes.data(), false),
         k_at(got.bytes.data(), false), pos.view(false), theta, RopeStyle::neox);
    EXPECT_TRUE(got.bytes == want.bytes) << "q_out == q: not rope_'s result";
    EXPECT_TRUE(got_k.bytes == want_k.bytes) << "k_out: not rope_'s result for k";
  }

  // k is q (inputs may overlap), and q has token stride 0 (one token broadcast): every
  // output row is the rotation of q's row 0 at its own position.
  HostTensor outs(DType::bf16, tokens, 2 * hq * D);
  outs.poison();
  const TensorView q0 = strided(qkv.bytes.data(), DType::bf16, false, 0, {tokens, hq, D}, {0, D, 1});
  const TensorView qo = strided(outs.bytes.data(), DType::bf16, false, 0, {tokens, hq, D}, {2 * hq * D, D, 1});
  const TensorView ko = strided(outs.bytes.data(), DType::bf16, false, hq * D, {tokens, hq, D}, {2 * hq * D, D, 1});
  HostTensor expanded(DType::bf16, tokens, hq * D);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hq * D; ++c) expanded.set(t, c, qkv.get(0, c));
  HostTensor want_rows = expanded;
  rope_(strided(want_rows.bytes.data(), DType::bf16, false, 0, {tokens, hq, D}, {hq * D, D, 1}), std::nullopt,
        pos.view(false), theta, RopeStyle::neox);
  if (gpu) {
    DeviceTensor g(qkv), go(outs);
    const TensorView gq0 = strided(g.data, DType::bf16, true, 0, {tokens, hq, D}, {0, D, 1});
    rope(strided(go.data, DType::bf16, true, 0, {tokens, hq, D}, {2 * hq * D, D, 1}),
         strided(go.data, DType::bf16, true, hq * D, {tokens, hq, D}, {2 * hq * D, D, 1}), gq0, gq0,
         pos.view(true), theta, RopeStyle::neox);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    outs = go.download();
  } else {
    rope(qo, ko, q0, q0, pos.view(false), theta, RopeStyle::neox);
  }
  HostTensor got_q(DType::bf16, tokens, hq * D), got_k2(DType::bf16, tokens, hq * D);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hq * D; ++c) {
      got_q.set(t, c, outs.get(t, c));
      got_k2.set(t, c, outs.get(t, hq * D + c));
    }
  expect_rotated(got_q, want_rows, max_abs({&qkv}), hq * D, D, gpu ? rot : 0);
  expect_rotated(got_k2, want_rows, max_abs({&qkv}), hq * D, D, gpu ? rot : 0);
}

TEST(RopeCpu, OutOfPlaceAliasingAndSharedInputs) { check_aliasing(false); }

TEST(RopeGpu, MatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  for_each_case([&](const GpuCase& k, int64_t) {
    for (bool backward : {false, true}) run_gpu_case(k, backward);
  });
}

TEST(RopeGpu, OutOfPlaceMatchesCpuReference) {
  LLMK_REQUIRE_GPU();
  int n = 0;
  for_each_case([&](const GpuCase& k, int64_t out_pad) {
    for (bool backward : {false, true})
      run_out_of_place_case(k, backward, true, ++n % 2 ? DType::i32 : DType::i64, out_pad);
  });
}

TEST(RopeGpu, OutOfPlaceAliasingAndSharedInputs) {
  LLMK_REQUIRE_GPU();
  check_aliasing(true);
}

TEST(RopeGpu, LongSequencesAndManyTokens) {
  LLMK_REQUIRE_GPU();
  // More tokens than a 1-d grid of 65535 blocks would cover one per block, and rot_dim 256.
  run_gpu_case({DType::bf16, RopeStyle::neox, false, 1, 70001, 1, 1, 16, 16, false, false, true, false, 0}, false);
  run_gpu_case({DType::f32, RopeStyle::gptj, true, 1, 3, 2, 2, 256, 256, false, false, true, false, 0}, false);
  run_out_of_place_case({DType::bf16, RopeStyle::neox, false, 1, 70001, 1, 1, 16, 16, false, false, true, false, 0},
                        true, true, DType::i64, 0);
  // The largest head out of place with a tail: 2048 = 8 rotated + 2040 copied, in 16-byte
  // vectors (256 threads a head) and, with unaligned output rows, in scalars (1024).
  for (int64_t out_pad : {0, 1})
    run_out_of_place_case({DType::f32, RopeStyle::neox, true, 1, 3, 2, 1, 2048, 8, false, false, false, false, 0},
                          false, true, DType::i32, out_pad);
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
               "rope_: cos_sin_cache's width (rot_dim) must be even, in [2, min(head_dim = 8");
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

TEST_F(RopeBadInput, OutOfPlace) {
  // Outputs in a NaN-poisoned buffer [4, 24]: q_out [4, 2, 8] at 0, k_out [4, 1, 8] at 16.
  HostTensor out(DType::bf16, 4, 24);
  out.poison();
  const HostTensor before = buf, out_before = out;
  const RopeTheta ok{8, 1e4, std::nullopt};
  auto out_view = [&](int64_t offset, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return strided(out.bytes.data(), DType::bf16, false, offset, std::move(shape), std::move(strides));
  };
  const TensorView q_out = out_view(0, {4, 2, 8}, {24, 8, 1}), k_out = out_view(16, {4, 1, 8}, {24, 8, 1});
  const TensorView p = pos.view(false);
  expect_error([&] { rope(out_view(0, {4, 2, 6}, {24, 8, 1}), k_out, q(), k(), p, ok, RopeStyle::neox); },
               "rope: q_out has shape [4, 2, 6] but q has shape [4, 2, 8]");
  expect_error([&] { rope_backward(out_view(0, {4, 2, 6}, {24, 8, 1}), k_out, q(), k(), p, ok, RopeStyle::neox); },
               "rope_backward: dq_out has shape [4, 2, 6] but dq has shape [4, 2, 8]");
  HostTensor f32(DType::f32, 4, 24);
  const TensorView k_out_f32 = strided(f32.bytes.data(), DType::f32, false, 0, {4, 1, 8}, {24, 8, 1});
  expect_error([&] { rope(q_out, k_out_f32, q(), k(), p, ok, RopeStyle::neox); },
               "rope: k_out has dtype float32, expected bfloat16");
  expect_error([&] { rope(q_out, std::nullopt, q(), k(), p, ok, RopeStyle::neox); },
               "rope: k_out must be given exactly when k is (k given, k_out absent)");
  expect_error([&] { rope_backward(q_out, k_out, q(), std::nullopt, p, ok, RopeStyle::gptj); },
               "rope_backward: dk_out must be given exactly when dk is (dk absent, dk_out given)");
  expect_error([&] { rope(q_out, k_out, q(), k(), p, RopeTheta{10, 1e4, std::nullopt}, RopeStyle::neox); },
               "rope: rot_dim must be even, in [2, min(head_dim = 8");
  // Overlaps: an output may not share memory with another tensor of the call.
  const TensorView q_shifted = strided(buf.bytes.data(), DType::bf16, false, 4, {4, 2, 8}, {32, 8, 1});
  expect_error([&] { rope(q_shifted, std::nullopt, q(), std::nullopt, p, ok, RopeStyle::neox); },
               "rope: q_out and q overlap in memory");
  const TensorView q_over_k = strided(buf.bytes.data(), DType::bf16, false, 16, {4, 2, 8}, {32, 8, 1});
  expect_error([&] { rope(q_over_k, k_out, q(), k(), p, ok, RopeStyle::neox); }, "rope: q_out and k overlap in memory");
  const TensorView k_over_q = strided(buf.bytes.data(), DType::bf16, false, 8, {4, 1, 8}, {32, 8, 1});
  expect_error([&] { rope(q_out, k_over_q, q(), k(), p, ok, RopeStyle::neox); }, "rope: k_out and q overlap in memory");
  expect_error([&] { rope(q_out, out_view(8, {4, 1, 8}, {24, 8, 1}), q(), k(), p, ok, RopeStyle::neox); },
               "rope: q_out and k_out overlap in memory");
  expect_error([&] { rope(out_view(0, {4, 2, 8}, {24, 0, 1}), k_out, q(), k(), p, ok, RopeStyle::neox); },
               "rope: q_out has elements that share memory");
  expect_error([&] { rope(out_view(0, {4, 2, 8}, {24, 1, 2}), k_out, q(), k(), p, ok, RopeStyle::neox); },
               "rope: q_out must be contiguous in its last dim, got stride 2");
  // A tail past rot_dim beyond 2048 elements is more than one block copies.
  HostTensor wide(DType::f32, 1, 2050), wide_out(DType::f32, 1, 2050);
  const TensorView wq = strided(wide.bytes.data(), DType::f32, false, 0, {1, 1, 2050}, {2050, 2050, 1});
  const TensorView wo = strided(wide_out.bytes.data(), DType::f32, false, 0, {1, 1, 2050}, {2050, 2050, 1});
  Positions one({0}, DType::i64);
  expect_error([&] { rope(wo, std::nullopt, wq, std::nullopt, one.view(false), ok, RopeStyle::neox); },
               "rope: head_dim 2050 with rot_dim 8 is more than the 2048");
  if (has_gpu()) {
    DeviceTensor gout(out);
    const TensorView gq_out = strided(gout.data, DType::bf16, true, 0, {4, 2, 8}, {24, 8, 1});
    expect_error([&] { rope(gq_out, k_out, q(), k(), p, ok, RopeStyle::neox); },
                 "rope: q_out is on cuda:0 but q is on cpu:0");
    const HostTensor after = gout.download();
    EXPECT_TRUE(after.bytes == out_before.bytes) << "device output written by a rejected call";
  }
  expect_untouched(before);
  EXPECT_TRUE(out.bytes == out_before.bytes) << "output written by a rejected call";
}

}  // namespace
}  // namespace llmk::test
