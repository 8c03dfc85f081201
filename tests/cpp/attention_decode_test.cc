// Decode attention (attention_decode) over a contiguous or paged KV cache:
// - the host float8 e4m3 conversions (exact decode, round-to-nearest-even with saturation);
// - the CPU reference against hand values, against the prefill reference (attention) over
//   the gathered cache, and with append + rotary against rope_ + writing the cache +
//   attention as separate steps (bitwise); the caller's contract and bad inputs, each a
//   clear error naming the argument, with nothing written;
// - the CUDA kernel against the CPU reference: random block tables (any page order, garbage
//   in the entries a sequence does not use), page sizes 1, 16, 48, 256 and a contiguous
//   cache, ragged lengths from 0 to 64k in one batch, GQA groups 1-16, q_len 1-16 causal and
//   not, head dims 64/96/128/256 (as LLMK_HEAD_DIMS builds them), fp16/bf16 with fp16/bf16
//   or fp8 caches, with and without the split-KV workspace, append with and without rotary
//   (the cache after the call too: appended rows as the reference wrote them, every other
//   byte unchanged; unused cache rows are NaN, so a kernel that reads one fails), lse,
//   NaN gaps of strided q/out views, the halves of one kv tensor as k and v, and a CUDA
//   graph replayed with new cache_seqlens (and new k_new) in the same device buffers.
//
// Tolerance (as attention_test.cc): the kernel rounds P to q's dtype before P V and the
// output once, each a relative error of at most u (2^-8 bf16, 2^-11 fp16), so an output is
// within u * (max|v| + |ref|) of the double reference. An fp8 cache holds values q's dtype
// represents exactly and its scales are applied in fp32, so the bound is the same with v
// dequantized. The Python tests add the FlashAttention rule (at most 2x PyTorch's error).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest-spi.h>

#include "llmk/attention_decode.h"
#include "test_util.h"

