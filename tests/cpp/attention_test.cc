// Attention forward (attention, attention_varlen): the CPU reference
// against hand values; the CUDA kernel against the CPU reference over dtypes, head dims,
// causal and not, GQA/MQA, seqlen_q != seqlen_k (fully masked rows), lengths that are not
// multiples of the tiles, seqlen 1, strided and transposed layouts, the log-sum-exp, and
// variable-length batches; bad inputs.
//
// Every GPU check runs on each forward path of attention_forward_cuda, picked per call by
// LLMK_ATTENTION_PATH: sm80 (the mma.sync kernel), sm90 (the Hopper TMA + wgmma kernel) and
// auto. A forced sm90 that declines a call ("cannot take this call") is a note, and the case
// skips that path, unless the Hopper kernel must take it: an sm_90 device, a build with
// sm_90a, head dim 64, 96, 128 or 256 (every call the API accepts is fp16/bf16 with 16-byte
// aligned strides and data) and a reason that does not blame "this build". Each test restores the
// variable's previous value.
//
// Tolerance: the kernel rounds P to the input dtype before P V and the output once, each
// a relative error of at most eps / 2 (eps = 2^-8 bf16, 2^-11 fp16), so an output is
// within eps / 2 * (max|v| + |ref|) of the double reference; the test allows twice that.
// The Python tests add the FlashAttention rule (at most 2x PyTorch's own error).
#include <limits>
#include <string>

#include "attention/sm90/maps.h"
#include "attention_test_util.h"

namespace llmk::test {
namespace {

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

void expect_lse_close(const HostTensor& got, const HostTensor& ref, int64_t n, double atol = 1e-4) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = got.get(0, i), r = ref.get(0, i);
    const bool ok = std::isinf(r) ? g == r : std::fabs(g - r) <= atol + 1e-5 * std::fabs(r);
    if (!ok && bad++ < 5) ADD_FAILURE() << "lse[" << i << "] = " << g << ", reference " << r;
  }
  EXPECT_EQ(bad, 0);
}

// Rows that see no key (causal with seq_q > seq_k: the first seq_q - seq_k of a sequence;
// every row of a sequence without keys) are exactly 0, not merely within the tolerance of
// the reference's 0. Counts the elements of rows [row0, row0 + rows) of batch entry `b`
// that are not.
int64_t nonzero_in_rows(const Heads& out, const HostTensor& got, int64_t b, int64_t row0, int64_t rows) {
  int64_t bad = 0;
  for (int64_t s = row0; s < row0 + rows; ++s)
    for (int64_t h = 0; h < out.heads; ++h)
      for (int64_t c = 0; c < out.dim; ++c) bad += got.get(0, out.index(b, s, h, c)) != 0.0f;
  return bad;
}

std::string describe(DType dt, const Shape& s, bool causal, const Layout& layout) {
  std::ostringstream m;
  m << dtype_name(dt) << " batch " << s.batch << " seq_q " << s.seq_q << " seq_k " << s.seq_k << " heads "
    << s.heads_q << "/" << s.heads_kv << " dim " << s.dim << (causal ? " causal" : "")
    << (layout.transposed ? " transposed" : "") << (layout.extra_heads ? " strided heads" : "")
    << (layout.fused ? " fused qkv" : "") << (layout.odd_batch_stride ? " batch stride 1" : "");
  return m.str();
}

