// Attention forward (attention, attention_varlen): the CPU reference
// against hand values; the CUDA kernel against the CPU reference over dtypes, head dims,
// causal and not, GQA/MQA, seqlen_q != seqlen_k (fully masked rows), lengths that are not
// multiples of the tiles, seqlen 1, strided and transposed layouts, the log-sum-exp, and
// variable-length batches; bad inputs.
//
// Tolerance: the kernel rounds P to the input dtype before P V and the output once, each
// a relative error of at most eps / 2 (eps = 2^-8 bf16, 2^-11 fp16), so an output is
// within eps / 2 * (max|v| + |ref|) of the double reference; the test allows twice that.
// The Python tests add the FlashAttention rule (at most 2x PyTorch's own error).
#include <array>
#include <limits>
#include <memory>

#include "test_util.h"

namespace llmk::test {
namespace {

constexpr DType kDTypes[] = {DType::f16, DType::bf16};
constexpr int64_t kHeadDims[] = {32, 64, 96, 128, 256};

double eps_of(DType dt) { return dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }

// A [batch, seq, heads, head_dim] view into its own storage of `capacity` heads (the view
// holds the last `heads` of them, as q, k or v of a fused qkv projection), laid out
// [batch, seq, capacity, dim] or, `transposed`, [batch, capacity, seq, dim]. Storage
// outside the view is NaN.
struct Heads {
  DType dtype;
  int64_t batch, seq, heads, dim, capacity;
  bool transposed;
  HostTensor store;
  std::unique_ptr<DeviceTensor> device;

  Heads(DType dt, int64_t b, int64_t s, int64_t h, int64_t d, int64_t cap = 0, bool trans = false)
      : dtype(dt), batch(b), seq(s), heads(h), dim(d), capacity(std::max(cap, h)), transposed(trans),
        store(dt, 1, std::max<int64_t>(b * s * std::max(cap, h) * d, 1)) {
    store.poison();
  }
  int64_t offset() const { return (capacity - heads) * (transposed ? seq * dim : dim); }
  std::array<int64_t, 4> strides() const {
    if (transposed) return {capacity * seq * dim, dim, seq * dim, 1};
    return {seq * capacity * dim, capacity * dim, dim, 1};
  }
  int64_t index(int64_t b, int64_t s, int64_t h, int64_t c) const {
    const auto st = strides();
    return offset() + b * st[0] + s * st[1] + h * st[2] + c;
  }
  float get(int64_t b, int64_t s, int64_t h, int64_t c) const { return store.get(0, index(b, s, h, c)); }
  void randomize() {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < dim; ++c) store.set(0, index(b, s, h, c), dist(rng()));
  }
  TensorView make(void* base, bool on_gpu, bool packed) const {
    const auto st = strides();
    const Device dev{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0};
    void* data = static_cast<unsigned char*>(base) + offset() * dtype_size(dtype);
    if (packed) {  // [batch * seq, heads, dim] (batch 1)
      const int64_t shape[3] = {seq, heads, dim}, strides3[3] = {st[1], st[2], 1};
      return TensorView(data, dtype, dev, 3, shape, strides3);
    }
    const int64_t shape[4] = {batch, seq, heads, dim};
    return TensorView(data, dtype, dev, 4, shape, st.data());
  }
  TensorView host(bool packed = false) { return make(store.bytes.data(), false, packed); }
  TensorView gpu(bool packed = false) {
    if (!device) device = std::make_unique<DeviceTensor>(store);
    return make(device->data, true, packed);
  }
  HostTensor download() const { return device->download(); }
};

struct Lse {
  HostTensor host;
  std::vector<int64_t> shape;
  std::unique_ptr<DeviceTensor> device;
  explicit Lse(std::vector<int64_t> s) : host(DType::f32, 1, std::max<int64_t>(numel(s), 1)), shape(std::move(s)) {
    host.poison();
  }
  static int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    return n;
  }
  TensorView view(void* data, bool on_gpu) const {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    return TensorView(data, DType::f32, Device{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0},
                      static_cast<int>(shape.size()), shape.data(), strides.data());
  }
  TensorView cpu() { return view(host.bytes.data(), false); }
  TensorView gpu() {
    if (!device) device = std::make_unique<DeviceTensor>(host);
    return view(device->data, true);
  }
};