namespace llmk::test {
namespace {

using detail::HostF8E4M3;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

double eps_of(DType dt) { return dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }

float f8_value(uint8_t code) { return detail::to_float(HostF8E4M3{code}); }
uint8_t f8_code(float x) { return detail::from_float<HostF8E4M3>(x).bits; }

// ---------------------------------------------------------------------------------------
// Host e4m3 conversions.

TEST(HostF8E4M3, DecodesEveryCode) {
  EXPECT_EQ(f8_value(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8_value(0x80)) && f8_value(0x80) == 0.0f);
  EXPECT_EQ(f8_value(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(f8_value(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8_value(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(f8_value(0x38), 1.0f);
  EXPECT_EQ(f8_value(0x39), 1.125f);
  EXPECT_EQ(f8_value(0x7e), 448.0f);
  EXPECT_EQ(f8_value(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(f8_value(0x7f)));
  EXPECT_TRUE(std::isnan(f8_value(0xff)));
  // Every other code: (-1)^s 2^(e-7) (1 + m/8), subnormals 2^-6 m/8; increasing in the code.
  for (int code = 0; code < 0x7f; ++code) {
    const int e = code >> 3, m = code & 7;
    const float want = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
    EXPECT_EQ(f8_value(uint8_t(code)), want) << "code " << code;
    EXPECT_EQ(f8_value(uint8_t(code | 0x80)), -want) << "code " << (code | 0x80);
    if (code > 0) EXPECT_LT(f8_value(uint8_t(code - 1)), f8_value(uint8_t(code)));
  }
}

TEST(HostF8E4M3, EncodesRoundToNearestEvenWithSaturation) {
  for (int code = 0; code < 0x7f; ++code) {  // every value round-trips, both signs
    EXPECT_EQ(f8_code(f8_value(uint8_t(code))), code);
    EXPECT_EQ(f8_code(f8_value(uint8_t(code | 0x80))), code | 0x80);
  }
  for (int code = 0; code + 1 < 0x7f; ++code) {
    // Between two neighbours: below the midpoint the lower, above it the upper, at it the even code.
    const float lo = f8_value(uint8_t(code)), hi = f8_value(uint8_t(code + 1)), mid = (lo + hi) / 2;
    EXPECT_EQ(f8_code(std::nextafter(mid, lo)), code) << "just below the midpoint of " << lo << " and " << hi;
    EXPECT_EQ(f8_code(std::nextafter(mid, hi)), code + 1) << "just above the midpoint of " << lo << " and " << hi;
    EXPECT_EQ(f8_code(mid), code % 2 == 0 ? code : code + 1) << "midpoint of " << lo << " and " << hi;
    EXPECT_EQ(f8_code(-mid), (code % 2 == 0 ? code : code + 1) | 0x80);
  }
  EXPECT_EQ(f8_code(std::ldexp(1.0f, -10)), 0x00);       // half the smallest subnormal: ties to 0
  EXPECT_EQ(f8_code(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(f8_code(3 * std::ldexp(1.0f, -10)), 0x02);   // 1.5 subnormal steps: to 2 (even)
  EXPECT_EQ(f8_code(1e-30f), 0x00);
  EXPECT_EQ(f8_code(-1e-30f), 0x80);
  EXPECT_EQ(f8_code(std::numeric_limits<float>::denorm_min()), 0x00);
  // Saturation: everything past 448 (464 would tie to 480, which e4m3fn does not have) is 448.
  for (float big : {448.0f, 449.0f, 464.0f, 479.9f, 480.0f, 1e6f, 3e38f, kInf}) {
    EXPECT_EQ(f8_code(big), 0x7e) << big;
    EXPECT_EQ(f8_code(-big), 0xfe) << -big;
  }
  EXPECT_TRUE(std::isnan(f8_value(f8_code(kNaN))));
  EXPECT_TRUE(std::isnan(f8_value(f8_code(-kNaN))));
}

// ---------------------------------------------------------------------------------------
// Storage: raw host bytes of any llmk dtype (fp8 included) and their device copy.

struct Buf {
  DType dtype = DType::f32;
  int64_t n = 0;
  std::vector<unsigned char> bytes;
  void* dev = nullptr;

  Buf() = default;
  Buf(DType dt, int64_t count) : dtype(dt), n(count), bytes(size_t(std::max<int64_t>(count, 1) * dtype_size(dt))) {}
  Buf(const Buf& o) : dtype(o.dtype), n(o.n), bytes(o.bytes) {}  // the host bytes; no device copy
  Buf& operator=(const Buf& o) {
    drop_gpu();
    dtype = o.dtype;
    n = o.n;
    bytes = o.bytes;
    return *this;
  }
  ~Buf() { drop_gpu(); }

  int64_t elt() const { return dtype_size(dtype); }
  float get(int64_t i) const {
    const unsigned char* at = bytes.data() + i * elt();
    if (dtype == DType::f8e4m3) return f8_value(*at);
    if (dtype == DType::i32) return static_cast<float>(ints()[i]);
    return detail::dispatch_dtype(dtype, "test", [&](auto tag) {
      using T = detail::host_type_t<decltype(tag)>;
      T v;
      std::memcpy(&v, at, sizeof(T));
      return detail::to_float(v);
    });
  }
  void set(int64_t i, float value) {
    unsigned char* at = bytes.data() + i * elt();
    if (dtype == DType::f8e4m3) {
      *at = f8_code(value);
      return;
    }
    detail::dispatch_dtype(dtype, "test", [&](auto tag) {
      using T = detail::host_type_t<decltype(tag)>;
      const T v = detail::from_float<T>(value);
      std::memcpy(at, &v, sizeof(T));
    });
  }
  int32_t* ints() { return reinterpret_cast<int32_t*>(bytes.data()); }
  const int32_t* ints() const { return reinterpret_cast<const int32_t*>(bytes.data()); }
  void fill(float value) {
    for (int64_t i = 0; i < n; ++i) set(i, value);
  }
  void* gpu() {
    if (!dev) {
      EXPECT_EQ(cudaMalloc(&dev, bytes.size()), cudaSuccess);
      upload();
    }
    return dev;
  }
  void upload() { EXPECT_EQ(cudaMemcpy(dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess); }
  void drop_gpu() {
    if (dev) cudaFree(dev);
    dev = nullptr;
  }
  Buf download() const {
    Buf h(*this);
    EXPECT_EQ(cudaMemcpy(h.bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  TensorView view(bool on_gpu, std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset = 0) {
    unsigned char* base = on_gpu ? static_cast<unsigned char*>(gpu()) : bytes.data();
    return TensorView(base + offset * elt(), dtype, Device{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0},
                      static_cast<int>(shape.size()), shape.data(), strides.data());
  }
};

// ---------------------------------------------------------------------------------------
// One decode call: its shapes, its inputs and where everything lives.

struct Case {
  DType dt = DType::bf16;
  bool fp8 = false;  // float8 e4m3 cache with per-head scales
  int q_len = 1, heads_q = 4, heads_kv = 2, dim = 64;
  std::vector<int> lens;  // cache_seqlens, one per sequence
  int page_size = 16;     // 0: a contiguous cache
  bool causal = true;
  bool append = false;
  int rot_dim = 0;  // append with rotary: the cos/sin cache's width (0: no rotary)
  bool gptj = false;
  int kv_layout = 0;    // 0: k and v separate; 1: the halves of one [pages, 2, page_size, heads_kv, dim] tensor
  int extra_heads = 1;  // q and out are the last heads of rows this much wider (NaN gaps)
  std::vector<int> fill;  // rows holding data per sequence (default lens); the graph test replays longer lens
  double scale = 0.0;     // 0: 1 / sqrt(dim)

  std::string describe() const {
    std::ostringstream m;
    m << dtype_name(dt) << (fp8 ? " fp8 cache" : "") << " q_len " << q_len << " heads " << heads_q << "/" << heads_kv
      << " dim " << dim << (page_size ? " page " + std::to_string(page_size) : std::string(" contiguous"))
      << (causal ? " causal" : "") << (append ? " append" : "")
      << (rot_dim ? std::string(gptj ? " gptj" : " neox") + " rotary " + std::to_string(rot_dim) : "")
      << (kv_layout ? " kv halves of one tensor" : "") << " lens";
    for (int n : lens) m << " " << n;
    return m.str();
  }
};

struct Problem {
  Case c;
  int batch = 0, rows = 0, max_pages = 1, num_pages = 0, max_pos = 0;
  std::vector<int> need;  // keys per sequence after the call
  int64_t heads_wide = 0;  // q / out heads per row, the view's plus the gap
  int64_t page_stride = 0, v_offset = 0;
  double scale = 0;
  Buf q, out, kv_new, lse, seqlens, table, scales, cos_sin, cache;

  explicit Problem(const Case& cs) : c(cs) {
    batch = static_cast<int>(c.lens.size());
    if (c.fill.empty()) c.fill = c.lens;
    const int H = c.heads_kv, D = c.dim;
    need.resize(batch);
    int most = 1;
    for (int b = 0; b < batch; ++b) {
      need[b] = std::max(c.fill[b], c.lens[b] + (c.append ? c.q_len : 0));
      most = std::max(most, need[b]);
    }
    scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(D));
    // The cache: pages in a random order, 2 spare pages; each table row one spare entry of garbage.
    std::vector<int> pages_of(batch);
    if (c.page_size > 0) {
      rows = c.page_size;
      for (int b = 0; b < batch; ++b) {
        pages_of[b] = (need[b] + rows - 1) / rows;
        max_pages = std::max(max_pages, pages_of[b] + 1);
        num_pages += pages_of[b];
      }
      num_pages += 2;
    } else {
      rows = most + 3;
      num_pages = batch;
    }
    page_stride = (c.kv_layout == 1 ? 2 : 1) * int64_t{rows} * H * D;
    v_offset = c.kv_layout == 1 ? int64_t{rows} * H * D : int64_t{num_pages} * rows * H * D;
    cache = Buf(c.fp8 ? DType::f8e4m3 : c.dt, 2 * int64_t{num_pages} * rows * H * D);
    cache.fill(kNaN);
    table = Buf(DType::i32, int64_t{batch} * max_pages);
    if (c.page_size > 0) {
      std::vector<int> order(num_pages);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng());
      const int garbage[] = {-1, num_pages, 1 << 30, -(1 << 30)};
      int next = 0;
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < max_pages; ++j)
          table.ints()[b * max_pages + j] = j < pages_of[b] ? order[next++] : garbage[(b + j) % 4];
    }
    scales = Buf(DType::f32, 2 * H);
    std::uniform_real_distribution<float> scale_dist(0.3f, 1.2f);
    for (int i = 0; i < 2 * H; ++i) scales.set(i, scale_dist(rng()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < c.fill[b]; ++t)
        for (int which = 0; which < 2; ++which)
          for (int h = 0; h < H; ++h)
            for (int col = 0; col < D; ++col) cache.set(cache_index(which, b, t, h, col), (c.fp8 ? 1.5f : 1.0f) * normal(rng()));
    seqlens = Buf(DType::i32, batch);
    for (int b = 0; b < batch; ++b) seqlens.ints()[b] = c.lens[b];

    heads_wide = c.heads_q + c.extra_heads;
    q = Buf(c.dt, int64_t{batch} * c.q_len * heads_wide * D);
    q.fill(kNaN);
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < c.q_len; ++i)
        for (int h = 0; h < c.heads_q; ++h)
          for (int col = 0; col < D; ++col) q.set(token_index(b, i, h, col), normal(rng()));
    out = Buf(c.dt, q.n);
    out.fill(kNaN);
    kv_new = Buf(c.dt, int64_t{batch} * c.q_len * 2 * H * D);  // k_new heads, then v_new heads, per token
    for (int64_t i = 0; i < kv_new.n; ++i) kv_new.set(i, normal(rng()));
    lse = Buf(DType::f32, int64_t{batch} * c.heads_q * c.q_len);
    lse.fill(kNaN);
    max_pos = most + 2;
    const int rot = std::max(c.rot_dim, 2);
    cos_sin = Buf(DType::f32, int64_t{max_pos} * rot);
    for (int pos = 0; pos < max_pos; ++pos)
      for (int i = 0; i < rot / 2; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / rot);
        cos_sin.set(int64_t{pos} * rot + i, static_cast<float>(std::cos(angle)));
        cos_sin.set(int64_t{pos} * rot + rot / 2 + i, static_cast<float>(std::sin(angle)));
      }
  }

  // The element of head h, column col of token t of sequence b in the K (which 0) or V cache.
  int64_t cache_index(int which, int b, int t, int h, int col) const {
    int64_t page = b, row = t;
    if (c.page_size > 0) {
      page = table.ints()[b * max_pages + t / rows];
      row = t % rows;
    }
    return which * v_offset + page * page_stride + row * int64_t{c.heads_kv} * c.dim + int64_t{h} * c.dim + col;
  }
  int64_t token_index(int b, int i, int h, int col) const {
    return ((int64_t{b} * c.q_len + i) * heads_wide + c.extra_heads + h) * c.dim + col;
  }

  // Views (on the host or the GPU) of the call's tensors.
  TensorView q_view(Buf& t, bool gpu) {
    const int64_t D = c.dim;
    return t.view(gpu, {batch, c.q_len, c.heads_q, D}, {c.q_len * heads_wide * D, heads_wide * D, D, 1}, c.extra_heads * D);
  }
  TensorView cache_view(Buf& t, bool gpu, int which) {
    const int64_t H = c.heads_kv, D = c.dim;
    const int64_t first = c.page_size > 0 ? num_pages : batch;
    return t.view(gpu, {first, rows, H, D}, {page_stride, H * D, D, 1}, which * v_offset);
  }
  TensorView new_view(bool gpu, int which) {
    const int64_t H = c.heads_kv, D = c.dim;
    return kv_new.view(gpu, {batch, c.q_len, H, D}, {c.q_len * 2 * H * D, 2 * H * D, D, 1}, which * H * D);
  }
  DecodeCache decode_cache(Buf& cache_buf, bool gpu) {
    DecodeCache dc{cache_view(cache_buf, gpu, 0), cache_view(cache_buf, gpu, 1), std::nullopt, std::nullopt,
                   std::nullopt};
    if (c.page_size > 0) dc.block_table = table.view(gpu, {batch, max_pages}, {max_pages, 1});
    if (c.fp8) {
      dc.k_scale = scales.view(gpu, {c.heads_kv}, {1}, 0);
      dc.v_scale = scales.view(gpu, {c.heads_kv}, {1}, c.heads_kv);
    }
    return dc;
  }
  std::optional<DecodeAppend> decode_append(bool gpu) {
    if (!c.append) return std::nullopt;
    DecodeAppend a{new_view(gpu, 0), new_view(gpu, 1), std::nullopt, c.gptj ? RopeStyle::gptj : RopeStyle::neox};
    if (c.rot_dim > 0) a.rotary_cos_sin = cos_sin.view(gpu, {max_pos, c.rot_dim}, {c.rot_dim, 1});
    return a;
  }

  float k_scale(int h) const { return scales.get(h); }
  float v_scale(int h) const { return scales.get(c.heads_kv + h); }
};

// What a call writes: out, lse and the cache (which starts as the problem's).
struct Outputs {
  Buf out, lse, cache;
  explicit Outputs(const Problem& p) : out(p.out), lse(p.lse), cache(p.cache) {}
  // The device copies (a buffer the call never saw, as lse when not asked for, keeps its host bytes).
  Outputs download() const {
    Outputs r = *this;
    for (auto [dst, src] : {std::pair<Buf*, const Buf*>{&r.out, &out}, {&r.lse, &lse}, {&r.cache, &cache}})
      if (src->dev) *dst = src->download();
    return r;
  }
};

void call(Problem& p, Outputs& r, bool gpu, bool with_lse, std::optional<TensorView> workspace = std::nullopt,
          cudaStream_t stream = nullptr) {
  attention_decode(p.q_view(r.out, gpu), p.q_view(p.q, gpu), p.decode_cache(r.cache, gpu),
                   p.seqlens.view(gpu, {p.batch}, {1}), p.decode_append(gpu), p.c.causal, p.scale,
                   with_lse ? std::optional<TensorView>(r.lse.view(gpu, {p.batch, p.c.heads_q, p.c.q_len},
                                                                   {int64_t{p.c.heads_q} * p.c.q_len, p.c.q_len, 1}))
                            : std::nullopt,
                   workspace, stream);
}

Outputs reference(Problem& p) {
  Outputs ref(p);
  call(p, ref, false, true);
  return ref;
}

// Keys query token i of sequence b sees (the call's contract holds in every test).
int visible(const Problem& p, int b, int i) {
  const int seqlen_k = p.c.lens[b] + (p.c.append ? p.c.q_len : 0);
  if (!p.c.causal) return seqlen_k;
  return std::clamp(i + 1 + seqlen_k - p.c.q_len, 0, seqlen_k);
}

// The appended elements of the cache (true) among all of its elements.
std::vector<bool> appended(const Problem& p) {
  std::vector<bool> mask(p.cache.n, false);
  for (int b = 0; p.c.append && b < p.batch; ++b)
    for (int i = 0; i < p.c.q_len; ++i)
      for (int which = 0; which < 2; ++which)
        for (int h = 0; h < p.c.heads_kv; ++h)
          for (int col = 0; col < p.c.dim; ++col) mask[p.cache_index(which, b, p.c.lens[b] + i, h, col)] = true;
  return mask;
}

// max |v| (dequantized) over the values the call's queries may see.
double max_abs_v(const Problem& p, const Buf& cache) {
  double m = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int t = 0; t < p.c.lens[b] + (p.c.append ? p.c.q_len : 0); ++t)
      for (int h = 0; h < p.c.heads_kv; ++h)
        for (int col = 0; col < p.c.dim; ++col)
          m = std::max(m, std::fabs(double(cache.get(p.cache_index(1, b, t, h, col))) * (p.c.fp8 ? p.v_scale(h) : 1.0)));
  return m;
}

// The GPU call's outputs against the reference's; the cache against the problem's original
// outside the appended rows, byte for byte.
void expect_matches(const Problem& p, const Outputs& got, const Outputs& ref, bool with_lse) {
  const double u = eps_of(p.c.dt), max_v = max_abs_v(p, ref.cache);
  std::vector<bool> in_view(got.out.n, false);
  int64_t bad = 0, nonzero = 0;
  double worst = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.c.q_len; ++i)
      for (int h = 0; h < p.c.heads_q; ++h)
        for (int col = 0; col < p.c.dim; ++col) {
          const int64_t at = p.token_index(b, i, h, col);
          in_view[at] = true;
          const double g = got.out.get(at), r = ref.out.get(at), err = std::fabs(g - r);
          worst = std::max(worst, err);
          if (visible(p, b, i) == 0) {
            nonzero += g != 0.0;
          } else if (!(err <= u * (max_v + std::fabs(r)))) {
            if (bad++ < 5)
              ADD_FAILURE() << "out[" << b << ", " << i << ", " << h << ", " << col << "] = " << g << ", reference " << r
                            << " (sequence of " << p.c.lens[b] << " cached keys)";
          }
        }
  EXPECT_EQ(bad, 0) << "out: max abs error " << worst << ", bound u * (max|v| + |ref|) with max|v| " << max_v;
  EXPECT_EQ(nonzero, 0) << "out: queries that see no key are not exactly 0";
  int64_t stray = 0;
  for (int64_t i = 0; i < got.out.n; ++i) stray += !in_view[i] && !std::isnan(got.out.get(i));
  EXPECT_EQ(stray, 0) << "out: elements outside the view were written";

  if (with_lse) {
    const float atol = p.c.rot_dim > 0 ? 2e-3f : 1e-4f;  // rotary: q may round differently (fp32 vs double) by an ulp
    int64_t bad_lse = 0;
    for (int64_t i = 0; i < ref.lse.n; ++i) {
      const float g = got.lse.get(i), r = ref.lse.get(i);
      const bool ok = std::isinf(r) ? g == r : std::fabs(g - r) <= atol + 1e-5f * std::fabs(r);
      if (!ok && bad_lse++ < 5) ADD_FAILURE() << "lse[" << i << "] = " << g << ", reference " << r;
    }
    EXPECT_EQ(bad_lse, 0);
  } else {
    int64_t written = 0;
    for (int64_t i = 0; i < got.lse.n; ++i) written += !std::isnan(got.lse.get(i));
    EXPECT_EQ(written, 0) << "lse was written without being asked for";
  }

  // The cache: appended elements as the reference wrote them (exactly, or within a rounding
  // of the rotation: the kernel rotates in fp32, the reference in double), the rest unchanged.
  const std::vector<bool> mask = appended(p);
  const int64_t elt = p.cache.elt(), H = p.c.heads_kv, D = p.c.dim;
  double max_new = 0;
  for (int64_t i = 0; i < p.kv_new.n; ++i) max_new = std::max(max_new, std::fabs(double(p.kv_new.get(i))));
  int64_t changed = 0, bad_new = 0;
  for (int64_t i = 0; i < p.cache.n; ++i) {
    const bool same = std::memcmp(got.cache.bytes.data() + i * elt, ref.cache.bytes.data() + i * elt, elt) == 0;
    if (!mask[i]) {
      changed += std::memcmp(got.cache.bytes.data() + i * elt, p.cache.bytes.data() + i * elt, elt) != 0;
      continue;
    }
    if (same) continue;
    const int64_t within = (i % p.page_stride) - (p.c.kv_layout == 1 && (i % p.page_stride) >= p.v_offset ? p.v_offset : 0);
    const bool is_k = p.c.kv_layout == 1 ? (i % p.page_stride) < p.v_offset : i < p.v_offset;
    const int col = static_cast<int>(within % D);
    const double g = got.cache.get(i), r = ref.cache.get(i);
    bool ok = false;
    if (is_k && col < p.c.rot_dim) {
      ok = p.c.fp8 ? std::fabs(g - r) <= 0.125 * std::fabs(r) + std::ldexp(1.0, -9) * 1.001
                   : std::fabs(g - r) <= 2 * eps_of(p.c.dt) * std::fabs(r) + 1e-5 * max_new;
    }
    if (!ok && bad_new++ < 5)
      ADD_FAILURE() << (is_k ? "k" : "v") << "_cache appended element " << i << " (head " << (within / D) % H
                    << ", col " << col << ") = " << g << ", reference " << r;
  }
  EXPECT_EQ(bad_new, 0) << "appended cache rows differ from the reference";
  EXPECT_EQ(changed, 0) << "cache elements outside the appended rows changed";
}

bool head_dim_runs(int dim) { return attention_head_dim_compiled(dim); }

// The head dim `want` if this build has its kernel, else one it has.
int dim_or_compiled(int want) {
  if (head_dim_runs(want)) return want;
  for (int d : {64, 128, 256, 96})
    if (head_dim_runs(d)) return d;
  return want;
}

void note_once(const std::string& msg) {
  static std::vector<std::string> seen;
  if (std::find(seen.begin(), seen.end(), msg) != seen.end()) return;
  seen.push_back(msg);
  std::printf("[ note ] %s\n", msg.c_str());
}

// LLMK_DECODE_MERGE for a scope: "kernel" merges the splits with the merge kernel over the
// workspace even where a cluster could, "cluster" in a cluster even where the merge kernel
// would (capped at 8 pieces); nullptr: the launcher's choice. The previous value comes back.
struct MergeScope {
  explicit MergeScope(const char* merge) {
    if (const char* old = std::getenv("LLMK_DECODE_MERGE")) previous_ = old;
    if (merge != nullptr) setenv("LLMK_DECODE_MERGE", merge, 1);
    else unsetenv("LLMK_DECODE_MERGE");
  }
  ~MergeScope() {
    if (previous_) setenv("LLMK_DECODE_MERGE", previous_->c_str(), 1);
    else unsetenv("LLMK_DECODE_MERGE");
  }
  std::optional<std::string> previous_;
};

// Device 0 runs sm_90 machine code of this build (where the cluster merge is compiled in).
bool has_clusters() {
  if (device_info(0).cc_major < 9) return false;
  std::stringstream archs(build_cuda_archs());
  for (std::string arch; std::getline(archs, arch, ';');)
    if (std::atoi(arch.c_str()) >= 90) return true;
  return false;
}

// The CPU reference, then the GPU kernel with and without the split-KV workspace (and lse):
// without one, up to 8 splits merge in a thread-block cluster (sm_90) or the call runs one;
// with one, 2-8 splits merge in a cluster and more by the merge kernel; the last two variants
// force the merge kernel, and (sm_90) the cluster with at most 8 splits, for every shape.
// `expect_split`: the shapes must make the call run split (a workspace size > 0).
void check_gpu(const Case& cs, bool expect_split = false) {
  SCOPED_TRACE(cs.describe());
  if (!head_dim_runs(cs.dim)) {
    note_once("head_dim " + std::to_string(cs.dim) + " is not in this build's LLMK_HEAD_DIMS: its GPU cases skipped");
    return;
  }
  Problem p(cs);
  const Outputs ref = reference(p);
  const int64_t ws_size =
      attention_decode_workspace_size(p.q_view(p.q, true), p.decode_cache(p.cache, true), 0);
  ASSERT_GE(ws_size, 0);
  if (expect_split) EXPECT_GT(ws_size, 0) << "these shapes should run split-KV";
  struct Variant {
    bool workspace, lse;
    const char* merge;
  };
  for (const Variant v : {Variant{false, true, nullptr}, Variant{true, true, nullptr}, Variant{true, false, nullptr},
                          Variant{true, true, "kernel"}, Variant{true, true, "cluster"}}) {
    if (v.workspace && ws_size == 0 && (v.lse || v.merge)) continue;  // the first call again
    if (v.merge && std::string(v.merge) == "cluster" && !has_clusters()) continue;
    SCOPED_TRACE(testing::Message() << (v.workspace ? "with a workspace of " + std::to_string(ws_size) + " floats"
                                                    : std::string("without a workspace"))
                                    << (v.lse ? ", lse" : ", no lse") << (v.merge ? std::string(", merge ") + v.merge : ""));
    const MergeScope merge(v.merge);
    Outputs run(p);
    Buf ws(DType::f32, std::max<int64_t>(ws_size, 1));
    ws.fill(kNaN);
    std::optional<TensorView> wv;
    if (v.workspace) wv = ws.view(true, {ws_size}, {1});
    call(p, run, true, v.lse, wv);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches(p, run.download(), ref, v.lse);
  }
}

// ---------------------------------------------------------------------------------------
// CPU reference.

// Equal keys: every score the same, out = the mean of the visible v rows, lse = s + log(n);
// a sequence without keys gives 0 and -inf; contiguous and paged caches.
TEST(AttentionDecodeCpu, MatchesHandValues) {
  for (int page : {0, 2}) {
    Case cs;
    cs.heads_q = cs.heads_kv = 1;
    cs.q_len = 2;
    cs.lens = {5, 0};
    cs.page_size = page;
    cs.scale = 0.5;
    Problem p(cs);
    for (int t = 0; t < 5; ++t)
      for (int col = 0; col < cs.dim; ++col) p.cache.set(p.cache_index(0, 0, t, 0, col), col == 0 ? 1.0f : 0.0f);
    const Outputs r = reference(p);
    for (int i = 0; i < 2; ++i) {
      const int n = 4 + i;  // causal, bottom-right: token 0 sees keys 0..3, token 1 all 5
      for (int col = 0; col < cs.dim; ++col) {
        double mean = 0;
        for (int t = 0; t < n; ++t) mean += p.cache.get(p.cache_index(1, 0, t, 0, col));
        mean /= n;
        EXPECT_NEAR(r.out.get(p.token_index(0, i, 0, col)), mean, 1e-2 * (1 + std::fabs(mean)));
        EXPECT_EQ(r.out.get(p.token_index(1, i, 0, col)), 0.0f);
      }
      EXPECT_NEAR(r.lse.get(i), 0.5 * p.q.get(p.token_index(0, i, 0, 0)) + std::log(double(n)), 1e-5);
      EXPECT_EQ(r.lse.get(2 + i), -kInf);
    }
  }
}

// The decode reference over a paged cache (pages in random order) equals the prefill
// reference (attention) over each sequence's keys gathered into contiguous k and v, bit for
// bit; an fp8 cache with power-of-two scales equals attention over its dequantized values
// (exact in bf16).
TEST(AttentionDecodeCpu, MatchesPrefillReferenceOverGatheredKeys) {
  for (bool fp8 : {false, true})
    for (DType dt : {DType::f16, DType::bf16})
      for (bool causal : {false, true}) {
        Case cs;
        cs.dt = dt;
        cs.fp8 = fp8;
        cs.q_len = 3;
        cs.heads_q = 6;
        cs.heads_kv = 2;
        cs.lens = {37, 2, 0, 64};
        cs.page_size = 7;
        cs.causal = causal;
        SCOPED_TRACE(cs.describe());
        Problem p(cs);
        for (int i = 0; i < 2 * cs.heads_kv; ++i) p.scales.set(i, i % 2 ? 0.5f : 2.0f);
        const Outputs r = reference(p);
        const int64_t D = cs.dim, H = cs.heads_kv, Hq = cs.heads_q;
        for (int b = 0; b < p.batch; ++b) {
          const int n = cs.lens[b];
          Buf k(dt, std::max(n, 1) * H * D), v(dt, std::max(n, 1) * H * D), q(dt, cs.q_len * Hq * D),
              out(dt, cs.q_len * Hq * D), lse(DType::f32, Hq * cs.q_len);
          for (int t = 0; t < n; ++t)
            for (int h = 0; h < H; ++h)
              for (int col = 0; col < D; ++col) {
                const float ks = fp8 ? p.k_scale(h) : 1.0f, vs = fp8 ? p.v_scale(h) : 1.0f;
                k.set((t * H + h) * D + col, p.cache.get(p.cache_index(0, b, t, h, col)) * ks);
                v.set((t * H + h) * D + col, p.cache.get(p.cache_index(1, b, t, h, col)) * vs);
              }
          for (int i = 0; i < cs.q_len; ++i)
            for (int h = 0; h < Hq; ++h)
              for (int col = 0; col < D; ++col) q.set((i * Hq + h) * D + col, p.q.get(p.token_index(b, i, h, col)));
          attention(out.view(false, {1, cs.q_len, Hq, D}, {cs.q_len * Hq * D, Hq * D, D, 1}),
                    q.view(false, {1, cs.q_len, Hq, D}, {cs.q_len * Hq * D, Hq * D, D, 1}),
                    k.view(false, {1, n, H, D}, {n * H * D, H * D, D, 1}), v.view(false, {1, n, H, D}, {n * H * D, H * D, D, 1}),
                    causal, p.scale, lse.view(false, {1, Hq, cs.q_len}, {Hq * cs.q_len, cs.q_len, 1}));
          for (int i = 0; i < cs.q_len; ++i)
            for (int h = 0; h < Hq; ++h) {
              for (int col = 0; col < D; ++col)
                ASSERT_EQ(r.out.get(p.token_index(b, i, h, col)), out.get((i * Hq + h) * D + col))
                    << "sequence " << b << " token " << i << " head " << h << " col " << col;
              ASSERT_EQ(r.lse.get((b * Hq + h) * cs.q_len + i), lse.get(h * cs.q_len + i));
            }
        }
      }
}

// Append + rotary in one call equals the three steps done separately: rope_ on copies of q
// and k_new at positions cache_seqlens + i, writing k_new / v_new into the cache (quantized
// as x / scale for fp8), and the decode attention over cache_seqlens + q_len keys without
// append. out, lse and the whole cache agree bit for bit; q and k_new are not modified.
TEST(AttentionDecodeCpu, AppendWithRotaryEqualsSeparateSteps) {
  struct Rot {
    int rot_dim;
    bool gptj;
  };
  for (bool fp8 : {false, true})
    for (DType dt : {DType::f16, DType::bf16})
      for (const Rot rot : {Rot{0, false}, Rot{64, false}, Rot{32, true}, Rot{16, false}})
        for (int page : {0, 5}) {
          Case cs;
          cs.dt = dt;
          cs.fp8 = fp8;
          cs.q_len = 3;
          cs.heads_q = 4;
          cs.heads_kv = 2;
          cs.lens = {0, 9, 21};
          cs.page_size = page;
          cs.append = true;
          cs.rot_dim = rot.rot_dim;
          cs.gptj = rot.gptj;
          SCOPED_TRACE(cs.describe());
          Problem p(cs);
          const Buf q_before = p.q, new_before = p.kv_new;
          const Outputs fused = reference(p);
          EXPECT_EQ(p.q.bytes, q_before.bytes) << "q was modified";
          EXPECT_EQ(p.kv_new.bytes, new_before.bytes) << "k_new / v_new were modified";

          // The steps: rotate copies, write the cache, attend without append.
          Problem steps = p;
          if (cs.rot_dim > 0) {
            Buf positions(DType::i32, p.batch * cs.q_len);
            for (int b = 0; b < p.batch; ++b)
              for (int i = 0; i < cs.q_len; ++i) positions.ints()[b * cs.q_len + i] = cs.lens[b] + i;
            rope_(steps.q_view(steps.q, false), steps.new_view(false, 0),
                  positions.view(false, {p.batch, cs.q_len}, {cs.q_len, 1}),
                  steps.cos_sin.view(false, {p.max_pos, cs.rot_dim}, {cs.rot_dim, 1}),
                  cs.gptj ? RopeStyle::gptj : RopeStyle::neox);
          }
          for (int b = 0; b < p.batch; ++b)
            for (int i = 0; i < cs.q_len; ++i)
              for (int which = 0; which < 2; ++which)
                for (int h = 0; h < cs.heads_kv; ++h)
                  for (int col = 0; col < cs.dim; ++col) {
                    const int64_t src = ((int64_t{b} * cs.q_len + i) * 2 * cs.heads_kv + which * cs.heads_kv + h) * cs.dim + col;
                    const int64_t dst = steps.cache_index(which, b, cs.lens[b] + i, h, col);
                    const float x = steps.kv_new.get(src);
                    if (fp8) steps.cache.bytes[dst] = f8_code(x / (which ? p.v_scale(h) : p.k_scale(h)));
                    else steps.cache.set(dst, x);
                  }
          steps.c.append = false;
          for (int b = 0; b < p.batch; ++b) steps.seqlens.ints()[b] = cs.lens[b] + cs.q_len;
          Outputs separate(steps);
          call(steps, separate, false, true);
          EXPECT_EQ(fused.out.bytes, separate.out.bytes) << "out";
          EXPECT_EQ(fused.lse.bytes, separate.lse.bytes) << "lse";
          EXPECT_EQ(fused.cache.bytes, steps.cache.bytes) << "cache";
          // Outside the appended rows the reference left the cache as it was.
          const std::vector<bool> mask = appended(p);
          int64_t changed = 0;
          for (int64_t i = 0; i < p.cache.n; ++i)
            changed += !mask[i] && std::memcmp(&fused.cache.bytes[i * p.cache.elt()], &p.cache.bytes[i * p.cache.elt()],
                                               p.cache.elt()) != 0;
          EXPECT_EQ(changed, 0);
        }
}

// Without causal every q token sees every key; q_len larger than the keys in causal mode
// leaves the first tokens without any (0, lse -inf).
TEST(AttentionDecodeCpu, CausalAlignsBottomRight) {
  Case cs;
  cs.q_len = 4;
  cs.lens = {2, 4};
  cs.page_size = 3;
  Problem p(cs);
  const Outputs causal = reference(p);
  p.c.causal = false;
  const Outputs full = reference(p);
  for (int h = 0; h < cs.heads_q; ++h) {
    // Sequence 0 (2 keys): token i sees i - 1 keys; sequence 1 (4 keys): i + 1.
    EXPECT_EQ(causal.lse.get((0 * cs.heads_q + h) * 4 + 0), -kInf);
    EXPECT_EQ(causal.lse.get((0 * cs.heads_q + h) * 4 + 1), -kInf);
    EXPECT_TRUE(std::isfinite(causal.lse.get((0 * cs.heads_q + h) * 4 + 2)));
    EXPECT_EQ(causal.lse.get((0 * cs.heads_q + h) * 4 + 3), full.lse.get((0 * cs.heads_q + h) * 4 + 3));
    EXPECT_EQ(causal.lse.get((1 * cs.heads_q + h) * 4 + 3), full.lse.get((1 * cs.heads_q + h) * 4 + 3));
    EXPECT_LT(causal.lse.get((1 * cs.heads_q + h) * 4 + 0), full.lse.get((1 * cs.heads_q + h) * 4 + 0) + 1e-6f);
    for (int col = 0; col < cs.dim; ++col) EXPECT_EQ(causal.out.get(p.token_index(0, 0, h, col)), 0.0f);
  }
}

// ---------------------------------------------------------------------------------------
// The contract (checked on the host) and bad inputs: each a clear error, nothing written.

void expect_untouched(const Problem& p, const Outputs& r) {
  for (int64_t i = 0; i < r.out.n; ++i) ASSERT_TRUE(std::isnan(r.out.get(i))) << "out element " << i << " was written";
  for (int64_t i = 0; i < r.lse.n; ++i) ASSERT_TRUE(std::isnan(r.lse.get(i))) << "lse element " << i << " was written";
  EXPECT_EQ(r.cache.bytes, p.cache.bytes) << "the cache was written";
}

TEST(AttentionDecodeCpu, ContractIsChecked) {
  Case cs;
  cs.lens = {5, 40, 0};
  cs.page_size = 16;
  cs.append = true;
  cs.q_len = 2;
  cs.rot_dim = 32;
  Problem p(cs);
  auto try_call = [&](const std::string& needle) {
    Outputs r(p);
    expect_error([&] { call(p, r, false, true); }, needle);
    expect_untouched(p, r);
  };
  {
    Outputs ok(p);
    call(p, ok, false, true);  // the problem as built honours the contract
  }
  p.seqlens.ints()[1] = -3;
  try_call("attention_decode: cache_seqlens[1] = -3 is negative");
  // Capacity: max_pages x page_size. Sequence 1 has 3 pages of 16 + a spare entry (4 x 16 = 64).
  ASSERT_EQ(p.max_pages, 4);
  p.seqlens.ints()[1] = 63;
  try_call("attention_decode: cache_seqlens[1] = 63 + q_len 2 keys exceed the paged cache's capacity of 64 keys "
           "per sequence (max_pages 4 x page_size 16)");
  // Sequence 1 uses 3 pages (42 keys): its spare entry (garbage) is not read, a bad used one is.
  p.seqlens.ints()[1] = 40;
  const int saved = p.table.ints()[1 * 4 + 2];
  p.table.ints()[1 * 4 + 2] = p.num_pages;
  try_call("attention_decode: block_table[1][2] = " + std::to_string(p.num_pages) + " is outside the cache's " +
           std::to_string(p.num_pages) + " pages (sequence 1 holds 42 keys in its first 3 pages)");
  p.table.ints()[1 * 4 + 2] = -1;
  try_call("block_table[1][2] = -1 is outside");
  p.table.ints()[1 * 4 + 2] = saved;
  // Rotary positions: cache_seqlens + i < max_pos (max_pos = 42 + 2 here); 45 keys fit sequence 1's pages.
  p.seqlens.ints()[1] = 43;
  try_call("attention_decode: rotary position 44 (cache_seqlens[1] + 1) is outside rotary_cos_sin's 44 rows");
  // Without append the keys are cache_seqlens alone: 48 fill sequence 1's three pages, 49 would
  // need its fourth entry (garbage).
  p.c.append = false;
  p.seqlens.ints()[1] = 48;
  {
    Outputs ok(p);
    call(p, ok, false, true);
  }
  p.seqlens.ints()[1] = 49;
  try_call("attention_decode: block_table[1][3] = ");

  // A contiguous cache: cache_seqlens (+ q_len) <= max_len.
  Case flat = cs;
  flat.page_size = 0;
  Problem f(flat);
  f.seqlens.ints()[2] = f.rows - 1;
  Outputs r(f);
  expect_error([&] { call(f, r, false, true); }, "attention_decode: cache_seqlens[2] = " + std::to_string(f.rows - 1) +
                                                     " + q_len 2 keys exceed the cache's max_len " + std::to_string(f.rows));
  expect_untouched(f, r);
}

TEST(AttentionDecodeCpu, BadInputsAreRejected) {
  Case cs;
  cs.lens = {3, 17};
  cs.heads_q = 4;
  cs.heads_kv = 2;
  cs.append = true;
  cs.rot_dim = 64;
  Problem p(cs);
  const int64_t D = cs.dim;
  Outputs r(p);
  auto cache = [&] { return p.decode_cache(r.cache, false); };
  auto app = [&] { return p.decode_append(false); };
  const TensorView q = p.q_view(p.q, false), out = p.q_view(r.out, false), lens = p.seqlens.view(false, {2}, {1});
  const TensorView lse = r.lse.view(false, {2, 4, 1}, {4, 1, 1});
  auto run = [&](const TensorView& o, const TensorView& qq, const DecodeCache& c, const TensorView& sl,
                 const std::optional<DecodeAppend>& a, double scale = 0.125,
                 const std::optional<TensorView>& l = std::nullopt, const std::optional<TensorView>& ws = std::nullopt) {
    attention_decode(o, qq, c, sl, a, true, scale, l, ws);
  };
  run(out, q, cache(), lens, app(), 0.125, lse);  // the valid call, then each argument broken in turn
  r.out.fill(kNaN);
  r.lse.fill(kNaN);
  std::copy(p.cache.bytes.begin(), p.cache.bytes.end(), r.cache.bytes.begin());

  // q and out.
  Buf f32(DType::f32, 2 * 1 * 5 * D), b64(DType::bf16, 2 * 1 * 4 * 32), f16(DType::f16, p.q.n), wide(DType::bf16, 2 * 1 * 4 * D * 2);
  expect_error([&] { run(out, f32.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D, 1}), cache(), lens, app()); },
               "attention_decode: q must be float16 or bfloat16, got float32");
  expect_error([&] { run(out, b64.view(false, {2, 1, 4, 32}, {128, 128, 32, 1}), cache(), lens, app()); },
               "attention_decode: q has head_dim 32; supported head dims are 64, 96, 128 and 256");
  expect_error([&] { run(out, p.q.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D, 2}, D), cache(), lens, app()); },
               "attention_decode: q must be contiguous in its last (head_dim) dim, got stride 2");
  expect_error([&] { run(out, p.q.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D, 1}, D + 4), cache(), lens, app()); },
               "attention_decode: q data pointer");
  expect_error([&] { run(out, p.q.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D + 4, 1}, D), cache(), lens, app()); },
               "attention_decode: q stride 68 of dim 2 must be a non-negative multiple of 8 elements");
  expect_error([&] { run(out, p.q.view(false, {2, 4, D}, {5 * D, D, 1}, D), cache(), lens, app()); },
               "attention_decode: q must be [batch, q_len, heads, head_dim], got [2, 4, 64]");
  expect_error([&] { run(out, p.q.view(false, {2, 0, 4, D}, {5 * D, 5 * D, D, 1}, D), cache(), lens, app()); },
               "attention_decode: q has q_len 0");
  expect_error([&] { run(out, p.q.view(false, {2, 1, 3, D}, {5 * D, 5 * D, D, 1}, D), cache(), lens, app()); },
               "attention_decode: heads_q (3) must be a positive multiple of heads_kv (2");
  expect_error([&] { run(f16.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D, 1}, D), q, cache(), lens, app()); },
               "attention_decode: out has dtype float16, expected bfloat16");
  expect_error([&] { run(wide.view(false, {2, 1, 2, D}, {4 * D, 4 * D, D, 1}), q, cache(), lens, app()); },
               "attention_decode: out has shape [2, 1, 2, 64] but q has shape [2, 1, 4, 64]");
  expect_error([&] { run(q, q, cache(), lens, app()); }, "attention_decode: out and q are the same tensor");
  expect_error([&] { run(p.q.view(false, {2, 1, 4, D}, {5 * D, 5 * D, D, 1}, 0), q, cache(), lens, app()); },
               "attention_decode: out and q overlap in memory");

  // The cache.
  DecodeCache c = cache();
  c.k = f16.view(false, {2, 16, 2, D}, {32 * D, 2 * D, D, 1});
  expect_error([&] { run(out, q, c, lens, app()); },
               "attention_decode: k_cache has dtype float16; the cache holds q's dtype (bfloat16) or float8_e4m3fn");
  c = cache();
  c.v = p.cache_view(r.cache, false, 0);
  c.v = TensorView(c.v.data(), DType::f16, c.v.device(), 4, c.v.shape(), c.v.strides());
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: v_cache has dtype float16");
  c = cache();
  c.k = p.cache.view(false, {p.num_pages, 16, 2, 32}, {p.page_stride, 2 * D, D, 1});
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: k_cache has head_dim 32, q has 64; they must match");
  c = cache();
  c.k = r.cache.view(false, {p.num_pages, 16, 2, D, 1}, {p.page_stride, 2 * D, D, 1, 1});
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: k_cache must be [batch, max_len, heads_kv, head_dim]");
  c = cache();
  c.v = r.cache.view(false, {p.num_pages, 15, 2, D}, {p.page_stride, 2 * D, D, 1}, p.v_offset);
  expect_error([&] { run(out, q, c, lens, app()); },
               "attention_decode: v_cache has shape [" + std::to_string(p.num_pages) + ", 15, 2, 64] but k_cache has shape");
  c = cache();
  c.k = r.cache.view(false, {p.num_pages, 0, 2, D}, {p.page_stride, 2 * D, D, 1});
  c.v = r.cache.view(false, {p.num_pages, 0, 2, D}, {p.page_stride, 2 * D, D, 1}, p.v_offset);
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: a paged cache needs page_size >= 1");
  c = cache();
  c.k = r.cache.view(false, {p.num_pages, 16, 2, D}, {p.page_stride, 2 * D + 4, D, 1});
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: k_cache stride 132 of dim 1");
  c = cache();
  c.k_scale = p.scales.view(false, {2}, {1});
  expect_error([&] { run(out, q, c, lens, app()); },
               "attention_decode: k_scale is given but the cache is bfloat16; scales apply to a float8_e4m3fn cache only");
  c = cache();
  c.block_table = std::nullopt;  // contiguous: k's first dim is the batch
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: k_cache has batch " + std::to_string(p.num_pages) +
                                                         ", q has 2 (a contiguous cache is");
  c = cache();
  Buf t64(DType::i64, 2 * p.max_pages);
  c.block_table = t64.view(false, {2, p.max_pages}, {p.max_pages, 1});
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: block_table has dtype int64, expected int32");
  c = cache();
  c.block_table = p.table.view(false, {1, p.max_pages}, {p.max_pages, 1});
  expect_error([&] { run(out, q, c, lens, app()); },
               "attention_decode: block_table must be int32 [batch, max_pages] with batch 2, got [1, ");
  c = cache();
  c.block_table = p.table.view(false, {2, 2}, {3, 2});
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: block_table must be contiguous in its last dim");
  c = cache();
  c.k = p.kv_new.view(false, {p.num_pages, 16, 2, D}, {p.page_stride, 2 * D, D, 1});
  c.k = TensorView(r.cache.bytes.data(), DType::bf16, Device{DeviceType::cuda, 0}, 4, c.k.shape(), c.k.strides());
  expect_error([&] { run(out, q, c, lens, app()); }, "attention_decode: k_cache is on cuda:0 but q is on cpu:0");

  // fp8 caches need both scales, float32 [heads_kv].
  Case c8 = cs;
  c8.fp8 = true;
  Problem p8(c8);
  Outputs r8(p8);
  DecodeCache d8 = p8.decode_cache(r8.cache, false);
  const TensorView q8 = p8.q_view(p8.q, false), out8 = p8.q_view(r8.out, false);
  d8.k_scale = std::nullopt;
  expect_error([&] { run(out8, q8, d8, lens, p8.decode_append(false)); },
               "attention_decode: a float8_e4m3fn cache needs k_scale (float32 [heads_kv] = [2]");
  d8 = p8.decode_cache(r8.cache, false);
  d8.v_scale = p8.scales.view(false, {3}, {1});
  expect_error([&] { run(out8, q8, d8, lens, p8.decode_append(false)); }, "attention_decode: v_scale must have shape [2], got [3]");
  d8 = p8.decode_cache(r8.cache, false);
  d8.v_scale = p8.seqlens.view(false, {2}, {1});
  expect_error([&] { run(out8, q8, d8, lens, p8.decode_append(false)); }, "attention_decode: v_scale has dtype int32, expected float32");
  d8 = p8.decode_cache(r8.cache, false);
  d8.k = r8.cache.view(false, {p8.num_pages, 16, 1, D}, {p8.page_stride, 2 * D, D, 1}, 8);
  d8.v = r8.cache.view(false, {p8.num_pages, 16, 1, D}, {p8.page_stride, 2 * D, D, 1}, p8.v_offset + 8);
  expect_error([&] { run(out8, q8, d8, lens, p8.decode_append(false)); }, "attention_decode: k_cache data pointer");
  d8 = p8.decode_cache(r8.cache, false);
  d8.k = r8.cache.view(false, {p8.num_pages, 16, 2, D}, {p8.page_stride, 2 * D, D + 8, 1});
  expect_error([&] { run(out8, q8, d8, lens, p8.decode_append(false)); },
               "attention_decode: k_cache stride 72 of dim 2 must be a non-negative multiple of 16 elements");
  expect_untouched(p8, r8);

  // cache_seqlens.
  Buf l64(DType::i64, 2);
  expect_error([&] { run(out, q, cache(), l64.view(false, {2}, {1}), app()); },
               "attention_decode: cache_seqlens has dtype int64, expected int32");
  expect_error([&] { run(out, q, cache(), p.table.view(false, {3}, {1}), app()); },
               "attention_decode: cache_seqlens must have shape [2], got [3]");
  expect_error([&] { run(out, q, cache(), p.table.view(false, {2}, {2}), app()); },
               "attention_decode: cache_seqlens must be contiguous");

  // k_new, v_new and the rotary cache.
  std::optional<DecodeAppend> a = app();
  a->k_new = p.kv_new.view(false, {2, 1, 1, D}, {4 * D, 4 * D, D, 1});
  expect_error([&] { run(out, q, cache(), lens, a); },
               "attention_decode: k_new must be [batch, q_len, heads_kv, head_dim] = [2, 1, 2, 64], got [2, 1, 1, 64]");
  a = app();
  a->v_new = f16.view(false, {2, 1, 2, D}, {4 * D, 4 * D, D, 1});
  expect_error([&] { run(out, q, cache(), lens, a); }, "attention_decode: v_new has dtype float16, expected bfloat16");
  a = app();
  a->k_new = r.cache.view(false, {2, 1, 2, D}, {4 * D, 4 * D, D, 1}, p.cache_index(0, 0, 0, 0, 0));
  expect_error([&] { run(out, q, cache(), lens, a); }, "attention_decode: k_cache and k_new overlap in memory");
  a = app();
  a->rotary_cos_sin = p.cos_sin.view(false, {3, 63}, {63, 1});
  expect_error([&] { run(out, q, cache(), lens, a); },
               "attention_decode: rotary_cos_sin has rotary_dim 63; it must be even, in [2, head_dim = 64]");
  a = app();
  a->rotary_cos_sin = f32.view(false, {2, 66}, {66, 1});
  expect_error([&] { run(out, q, cache(), lens, a); }, "attention_decode: rotary_cos_sin has rotary_dim 66");
  a = app();
  a->rotary_cos_sin = p.seqlens.view(false, {1, 2}, {2, 1});
  expect_error([&] { run(out, q, cache(), lens, a); }, "attention_decode: rotary_cos_sin has dtype int32, expected float32");
  a = app();
  a->rotary_cos_sin = p.cos_sin.view(false, {4, 32}, {64, 1});
  expect_error([&] { run(out, q, cache(), lens, a); }, "attention_decode: rotary_cos_sin must be contiguous");
  DecodeCache same = cache();
  same.v = same.k;
  expect_error([&] { run(out, q, same, lens, app()); }, "attention_decode: k_cache and v_cache are the same tensor");

  // lse, scale, workspace.
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, r.lse.view(false, {2, 1, 4}, {4, 4, 1})); },
               "attention_decode: lse must be float32 [batch, heads_q, q_len] = [2, 4, 1], got [2, 1, 4]");
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, r.out.view(false, {2, 4, 1}, {4, 1, 1})); },
               "attention_decode: lse has dtype bfloat16, expected float32");
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, r.lse.view(false, {2, 4, 1}, {1, 2, 1})); },
               "attention_decode: lse must be contiguous");
  for (double bad : {0.0, -1.0, std::nan(""), double(kInf), 1e300})
    expect_error([&] { run(out, q, cache(), lens, app(), bad); }, "attention_decode: scale");
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, std::nullopt, f16.view(false, {8}, {1})); },
               "attention_decode: workspace has dtype float16, expected float32");
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, std::nullopt, f32.view(false, {2, 4}, {4, 1})); },
               "attention_decode: workspace must be a 1-d float32 tensor");
  const int64_t ws_shape[1] = {64}, ws_strides[1] = {1};
  const TensorView ws_on_out(r.out.bytes.data(), DType::f32, Device{}, 1, ws_shape, ws_strides);
  expect_error([&] { run(out, q, cache(), lens, app(), 0.125, std::nullopt, ws_on_out); },
               "attention_decode: workspace and out overlap in memory");
  expect_untouched(p, r);
}