// Runs the CPU reference once, then the GPU kernel on each path, with and without lse
// (out and lse start as NaN on every run), and compares out and lse.
void check_dense(DType dt, const Shape& s, bool causal, const Layout& layout = {}) {
  const std::string what = describe(dt, s, causal, layout);
  SCOPED_TRACE(what);
  const int64_t extra = layout.extra_heads;
  const bool trans = layout.transposed;
  if (layout.odd_batch_stride) {
    ASSERT_EQ(s.batch, 1) << "an odd batch stride needs a batch of 1";
  }
  auto restride = [&](const TensorView& t) { return layout.odd_batch_stride ? with_batch_stride(t, 1) : t; };
  std::unique_ptr<Heads> qkv, q, k, v;
  if (layout.fused) {
    ASSERT_EQ(s.seq_q, s.seq_k) << "a fused qkv projection has one sequence length";
    const int64_t heads = s.heads_q + 2 * s.heads_kv;
    qkv = std::make_unique<Heads>(dt, s.batch, s.seq_q, heads, s.dim, heads + extra, trans);
    qkv->randomize();
  } else {
    q = std::make_unique<Heads>(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra, trans);
    k = std::make_unique<Heads>(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + extra, trans);
    v = std::make_unique<Heads>(dt, s.batch, s.seq_k, s.heads_kv, s.dim, s.heads_kv + 2 * extra, trans);
    q->randomize();
    k->randomize();
    v->randomize();
  }
  auto inputs = [&](bool on_gpu) -> std::array<TensorView, 3> {
    if (layout.fused) {
      const TensorView all = restride(on_gpu ? qkv->gpu() : qkv->host());
      return {narrow_heads(all, 0, s.heads_q), narrow_heads(all, s.heads_q, s.heads_kv),
              narrow_heads(all, s.heads_q + s.heads_kv, s.heads_kv)};
    }
    return {restride(on_gpu ? q->gpu() : q->host()), restride(on_gpu ? k->gpu() : k->host()),
            restride(on_gpu ? v->gpu() : v->host())};
  };
  Heads ref(dt, s.batch, s.seq_q, s.heads_q, s.dim);
  Heads out(dt, s.batch, s.seq_q, s.heads_q, s.dim, s.heads_q + extra, trans);
  Lse lse_ref({s.batch, s.heads_q, s.seq_q}), lse({s.batch, s.heads_q, s.seq_q});
  const double scale = 1.0 / std::sqrt(double(s.dim));
  {
    const auto [qh, kh, vh] = inputs(false);
    attention(restride(ref.host()), qh, kh, vh, causal, scale, lse_ref.cpu());
  }
  if (!has_gpu()) return;
  const float max_v = layout.fused ? max_abs_v(*qkv, s.heads_q + s.heads_kv, s.heads_kv) : max_abs_v(*v);
  const int64_t masked_rows = s.seq_k == 0 ? s.seq_q : causal ? std::max<int64_t>(s.seq_q - s.seq_k, 0) : 0;
  for (const char* path : kPaths) {
    for (const bool with_lse : {true, false}) {
      SCOPED_TRACE(testing::Message() << "LLMK_ATTENTION_PATH=" << path << (with_lse ? "" : ", without lse"));
      out.device.reset();  // fresh NaN storage for every run
      lse.device.reset();
      const bool ran = run_on_path(path, s.dim, what, [&] {
        const auto [qg, kg, vg] = inputs(true);
        attention(restride(out.gpu()), qg, kg, vg, causal, scale,
                  with_lse ? std::optional<TensorView>(lse.gpu()) : std::nullopt);
      }, layout.odd_batch_stride);
      if (!ran) break;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor got = out.download();
      expect_close(out, got, ref, max_v);
      for (int64_t b = 0; b < s.batch; ++b)
        EXPECT_EQ(nonzero_in_rows(out, got, b, 0, masked_rows), 0) << "rows that see no key are not 0";
      if (with_lse) expect_lse_close(lse.device->download(), lse_ref.host, Lse::numel(lse.shape));
    }
  }
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
  dtype_head_dim_cases(check_dense);
}

TEST(AttentionGpu, SequenceLengths) {
  LLMK_REQUIRE_GPU();
  sequence_length_cases(check_dense);
}