float max_abs_v(const Heads& v) {
  float m = 0;
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t s = 0; s < v.seq; ++s)
      for (int64_t h = 0; h < v.heads; ++h)
        for (int64_t c = 0; c < v.dim; ++c) m = std::max(m, std::fabs(v.get(b, s, h, c)));
  return m;
}

// GPU output `got` (downloaded storage of `out`) against the reference; every storage
// element outside the view must still be NaN.
void expect_close(const Heads& out, const HostTensor& got, const Heads& ref, float max_v) {
  const double eps = eps_of(out.dtype);
  std::vector<bool> in_view(got.d, false);
  int64_t bad = 0;
  double worst = 0;
  for (int64_t b = 0; b < out.batch; ++b)
    for (int64_t s = 0; s < out.seq; ++s)
      for (int64_t h = 0; h < out.heads; ++h)
        for (int64_t c = 0; c < out.dim; ++c) {
          const int64_t i = out.index(b, s, h, c);
          in_view[i] = true;
          const double g = got.get(0, i), r = ref.get(b, s, h, c);
          const double err = std::fabs(g - r);
          worst = std::max(worst, err);
          if (!(err <= eps * (max_v + std::fabs(r)))) {
            if (bad++ < 5)
              ADD_FAILURE() << "out[" << b << ", " << s << ", " << h << ", " << c << "] = " << g
                            << ", reference " << r;
          }
        }
  EXPECT_EQ(bad, 0) << "max abs error " << worst;
  int64_t stray = 0;
  for (int64_t i = 0; i < got.d; ++i) stray += !in_view[i] && !std::isnan(got.get(0, i));
  EXPECT_EQ(stray, 0) << "elements outside out were written";
}

void expect_lse_close(const HostTensor& got, const HostTensor& ref, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = got.get(0, i), r = ref.get(0, i);
    const bool ok = std::isinf(r) ? g == r : std::fabs(g - r) <= 1e-4f + 1e-5f * std::fabs(r);
    if (!ok && bad++ < 5) ADD_FAILURE() << "lse[" << i << "] = " << g << ", reference " << r;
  }
  EXPECT_EQ(bad, 0);
}

struct Shape {
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
};

// A build with a trimmed LLMK_HEAD_DIMS: the GPU call must fail clearly; true (skip the
// comparison) when `dim` has no kernel.
template <class F>
bool skip_uncompiled(int64_t dim, F&& gpu_call) {
  if (attention_head_dim_compiled(dim)) return false;
  expect_error(gpu_call, "has no CUDA kernel in this build");
  return true;
}

// Runs the CPU reference and the GPU kernel on fresh inputs and compares out and lse.
void check_dense(DType dt, const Shape& s, bool causal, bool transposed = false, int64_t extra_heads = 0) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " batch " << s.batch << " seq_q " << s.seq_q << " seq_k "
                                  << s.seq_k << " heads " << s.heads_q << "/" << s.heads_kv << " dim " << s.dim
                                  << (causal ? " causal" : "") << (transposed ? " transposed" : "")
                                  << (extra_heads ? " strided heads" : ""));
  Heads q(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra_heads, transposed);
  Heads k(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + extra_heads, transposed);
  Heads v(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + 2 * extra_heads, transposed);
  Heads ref(dt, s.batch, s.seq_q, s.heads_q, s.dim);
  Heads out(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra_heads, transposed);
  q.randomize();
  k.randomize();
  v.randomize();
  Lse lse_ref({s.batch, s.heads_q, s.seq_q}), lse({s.batch, s.heads_q, s.seq_q});
  const double scale = 1.0 / std::sqrt(double(s.dim));
  attention(ref.host(), q.host(), k.host(), v.host(), causal, scale, lse_ref.cpu());
  if (skip_uncompiled(s.dim, [&] { attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), causal, scale); })) return;
  attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), causal, scale, lse.gpu());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(out, out.download(), ref, max_abs_v(v));
  expect_lse_close(lse.device->download(), lse_ref.host, Lse::numel(lse.shape));
}