TEST(AttentionDecodeCpu, WorkspaceSizeOnTheHostIsZero) {
  Case cs;
  cs.lens = {4000};
  Problem p(cs);
  EXPECT_EQ(attention_decode_workspace_size(p.q_view(p.q, false), p.decode_cache(p.cache, false), 0), 0);
  // A host workspace is accepted and not needed.
  Outputs r(p);
  Buf ws(DType::f32, 16);
  call(p, r, false, true, ws.view(false, {16}, {1}));
  const Outputs ref = reference(p);
  EXPECT_EQ(r.out.bytes, ref.out.bytes);
}

// Runs f (an expect_matches) with its failures intercepted; expects one of them to contain `needle`.
template <class F>
void expect_reported(F&& f, const std::string& needle) {
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter reporter(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    f();
  }
  bool found = false;
  for (int i = 0; i < results.size(); ++i)
    found = found || std::string(results.GetTestPartResult(i).message()).find(needle) != std::string::npos;
  EXPECT_TRUE(found) << "the comparison did not report \"" << needle << "\" (" << results.size() << " failures)";
}

// The GPU tests' comparison, run on two host calls (which agree exactly), catches what it
// should: an output off by more than the bound, a written gap, a nonzero output of a query
// without keys, a wrong lse, a cache element written outside the appended rows, an appended
// element off by more than a rounding. (So that a GPU failure blames the kernel, not the harness.)
TEST(AttentionDecodeCpu, ComparisonHarnessSelfCheck) {
  for (bool fp8 : {false, true})
    for (int layout : {0, 1}) {
      Case cs;
      cs.fp8 = fp8;
      cs.kv_layout = layout;
      cs.q_len = 3;
      cs.heads_q = 6;
      cs.heads_kv = 3;
      cs.append = true;
      cs.rot_dim = 32;
      cs.extra_heads = 2;
      cs.lens = {0, 33, 7};
      cs.page_size = layout ? 16 : 0;
      SCOPED_TRACE(cs.describe());
      Problem p(cs);
      const Outputs ref = reference(p);
      Outputs again(p);
      call(p, again, false, true);
      expect_matches(p, again, ref, true);
      auto with = [&](auto&& change) {
        Outputs bad = again;
        change(bad);
        return [&p, &ref, bad] { expect_matches(p, bad, ref, true); };
      };
      // A value that differs from v in every cache dtype: at least 1 away, or 1 for a NaN
      // (poisoned) element (a fixed 1.0 could equal a random fp8 element already, and the
      // change would not be one).
      auto flipped = [](float v) { return std::isnan(v) ? 1.0f : v >= 0 ? -1.0f - v : 1.0f - v; };
      const int64_t o = p.token_index(1, 2, 5, 7);
      expect_reported(with([&](Outputs& b) { b.out.set(o, ref.out.get(o) + 0.5f); }), "out[1, 2, 5, 7]");
      expect_reported(with([&](Outputs& b) { b.out.set(p.token_index(1, 2, 0, 0) - 1, 0.0f); }),
                      "elements outside the view were written");
      expect_reported(with([&](Outputs& b) { b.lse.set(4, ref.lse.get(4) + 1e-2f); }), "lse[4]");
      const int64_t past = p.cache_index(1, 1, 40, 2, 3);  // a row past sequence 1's keys
      expect_reported(with([&](Outputs& b) { b.cache.set(past, flipped(ref.cache.get(past))); }),
                      "outside the appended rows changed");
      expect_reported(with([&](Outputs& b) { b.cache.set(p.cache_index(1, 2, 8, 1, 5), 100.0f); }),
                      "v_cache appended element");
      const int64_t k = p.cache_index(0, 2, 9, 0, 1);  // an appended, rotated k element: within a rounding passes
      with([&](Outputs& b) { b.cache.set(k, ref.cache.get(k) * (fp8 ? 1.1f : 1.004f)); })();
      expect_reported(with([&](Outputs& b) { b.cache.set(k, flipped(ref.cache.get(k))); }),
                      "k_cache appended element");
    }
  // A query that sees no key (no append; causal, 1 cached key, q_len 3: tokens 0 and 1) must be exactly 0.
  Case cs;
  cs.q_len = 3;
  cs.lens = {1, 4};
  Problem p(cs);
  const Outputs ref = reference(p);
  Outputs bad(p);
  call(p, bad, false, true);
  bad.out.set(p.token_index(0, 1, 2, 3), 1e-4f);
  expect_reported([&] { expect_matches(p, bad, ref, true); }, "not exactly 0");
}