// Lengths around the Hopper kernel's 128- and 192-row tiles (and TMA boxes that cross the
// end of a sequence into the next batch entry's rows): every pair of 1, 7, 127, 129, 193
// with batch 2, then 1000 against 7, 129 and 1000.
TEST(AttentionGpu, LengthsAroundTheTiles) {
  LLMK_REQUIRE_GPU();
  const int64_t lens[] = {1, 7, 127, 129, 193};
  for (int64_t sq : lens)
    for (int64_t sk : lens)
      for (bool causal : {false, true}) {
        check_dense(DType::bf16, {2, sq, sk, 2, 1, 64}, causal);
        check_dense(DType::f16, {2, sq, sk, 2, 1, 128}, causal);
        check_dense(DType::bf16, {2, sq, sk, 2, 2, 96}, causal);
      }
  for (bool causal : {false, true}) {
    check_dense(DType::f16, {1, 1000, 129, 2, 1, 128}, causal);  // causal: 871 rows see no key
    check_dense(DType::bf16, {1, 129, 1000, 2, 2, 64}, causal);
    check_dense(DType::bf16, {1, 1000, 7, 4, 2, 64}, causal);  // causal: 993 rows see no key
  }
  check_dense(DType::bf16, {1, 1000, 1000, 2, 1, 128}, true);
  check_dense(DType::f16, {1, 1000, 1000, 2, 2, 64}, false);
}

// The rows of masked_row_cases that see no key are exactly 0 with lse -inf; the rest see a
// bottom-right-aligned triangle.
TEST(AttentionGpu, FullyMaskedRows) {
  LLMK_REQUIRE_GPU();
  masked_row_cases(check_dense);
}

TEST(AttentionGpu, LongSequence) {
  LLMK_REQUIRE_GPU();
  check_dense(DType::bf16, {1, 1100, 2048, 1, 1, 128}, true);
  check_dense(DType::f16, {1, 2048, 1100, 1, 1, 64}, false);
}

// More tiles than the H100's 132 SMs, so each block of the Hopper kernel's persistent grid
// walks several: at head dim 64 with 2 consumers (causal here) a tile's last P V runs beside
// the next tile's first S GEMM, non-causal head dim 64 takes 3 consumers (192-row tiles),
// causal tiles go in pairs, and tiles whose rows see no key (causal, seq_q > seq_k) sit
// between others.
TEST(AttentionGpu, ManyTilesPerBlock) {
  LLMK_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check_dense(DType::bf16, {8, 200, 200, 20, 4, 64}, causal);  // 320 tiles; causal 160 pairs
    check_dense(DType::f16, {6, 300, 40, 24, 8, 128}, causal);   // causal: rows 0-259 see no key
    check_dense(DType::bf16, {6, 300, 40, 24, 8, 64}, causal);   // the same where tiles overlap
    check_dense(DType::f16, {6, 300, 300, 24, 8, 96}, causal);   // 144 tiles of 3 key blocks
    check_dense(DType::bf16, {4, 129, 257, 40, 8, 256}, causal);
    // 140 tiles of 3 rows (one per batch and head) of 65 key blocks; non-causal, the blocks
    // that walk two tiles prefetch the second's Q. The case above (320 tiles of 5 key
    // blocks) prefetches on every block too.
    check_dense(DType::f16, {7, 3, 4100, 20, 5, 256}, causal);
  }
}

// Causal calls at head dim 64 from 8192 query rows take the Hopper kernel's 192-row tiles
// (3 consumers; shorter causal calls and every other head dim take 128-row tiles), where a
// consumer's 64 rows may end before a key block the tile computes: seq_q = seq_k (pairs of
// tiles, the diagonal in every tile); seq_q > seq_k puts the diagonal in the last 12 tiles,
// the rows before it see no key (varlen: AttentionVarlen.CausalLongSequence). The premise,
// that these calls take 3 consumers, is checked first.
TEST(AttentionGpu, CausalLongQueriesTakeThreeConsumers) {
  detail::AttentionParams p;
  p.head_dim = 64;
  p.causal = true;
  p.seqlen_q = 8192;
  ASSERT_EQ(detail::attention_sm90_consumers(p), 3);
  p.seqlen_q = 8191;
  ASSERT_EQ(detail::attention_sm90_consumers(p), 2);
  LLMK_REQUIRE_GPU();
  check_dense(DType::bf16, {1, 8192 + 97, 8192 + 97, 2, 1, 64}, true);
  check_dense(DType::bf16, {1, 8200, 2100, 2, 1, 64}, true);
  check_dense(DType::f16, {2, 8192, 300, 2, 2, 64}, true);
}