TEST(AttentionCpu, MatchesHandValues) {
  // One key: out = v. Equal keys: out = mean of the visible v rows, lse = s + log(n).
  const int64_t d = 32, n = 5;
  Heads q(DType::bf16, 1, n, 1, d), k(DType::bf16, 1, n, 1, d),
      v(DType::bf16, 1, n, 1, d), out(DType::bf16, 1, n, 1, d);
  q.randomize();
  v.randomize();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < d; ++c) k.store.set(0, k.index(0, j, 0, c), c == 0 ? 1.0f : 0.0f);
  Lse lse({1, 1, n});
  attention(out.host(), q.host(), k.host(), v.host(), /*causal=*/true, 0.5, lse.cpu());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      double mean = 0;
      for (int64_t j = 0; j <= i; ++j) mean += v.get(0, j, 0, c);
      mean /= double(i + 1);
      EXPECT_NEAR(out.get(0, i, 0, c), mean, 1e-2 * (1 + std::fabs(mean)));
    }
    EXPECT_NEAR(lse.host.get(0, i), 0.5 * q.get(0, i, 0, 0) + std::log(double(i + 1)), 1e-5);
  }
  // seq_q > seq_k, causal: the first seq_q - seq_k rows see no key: 0 and lse -inf.
  Heads q2(DType::bf16, 1, 4, 1, d), k2(DType::bf16, 1, 2, 1, d), v2(DType::bf16, 1, 2, 1, d),
      out2(DType::bf16, 1, 4, 1, d);
  q2.randomize();
  k2.randomize();
  v2.randomize();
  Lse lse2({1, 1, 4});
  attention(out2.host(), q2.host(), k2.host(), v2.host(), true, 0.5, lse2.cpu());
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_EQ(out2.get(0, 0, 0, c), 0.0f);
    EXPECT_EQ(out2.get(0, 1, 0, c), 0.0f);
    EXPECT_NEAR(out2.get(0, 2, 0, c), v2.get(0, 0, 0, c), 1e-6);  // row 2 sees key 0 only
  }
  EXPECT_EQ(lse2.host.get(0, 0), -std::numeric_limits<float>::infinity());
}

TEST(AttentionGpu, EveryDtypeHeadDimAndMask) {
  LLMK_REQUIRE_GPU();
  for (DType dt : kDTypes)
    for (int64_t d : kHeadDims)
      for (bool causal : {false, true}) check_dense(dt, {2, 173, 173, 4, 2, d}, causal);
}

TEST(AttentionGpu, SequenceLengths) {
  LLMK_REQUIRE_GPU();
  const std::pair<int64_t, int64_t> lens[] = {{1, 1},     {1, 300},  {300, 1},   {128, 128}, {129, 257},
                                              {257, 129}, {64, 1000}, {1000, 64}, {255, 255}, {2, 3}};
  for (const auto& [sq, sk] : lens)
    for (bool causal : {false, true})
      for (int64_t d : {64, 128}) check_dense(DType::bf16, {1, sq, sk, 2, 1, d}, causal);
}

TEST(AttentionGpu, LongSequence) {
  LLMK_REQUIRE_GPU();
  check_dense(DType::bf16, {1, 1100, 2048, 1, 1, 128}, true);
  check_dense(DType::f16, {1, 2048, 1100, 1, 1, 64}, false);
}