// ---------------------------------------------------------------------------------------
// GPU against the CPU reference.

TEST(AttentionDecodeGpu, PageSizesAndRandomBlockTables) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  for (DType dt : {DType::f16, DType::bf16})
    for (int page : {1, 16, 48, 256, 0})
      for (int q_len : {1, 4}) {
        Case cs;
        cs.dt = dt;
        cs.dim = d;
        cs.page_size = page;
        cs.q_len = q_len;
        cs.heads_q = 8;
        cs.heads_kv = 2;
        std::uniform_int_distribution<int> extra(0, 900);
        cs.lens = {0, 1, 17, 300, 1000 + extra(rng()), 64, 65};
        check_gpu(cs);
      }
}

TEST(AttentionDecodeGpu, HeadDims) {
  LLMK_REQUIRE_GPU();
  for (int d : {64, 96, 128, 256})
    for (DType dt : {DType::f16, DType::bf16})
      for (bool causal : {false, true}) {
        Case cs;
        cs.dt = dt;
        cs.dim = d;
        cs.causal = causal;
        cs.q_len = 2;
        cs.heads_q = 6;
        cs.heads_kv = 3;
        cs.lens = {700, 3, 129, 0};
        check_gpu(cs);
      }
}

// Group sizes 1-16 (the query heads of a kv head share one pass), q_len 1 and 3.
TEST(AttentionDecodeGpu, GqaGroupSizes) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  for (int group = 1; group <= 16; ++group)
    for (int q_len : {1, 3}) {
      Case cs;
      cs.dt = group % 2 ? DType::bf16 : DType::f16;
      cs.dim = group % 3 == 0 ? dim_or_compiled(64) : d;
      cs.q_len = q_len;
      cs.heads_kv = 2;
      cs.heads_q = 2 * group;
      cs.lens = {333, 1, 2048};
      cs.page_size = group % 2 ? 16 : 0;
      check_gpu(cs);
    }
}