// O leaves through shared memory and TMA stores at head dims 96, 128 and 256 wherever out is
// TMA-addressable, at any length, and from registers at head dim 64 and where out is not.
// The premise, the launcher's choice, is checked first; then head dim 256 calls of 2048 and
// 2049 keys (a last key block of one key).
TEST(AttentionGpu, StagedOutputByHeadDim) {
  Heads probe(DType::bf16, 1, 300, 2, 256);
  const TensorView t = probe.host();
  detail::AttentionParams p;
  p.out = {t.data(), 300 * 2 * 256, t.stride(1), t.stride(2)};
  for (int keys : {1, 2049, 65536}) {
    p.seqlen_k = keys;
    p.head_dim = 256;
    ASSERT_TRUE(detail::attention_sm90_tma_out(p));
    p.head_dim = 128;
    ASSERT_TRUE(detail::attention_sm90_tma_out(p));
    p.head_dim = 96;
    ASSERT_TRUE(detail::attention_sm90_tma_out(p));
    p.head_dim = 64;
    ASSERT_FALSE(detail::attention_sm90_tma_out(p));
  }
  p.head_dim = 256;
  const TensorView odd = with_batch_stride(t, 1);
  p.out = {odd.data(), odd.stride(0), odd.stride(1), odd.stride(2)};
  ASSERT_FALSE(detail::attention_sm90_tma_out(p));
  LLMK_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check_dense(DType::bf16, {1, 300, 2048, 2, 1, 256}, causal);
    check_dense(DType::bf16, {1, 300, 2049, 2, 1, 256}, causal);
  }
}

// An out TMA cannot address (a batch of 1 with a batch stride of 1 element, which the API takes
// for a size-1 dim) beside q, k, v it can: the Hopper kernel stores O (and lse) from registers
// (at D = 96, 128 and 256 it otherwise stores O through shared memory and TMA). Bitwise the out and
// lse of the same call into ordinary tensors, which match the reference; the NaN gaps of both
// outs' wider rows untouched. The premise, that the launcher's TMA check refuses such an out,
// is checked first: without it both calls would take TMA.
TEST(AttentionGpu, OutputTmaCannotAddress) {
  const int64_t s = 300, h = 4, h_kv = 2;
  {
    Heads probe(DType::bf16, 1, s, h, 128);
    const TensorView t = with_batch_stride(probe.host(), 1);
    ASSERT_FALSE(detail::attention_tma_ok({t.data(), t.stride(0), t.stride(1), t.stride(2)}, false));
    ASSERT_TRUE(detail::attention_tma_ok({t.data(), s * h * 128, t.stride(1), t.stride(2)}, false));
  }
  LLMK_REQUIRE_GPU();
  for (int64_t d : {64, 96, 128, 256})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << "d " << d << (causal ? " causal" : ""));
      Heads q(DType::bf16, 1, s, h, d), k(DType::bf16, 1, s, h_kv, d), v(DType::bf16, 1, s, h_kv, d);
      q.randomize();
      k.randomize();
      v.randomize();
      Heads plain(DType::bf16, 1, s, h, d, h + 1), odd(DType::bf16, 1, s, h, d, h + 1), ref(DType::bf16, 1, s, h, d);
      Lse plain_lse({1, h, s}), odd_lse({1, h, s}), ref_lse({1, h, s});
      const double scale = 1.0 / std::sqrt(double(d));
      attention(ref.host(), q.host(), k.host(), v.host(), causal, scale, ref_lse.cpu());
      bool ran = true;
      const std::pair<TensorView, TensorView> calls[] = {{plain.gpu(), plain_lse.gpu()},
                                                         {with_batch_stride(odd.gpu(), 1), odd_lse.gpu()}};
      for (const auto& call : calls)  // (out, lse)
        ran = ran && run_on_path("sm90", d, "out TMA cannot address",
                                 [&] { attention(call.first, q.gpu(), k.gpu(), v.gpu(), causal, scale, call.second); });
      if (!ran) continue;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor want = plain.download(), want_lse = plain_lse.device->download();
      expect_close(plain, want, ref, max_abs_v(v));
      expect_lse_close(want_lse, ref_lse.host, h * s);
      expect_equal_elements(odd.download(), want, "out (storage, gaps included) against the ordinary call's");
      expect_equal_elements(odd_lse.device->download(), want_lse, "lse against the ordinary call's");
    }
}