TEST(AttentionGpu, GqaMqaAndLayouts) {
  LLMK_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    check_dense(dt, {3, 77, 77, 8, 1, 128}, true);              // MQA
    check_dense(dt, {2, 100, 150, 6, 3, 64}, false, true);      // [B, H, S, D] transposed
    check_dense(dt, {2, 100, 150, 4, 2, 128}, true, false, 3);  // head slices of wider rows
    check_dense(dt, {2, 70, 70, 4, 4, 96}, true, true, 2);
  }
}

// Packed sequences of the given q and k lengths, against the dense reference per sequence.
void check_varlen(DType dt, const std::vector<int64_t>& lens_q, const std::vector<int64_t>& lens_k,
                  int64_t heads_q, int64_t heads_kv, int64_t dim, bool causal) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " varlen " << lens_q.size() << " sequences, dim " << dim
                                  << (causal ? " causal" : ""));
  const int64_t batch = static_cast<int64_t>(lens_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(lens_q[b]));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(lens_k[b]));
  }
  const int64_t max_q = *std::max_element(lens_q.begin(), lens_q.end());
  const int64_t max_k = *std::max_element(lens_k.begin(), lens_k.end());
  Heads q(dt, 1, cu_q.back(), heads_q, dim, heads_q + 1), k(dt, 1, cu_k.back(), heads_kv, dim),
      v(dt, 1, cu_k.back(), heads_kv, dim, heads_kv + 2), out(dt, 1, cu_q.back(), heads_q, dim),
      ref(dt, 1, cu_q.back(), heads_q, dim);
  q.randomize();
  k.randomize();
  v.randomize();
  HostTensor cu_host(DType::i32, 1, 2 * (batch + 1));  // raw int32 storage, never get/set
  std::memcpy(cu_host.bytes.data(), cu_q.data(), 4 * (batch + 1));
  std::memcpy(cu_host.bytes.data() + 4 * (batch + 1), cu_k.data(), 4 * (batch + 1));
  auto cu_view = [&](void* base, bool on_gpu, int which) {
    const int64_t shape[1] = {batch + 1}, strides[1] = {1};
    return TensorView(static_cast<int32_t*>(base) + which * (batch + 1), DType::i32,
                      Device{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0}, 1, shape, strides);
  };
  Lse lse_ref({heads_q, cu_q.back()}), lse({heads_q, cu_q.back()});
  const double scale = 0.7 / std::sqrt(double(dim));
  attention_varlen(ref.host(true), q.host(true), k.host(true), v.host(true), cu_view(cu_host.bytes.data(), false, 0),
                   cu_view(cu_host.bytes.data(), false, 1), max_q, max_k, causal, scale, lse_ref.cpu());
  // The packed reference equals the dense reference of each sequence alone.
  for (int64_t b = 0; b < batch; ++b) {
    if (lens_q[b] == 0) continue;
    Heads qb(dt, 1, lens_q[b], heads_q, dim), kb(dt, 1, lens_k[b], heads_kv, dim), vb(dt, 1, lens_k[b], heads_kv, dim),
        ob(dt, 1, lens_q[b], heads_q, dim);
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t c = 0; c < dim; ++c)
        for (int64_t i = 0; i < lens_q[b]; ++i) qb.store.set(0, qb.index(0, i, h, c), q.get(0, cu_q[b] + i, h, c));
    for (int64_t h = 0; h < heads_kv; ++h)
      for (int64_t c = 0; c < dim; ++c)
        for (int64_t j = 0; j < lens_k[b]; ++j) {
          kb.store.set(0, kb.index(0, j, h, c), k.get(0, cu_k[b] + j, h, c));
          vb.store.set(0, vb.index(0, j, h, c), v.get(0, cu_k[b] + j, h, c));
        }
    attention(ob.host(), qb.host(), kb.host(), vb.host(), causal, scale);
    for (int64_t i = 0; i < lens_q[b]; ++i)
      for (int64_t h = 0; h < heads_q; ++h)
        for (int64_t c = 0; c < dim; ++c) ASSERT_EQ(ob.get(0, i, h, c), ref.get(0, cu_q[b] + i, h, c));
  }
  if (!has_gpu()) return;
  DeviceTensor cu_dev(cu_host);
  if (skip_uncompiled(dim, [&] {
        attention_varlen(out.gpu(true), q.gpu(true), k.gpu(true), v.gpu(true), cu_view(cu_dev.data, true, 0),
                         cu_view(cu_dev.data, true, 1), max_q, max_k, causal, scale);
      }))
    return;
  attention_varlen(out.gpu(true), q.gpu(true), k.gpu(true), v.gpu(true), cu_view(cu_dev.data, true, 0),
                   cu_view(cu_dev.data, true, 1), max_q, max_k, causal, scale, lse.gpu());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(out, out.download(), ref, max_abs_v(v));
  expect_lse_close(lse.device->download(), lse_ref.host, Lse::numel(lse.shape));
}