// q_len 1-16 (speculative-decoding verification) and longer, causal (bottom-right) and not, with
// sequences shorter than q_len (causal: the first tokens see no key).
TEST(AttentionDecodeGpu, QueryLengths) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  // 1-16 (a step, speculative verification), then longer ones: several tiles of query rows.
  for (int q_len : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33, 64})
    for (bool causal : {true, false}) {
      Case cs;
      cs.dt = q_len % 2 ? DType::bf16 : DType::f16;
      cs.dim = d;
      cs.q_len = q_len;
      cs.causal = causal;
      cs.heads_q = 8;
      cs.heads_kv = 2;
      cs.lens = {q_len > 1 ? q_len - 2 : 0, 500, q_len, 77};
      cs.lens[0] = std::max(cs.lens[0], 0);
      check_gpu(cs);
    }
}

// Ragged lengths from 0 to 64k in one batch (pages of 256), MQA and GQA, q_len 1 and 2: the
// split-KV path must be taken here (a small batch, long contexts).
TEST(AttentionDecodeGpu, RaggedLengthsTo64k) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  for (int q_len : {1, 2}) {
    Case cs;
    cs.dim = d;
    cs.q_len = q_len;
    cs.heads_q = q_len == 1 ? 8 : 16;
    cs.heads_kv = q_len == 1 ? 1 : 2;
    cs.page_size = 256;
    cs.lens = {0, 65536 - q_len, 1, 4097, 300, 12345};
    check_gpu(cs, /*expect_split=*/true);
  }
  Case one;  // batch 1: every SM on one sequence
  one.dim = d;
  one.heads_q = 32;
  one.heads_kv = 8;
  one.page_size = 0;
  one.lens = {32768};
  check_gpu(one, /*expect_split=*/true);
}