TEST(AttentionGpu, GqaGroupSizes) {
  LLMK_REQUIRE_GPU();
  gqa_cases(check_dense);
}

// The layouts of layout_cases, each written into an out that is a head slice of wider rows
// (its NaN gaps must stay NaN).
TEST(AttentionGpu, GqaMqaAndLayouts) {
  LLMK_REQUIRE_GPU();
  layout_cases(check_dense);
}

// The variable itself: an unknown value is refused on every call; a forced sm90 declines a
// head dim the Hopper kernel never takes (32, as this build has it) with the reason; neither
// writes anything. The scope restores the previous value.
TEST(AttentionGpu, PathVariable) {
  LLMK_REQUIRE_GPU();
  {
    PathScope outer("sm80");
    {
      PathScope inner("auto");
      EXPECT_STREQ(std::getenv(kPathVariable), "auto");
    }
    EXPECT_STREQ(std::getenv(kPathVariable), "sm80");
  }
  // A head dim this build compiled (LLMK_HEAD_DIMS), one the Hopper kernel never takes if any.
  int64_t d = 0;
  for (int64_t dim : {32, 64, 96, 128, 256})
    if (d == 0 && attention_head_dim_compiled(dim)) d = dim;
  ASSERT_NE(d, 0) << "no head dim compiled";
  Heads q(DType::bf16, 1, 8, 2, d), k(DType::bf16, 1, 8, 2, d), out(DType::bf16, 1, 8, 2, d);
  q.randomize();
  k.randomize();
  auto call = [&] { attention(out.gpu(), q.gpu(), k.gpu(), k.gpu(), false, 0.125); };
  {
    PathScope scope("fastest");
    expect_error(call, "attention: LLMK_ATTENTION_PATH=fastest is not one of auto, sm80, sm90");
  }
  if (!sm90_must_take(d)) {
    PathScope scope("sm90");
    expect_error(call, "attention: LLMK_ATTENTION_PATH=sm90 cannot take this call: ");
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = out.download();
  for (int64_t i = 0; i < got.d; ++i) ASSERT_TRUE(std::isnan(got.get(0, i))) << "element " << i << " was written";
}

// Packed sequences of the given q and k lengths, against the dense reference per sequence.
void check_varlen(DType dt, const std::vector<int64_t>& lens_q, const std::vector<int64_t>& lens_k,
                  int64_t heads_q, int64_t heads_kv, int64_t dim, bool causal) {
  std::ostringstream m;
  m << dtype_name(dt) << " varlen q lengths";
  for (int64_t n : lens_q) m << " " << n;
  m << ", k lengths";
  for (int64_t n : lens_k) m << " " << n;
  m << ", heads " << heads_q << "/" << heads_kv << " dim " << dim << (causal ? " causal" : "");
  const std::string what = m.str();
  SCOPED_TRACE(what);
  const int64_t batch = static_cast<int64_t>(lens_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(lens_q[b]));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(lens_k[b]));
  }
  const int64_t max_q = *std::max_element(lens_q.begin(), lens_q.end());
  const int64_t max_k = *std::max_element(lens_k.begin(), lens_k.end());
  Heads q(dt, 1, cu_q.back(), heads_q, dim, heads_q + 1), k(dt, 1, cu_k.back(), heads_kv, dim),
      v(dt, 1, cu_k.back(), heads_kv, dim, heads_kv + 2), out(dt, 1, cu_q.back(), heads_q, dim, heads_q + 1),
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
  const float max_v = max_abs_v(v);
  for (const char* path : kPaths) {
    for (const bool with_lse : {true, false}) {
      SCOPED_TRACE(testing::Message() << "LLMK_ATTENTION_PATH=" << path << (with_lse ? "" : ", without lse"));
      out.device.reset();  // fresh NaN storage for every run
      lse.device.reset();
      const bool ran = run_on_path(path, dim, what, [&] {
        attention_varlen(out.gpu(true), q.gpu(true), k.gpu(true), v.gpu(true), cu_view(cu_dev.data, true, 0),
                         cu_view(cu_dev.data, true, 1), max_q, max_k, causal, scale,
                         with_lse ? std::optional<TensorView>(lse.gpu()) : std::nullopt);
      });
      if (!ran) break;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor got = out.download();
      expect_close(out, got, ref, max_v);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t masked = lens_k[b] == 0 ? lens_q[b] : causal ? std::max<int64_t>(lens_q[b] - lens_k[b], 0) : 0;
        EXPECT_EQ(nonzero_in_rows(out, got, 0, cu_q[b], masked), 0)
            << "sequence " << b << ": rows that see no key are not 0";
      }
      if (with_lse) expect_lse_close(lse.device->download(), lse_ref.host, Lse::numel(lse.shape));
    }
  }
}