TEST(AttentionVarlen, MatchesDensePerSequence) {
  for (bool causal : {false, true}) {
    check_varlen(DType::bf16, {1, 130, 0, 77, 300}, {1, 130, 5, 200, 250}, 4, 2, 64, causal);
    check_varlen(DType::f16, {17, 256, 129}, {17, 256, 129}, 2, 1, 128, causal);
  }
  check_varlen(DType::bf16, {40, 3}, {0, 9}, 2, 2, 32, true);  // a sequence without keys
}

TEST(AttentionErrors, BadInputsWriteNothing) {
  const int64_t d = 64;
  Heads q(DType::bf16, 2, 8, 4, d), k(DType::bf16, 2, 8, 2, d), v(DType::bf16, 2, 8, 2, d), out(DType::bf16, 2, 8, 4, d);
  q.randomize();
  k.randomize();
  v.randomize();
  const TensorView qv = q.host(), kv = k.host(), vv = v.host(), ov = out.host();
  auto call = [&](const TensorView& o, const TensorView& qq, const TensorView& kk, const TensorView& vvv,
                  double scale = 0.125, const std::optional<TensorView>& lse = std::nullopt) {
    attention(o, qq, kk, vvv, false, scale, lse);
  };
  Heads k3(DType::bf16, 2, 8, 3, d), k48(DType::bf16, 2, 8, 2, 48), kf(DType::f16, 2, 8, 2, d);
  expect_error([&] { call(ov, qv, k3.host(), k3.host()); }, "multiple of heads_kv");
  expect_error([&] { call(ov, qv, k48.host(), k48.host()); }, "head_dim 48");
  Heads q48(DType::bf16, 2, 8, 4, 48);
  expect_error([&] { call(q48.host(), q48.host(), k48.host(), k48.host()); }, "supported head dims");
  expect_error([&] { call(ov, qv, kf.host(), vv); }, "dtype");
  HostTensor f32(DType::f32, 1, 2 * 8 * 4 * d);
  const int64_t shape[4] = {2, 8, 4, d};
  const TensorView qf32(f32.bytes.data(), DType::f32, Device{}, 4, shape, Heads(DType::bf16, 2, 8, 4, d).strides().data());
  expect_error([&] { call(ov, qf32, kv, vv); }, "float16 or bfloat16");
  const int64_t bad_strides[4] = {8 * 4 * d, 4 * d, d, 2};
  expect_error([&] { call(ov, TensorView(q.store.bytes.data(), DType::bf16, Device{}, 4, shape, bad_strides), kv, vv); },
               "contiguous in its last");
  const int64_t odd_strides[4] = {8 * 4 * d, 4 * d + 4, d, 1};
  expect_error([&] { call(ov, TensorView(q.store.bytes.data(), DType::bf16, Device{}, 4, shape, odd_strides), kv, vv); },
               "multiple of 8");
  const int64_t shape3[3] = {16, 4, d}, strides3[3] = {4 * d, d, 1};
  expect_error([&] { call(ov, TensorView(q.store.bytes.data(), DType::bf16, Device{}, 3, shape3, strides3), kv, vv); },
               "attention: q must be [batch, seq, heads, head_dim], got [16, 4, 64]");
  expect_error([&] { call(ov, qv, kv, vv, std::nan("")); }, "scale");
  expect_error([&] { call(ov, qv, kv, vv, 0.0); }, "scale");
  expect_error([&] { call(qv, qv, kv, vv); }, "same tensor");
  Heads out_short(DType::bf16, 2, 7, 4, d);
  expect_error([&] { call(out_short.host(), qv, kv, vv); }, "out");
  Lse lse_bad({2, 4, 7});
  expect_error([&] { call(ov, qv, kv, vv, 0.125, lse_bad.cpu()); },
               "attention: lse must be float32 [batch, heads_q, seq_q] = [2, 4, 8], got [2, 4, 7]");
  // Nothing was written by any rejected call.
  for (int64_t i = 0; i < out.store.d; ++i) ASSERT_TRUE(std::isnan(out.store.get(0, i)));
  for (int64_t i = 0; i < lse_bad.host.d; ++i) ASSERT_TRUE(std::isnan(lse_bad.host.get(0, i)));

  // Varlen: cu_seqlens dtype, size, monotonicity, total and max_seqlen (checked on the CPU).
  Heads pq(DType::bf16, 1, 10, 2, d), pk(DType::bf16, 1, 10, 2, d), po(DType::bf16, 1, 10, 2, d);
  pq.randomize();
  pk.randomize();
  std::vector<int32_t> cu = {0, 4, 10};
  auto cu_view = [&](std::vector<int32_t>& c, DType dt = DType::i32) {
    const int64_t shape1[1] = {static_cast<int64_t>(c.size())}, strides1[1] = {1};
    return TensorView(c.data(), dt, Device{}, 1, shape1, strides1);
  };
  auto varlen = [&](std::vector<int32_t>& cq, int64_t max_q, DType dt = DType::i32) {
    attention_varlen(po.host(true), pq.host(true), pk.host(true), pk.host(true), cu_view(cq, dt), cu_view(cu), max_q,
                     10, true, 0.1);
  };
  std::vector<int32_t> down = {0, 6, 4}, short_total = {0, 4, 9}, nonzero = {2, 4, 10}, ok = cu, one = {0, 10};
  expect_error([&] { varlen(one, 10); }, "attention_varlen: cu_seqlens_k must be int32 [batch + 1] = [2], got [3]");
  expect_error([&] { varlen(down, 10); }, "decreases");
  expect_error([&] { varlen(short_total, 10); }, "must equal");
  expect_error([&] { varlen(nonzero, 10); }, "must be 0");
  expect_error([&] { varlen(ok, 5); }, "more than its max_seqlen");
  expect_error([&] { varlen(ok, 4); }, "cannot hold");
  expect_error([&] { varlen(ok, 10, DType::i64); }, "dtype");
  for (int64_t i = 0; i < po.store.d; ++i) ASSERT_TRUE(std::isnan(po.store.get(0, i)));
}

TEST(AttentionGpu, MixedDevicesAreRejected) {
  LLMK_REQUIRE_GPU();
  Heads q(DType::bf16, 1, 8, 2, 64), k(DType::bf16, 1, 8, 2, 64), out(DType::bf16, 1, 8, 2, 64);
  q.randomize();
  k.randomize();
  expect_error([&] { attention(out.gpu(), q.gpu(), k.host(), k.host(), false, 0.125); },
               "k is on cpu:0 but q is on cuda:0");
}

}  // namespace
}  // namespace llmk::test