// Append: k_new / v_new written at cache_seqlens + i (rotated when asked, quantized for fp8)
// and attended in the same call; the cache after the call against the reference's.
TEST(AttentionDecodeGpu, AppendAndRotary) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  struct Rot {
    int rot_dim;
    bool gptj;
  };
  for (bool fp8 : {false, true})
    for (DType dt : {DType::f16, DType::bf16})
      for (const Rot rot : {Rot{0, false}, Rot{d, false}, Rot{d / 2, true}, Rot{d, true}})
        for (int q_len : {1, 5}) {
          Case cs;
          cs.dt = dt;
          cs.fp8 = fp8;
          cs.dim = d;
          cs.q_len = q_len;
          cs.heads_q = 8;
          cs.heads_kv = 2;
          cs.append = true;
          cs.rot_dim = rot.rot_dim;
          cs.gptj = rot.gptj;
          cs.page_size = q_len == 1 ? 16 : 0;
          cs.lens = {0, 15, 16, 1000, 63};
          check_gpu(cs);
        }
}

// fp8 caches (without append) over head dims, GQA 5, q_len 1 and 7, split and not.
TEST(AttentionDecodeGpu, Fp8Cache) {
  LLMK_REQUIRE_GPU();
  for (int d : {64, 128, 256})
    for (DType dt : {DType::f16, DType::bf16})
      for (int q_len : {1, 7}) {
        Case cs;
        cs.dt = dt;
        cs.fp8 = true;
        cs.dim = d;
        cs.q_len = q_len;
        cs.heads_q = 10;
        cs.heads_kv = 2;
        cs.page_size = 32;
        cs.lens = {5000, 0, 31, 257};
        check_gpu(cs);
      }
}