TEST(AttentionVarlen, MatchesDensePerSequence) {
  for (bool causal : {false, true}) {
    check_varlen(DType::bf16, {1, 130, 0, 77, 300}, {1, 130, 5, 200, 250}, 4, 2, 64, causal);
    check_varlen(DType::f16, {17, 256, 129}, {17, 256, 129}, 2, 1, 128, causal);
  }
  check_varlen(DType::bf16, {40, 3}, {0, 9}, 2, 2, 32, true);  // a sequence without keys
}

// Head dims 64, 96, 128 and 256 (the Hopper kernel's): empty sequences first, between and last,
// lengths around the 128- and 192-row tiles (TMA boxes cross into the next sequence's
// rows), a q longer than its keys (causal: rows that see none), sequences without keys
// (one batch with none at all), GQA 3 and 4.
TEST(AttentionVarlen, EmptySequencesAndTileEdges) {
  for (bool causal : {false, true}) {
    check_varlen(DType::f16, {0, 7, 129, 0, 300, 1}, {5, 7, 200, 0, 127, 0}, 6, 2, 128, causal);
    check_varlen(DType::bf16, {127, 1, 129, 0}, {129, 7, 127, 0}, 8, 2, 64, causal);
    check_varlen(DType::bf16, {7, 129}, {0, 0}, 4, 2, 128, causal);  // no keys at all (total_k = 0)
    check_varlen(DType::f16, {0, 7, 129, 0, 300, 1}, {5, 7, 200, 0, 127, 0}, 4, 2, 256, causal);
    check_varlen(DType::bf16, {0, 7, 129, 0, 300, 1}, {5, 7, 200, 0, 127, 0}, 6, 3, 96, causal);
    // Over 2048 keys: several tiles' walks of 33 key blocks, with a short sequence's last rows
    // stored from registers.
    check_varlen(DType::bf16, {3, 300, 1}, {2100, 300, 5}, 2, 1, 256, causal);
  }
}

// More tiles than SMs (AttentionGpu.ManyTilesPerBlock) over sequences of uneven lengths:
// tiles past a short sequence's end between others; causal pairs within each sequence.
TEST(AttentionVarlen, ManyTilesPerBlock) {
  for (bool causal : {false, true}) {
    check_varlen(DType::bf16, {300, 1, 0, 257, 90, 400}, {300, 5, 3, 100, 90, 400}, 32, 8, 128, causal);
    check_varlen(DType::f16, {300, 1, 0, 257, 90, 400}, {300, 5, 3, 100, 90, 400}, 32, 8, 64, causal);
    check_varlen(DType::bf16, {300, 1, 0, 257, 90, 400}, {300, 5, 3, 100, 90, 400}, 16, 4, 256, causal);
  }
}

// A causal varlen batch whose longest sequence has 8200 queries: at head dim 64 the Hopper
// kernel takes 192-row tiles (AttentionGpu.CausalLongQueriesTakeThreeConsumers) for every
// sequence, the short ones and one without keys too.
TEST(AttentionVarlen, CausalLongSequence) {
  check_varlen(DType::bf16, {100, 8200, 0, 300}, {100, 2100, 0, 290}, 2, 1, 64, true);
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

// The score variants (AttentionOptions: window, softcap, sinks, alone and together) on the GPU
// against the CPU reference: the Hopper forward where it must take the call (an sm_90 device,
// an sm_90a build, head dims 64-256), else the call is rejected before any work (out stays NaN).
// Shapes around the 128-row / 128-key tiles, seq_q != seq_k (bottom-right windows, rows without
// keys whose lse is the sink), GQA 4/2.
TEST(AttentionGpu, ScoreVariants) {
  LLMK_REQUIRE_GPU();
  struct Case {
    int64_t seq_q, seq_k, window;
    double softcap;
    bool sinks;
  };
  const Case cases[] = {{300, 300, 1, 0, false},   {257, 257, 129, 0, false}, {200, 333, 70, 0, true},
                        {290, 140, 33, 0, true},   {200, 200, 0, 30.0, false}, {129, 129, 0, 0, true},
                        {300, 300, 100, 20.0, true}};
  for (const DType dt : kDTypes)
    for (const int64_t dim : {64, 128, 256})
      for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " dim " << dim << " seq_q " << c.seq_q << " seq_k "
                                        << c.seq_k << " window " << c.window << " softcap " << c.softcap
                                        << (c.sinks ? " sinks" : ""));
        const int64_t heads = 4;
        Heads q(dt, 1, c.seq_q, heads, dim), k(dt, 1, c.seq_k, 2, dim), v(dt, 1, c.seq_k, 2, dim);
        q.randomize();
        k.randomize();
        v.randomize();
        Lse sinks({heads}), lse_ref({1, heads, c.seq_q}), lse({1, heads, c.seq_q});
        for (int64_t h = 0; h < heads; ++h) sinks.host.set(0, h, 0.75f * static_cast<float>(h) - 1.0f);
        AttentionOptions cpu_options, gpu_options;
        if (c.window > 0) cpu_options.window = gpu_options.window = c.window;
        if (c.softcap > 0) cpu_options.softcap = gpu_options.softcap = c.softcap;
        if (c.sinks) {
          cpu_options.sinks = sinks.cpu();
          gpu_options.sinks = sinks.gpu();
        }
        Heads ref(dt, 1, c.seq_q, heads, dim), out(dt, 1, c.seq_q, heads, dim);
        const double scale = 1.0 / std::sqrt(double(dim));
        attention(ref.host(), q.host(), k.host(), v.host(), true, scale, cpu_options, lse_ref.cpu());
        if (!sm90_must_take(dim)) {
          expect_error([&] { attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), true, scale, gpu_options, lse.gpu()); },
                       "run on the Hopper forward");
          const HostTensor untouched = out.download();
          for (int64_t i = 0; i < untouched.d; ++i) ASSERT_TRUE(std::isnan(untouched.get(0, i)));
          continue;
        }
        attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), true, scale, gpu_options, lse.gpu());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        // The softcap runs on tanh.approx (relative error 2^-11): a capped score off by delta <=
        // 2^-11 |capped| moves each P by a factor within 1 +- 2 delta, out by at most 4 delta max|v|
        // beyond the rounding; |capped| <= min(softcap, scale |q| |k|) (Cauchy-Schwarz).
        const float max_v = max_abs_v(v);
        double allowance = 0, capped_error = 0;  // out's allowance; the capped scores' error (lse's)
        if (c.softcap > 0) {
          double q2 = 0, k2 = 0;
          for (int64_t s = 0; s < c.seq_q; ++s)
            for (int64_t h = 0; h < heads; ++h) {
              double n = 0;
              for (int64_t e = 0; e < dim; ++e) n += double(q.get(0, s, h, e)) * q.get(0, s, h, e);
              q2 = std::max(q2, n);
            }
          for (int64_t s = 0; s < c.seq_k; ++s)
            for (int64_t h = 0; h < 2; ++h) {
              double n = 0;
              for (int64_t e = 0; e < dim; ++e) n += double(k.get(0, s, h, e)) * k.get(0, s, h, e);
              k2 = std::max(k2, n);
            }
          capped_error = std::ldexp(1.0, -11) * std::min(c.softcap, scale * std::sqrt(q2 * k2));
          allowance = 4 * capped_error * max_v;
        }
        expect_close(out, out.download(), ref, static_cast<float>(max_v + allowance / eps_of(dt)));
        expect_lse_close(lse.device->download(), lse_ref.host, Lse::numel(lse.shape), 1e-4 + capped_error);
      }
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