// k and v as the halves of one kv tensor ([pages, 2, page_size, heads, dim], FlashInfer's
// layout), q and out as head slices of wider rows, with append and rotary.
TEST(AttentionDecodeGpu, InterleavedKvAndStridedViews) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  for (bool fp8 : {false, true})
    for (bool append : {false, true}) {
      Case cs;
      cs.fp8 = fp8;
      cs.dim = d;
      cs.q_len = 3;
      cs.heads_q = 12;
      cs.heads_kv = 4;
      cs.kv_layout = 1;
      cs.extra_heads = 3;
      cs.append = append;
      cs.rot_dim = append ? d : 0;
      cs.page_size = 16;
      cs.lens = {100, 0, 2500};
      check_gpu(cs);
    }
}

// One call captured in a CUDA graph, replayed with new cache_seqlens (and, with append, new
// k_new / v_new) written into the same device buffers: each replay against the reference of
// the call with those values (with append, the host cache evolves through the same calls).
// With the workspace the splits merge by the merge kernel (more than 8 here); without it,
// 8 splits merge in a cluster (sm_90).
TEST(AttentionDecodeGpu, CudaGraphReplaysWithNewLengths) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  const std::vector<std::vector<int>> replays = {{100, 0, 3000}, {0, 4000, 1}, {4090, 4090, 4090}, {0, 0, 0}, {17, 2049, 333}};
  for (bool with_workspace : {true, false})
  for (bool append : {false, true}) {
    Case cs;
    cs.dim = d;
    cs.heads_q = 8;
    cs.heads_kv = 2;
    cs.q_len = 2;
    cs.page_size = 16;
    cs.append = append;
    cs.rot_dim = append ? d : 0;
    cs.lens = {4090, 4090, 4090};
    cs.fill = {4096, 4096, 4096};  // every replay's keys hold data (append overwrites some)
    SCOPED_TRACE(cs.describe() + (with_workspace ? ", workspace" : ", no workspace"));
    if (!head_dim_runs(d)) continue;
    Problem p(cs);
    Outputs run(p), host(p);
    const int64_t ws_size = attention_decode_workspace_size(p.q_view(p.q, true), p.decode_cache(p.cache, true), 0);
    EXPECT_GT(ws_size, 0) << "3 sequences of 4k keys should run split";
    Buf ws(DType::f32, std::max<int64_t>(ws_size, 1));
    std::optional<TensorView> wv;
    if (ws_size > 0 && with_workspace) wv = ws.view(true, {ws_size}, {1});
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    // Every device buffer exists before the capture (no allocation while capturing).
    for (Buf* b : {&p.q, &p.kv_new, &p.seqlens, &p.table, &p.scales, &p.cos_sin, &run.out, &run.lse, &run.cache}) b->gpu();
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    call(p, run, true, true, wv, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const std::vector<int>& lens : replays) {
      SCOPED_TRACE(testing::Message() << "replay with lens " << lens[0] << " " << lens[1] << " " << lens[2]);
      for (int b = 0; b < 3; ++b) p.seqlens.ints()[b] = lens[b];
      for (int64_t i = 0; i < p.kv_new.n; ++i) p.kv_new.set(i, normal(rng()));
      ASSERT_EQ(cudaMemcpyAsync(p.seqlens.dev, p.seqlens.bytes.data(), p.seqlens.bytes.size(), cudaMemcpyHostToDevice,
                                stream), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(p.kv_new.dev, p.kv_new.bytes.data(), p.kv_new.bytes.size(), cudaMemcpyHostToDevice,
                                stream), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(run.out.dev, 0xff, run.out.bytes.size(), stream), cudaSuccess);  // NaN
      ASSERT_EQ(cudaMemsetAsync(run.lse.dev, 0xff, run.lse.bytes.size(), stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      // The reference of this call on the host state before it (the cache as earlier replays left it).
      Problem now = p;
      now.c.lens = lens;
      now.cache = host.cache;
      Outputs ref(now);
      call(now, ref, false, true);
      // out, lse and the cache (outside the appended rows: as before this replay) against the reference.
      expect_matches(now, run.download(), ref, true);
      host.cache = ref.cache;  // replays go on from the reference's cache (equal to the GPU's up to rounding)
      run.cache.bytes = ref.cache.bytes;
      run.cache.upload();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(AttentionDecodeGpu, DeviceAndWorkspaceErrors) {
  LLMK_REQUIRE_GPU();
  const int d = dim_or_compiled(128);
  if (!head_dim_runs(d)) GTEST_SKIP() << "no head dim compiled";
  Case cs;
  cs.dim = d;
  cs.lens = {30000};
  cs.heads_q = 8;
  cs.heads_kv = 1;
  Problem p(cs);
  Outputs r(p);
  const int64_t ws_size = attention_decode_workspace_size(p.q_view(p.q, true), p.decode_cache(p.cache, true), 0);
  ASSERT_GT(ws_size, 0) << "one sequence of 30k keys should run split";
  Buf ws(DType::f32, ws_size);
  expect_error([&] { call(p, r, true, true, ws.view(true, {ws_size - 1}, {1})); },
               "attention_decode: workspace has " + std::to_string(ws_size - 1) + " elements, this call needs " +
                   std::to_string(ws_size) + " (attention_decode_workspace_size)");
  expect_error([&] { call(p, r, true, true, ws.view(false, {ws_size}, {1})); },
               "attention_decode: workspace is on cpu:0 but q is on cuda:0");
  expect_error([&] {
    attention_decode(p.q_view(r.out, true), p.q_view(p.q, true), p.decode_cache(r.cache, true),
                     p.seqlens.view(false, {1}, {1}), std::nullopt, true, 0.1);
  }, "attention_decode: cache_seqlens is on cpu:0 but q is on cuda:0");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Outputs got = r.download();
  expect_untouched(p, got);
}

}  // namespace
}  // namespace llmk::test
