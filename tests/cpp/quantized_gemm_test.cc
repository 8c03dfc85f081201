// quantized_gemm (include/llmk/quantized_gemm.h) through the torch-free C++ API:
//   * CPU: quantize_weight writes codes that this file reads back by its own reading of the
//     header's layout; dequantize_weight gives (q - z) * s; quantized_gemm's reference equals
//     a naive double loop over that weight rounded once.
//   * GPU: the CUDA paths (weight-streaming kernel at M <= 128 in its token-tile regimes and
//     64-row chunks, dequantize + GEMM above, with the workspace the size function asks for)
//     against the CPU reference, int4 group 128 with zero points and int8 per channel, f16 and
//     bf16, x rows strided, out rows strided with NaN in the gaps (an unwritten element or a
//     write into a gap fails). Tolerance: both sum exact products of T values in fp32 (GPU) or
//     double (CPU) and round once, so they differ by one rounding step of T plus fp32
//     accumulation (K * 2^-23 * sum |x w| bounds it, 2^-9 relative is far above it here).
//   * Bad inputs: named errors and nothing written.
#include <cstring>
#include <vector>

#include "llmk/quantized_gemm.h"
#include "naive_dot.h"
#include "test_util.h"

namespace llmk::test {
namespace {

// A dense byte buffer viewed as a contiguous [rows, cols] tensor of `dt` on the host.
struct Buffer {
  DType dt;
  int64_t rows, cols;
  std::vector<unsigned char> bytes;
  Buffer(DType d, int64_t r, int64_t c) : dt(d), rows(r), cols(c), bytes(static_cast<size_t>(r * c * dtype_size(d))) {}
  TensorView view(void* data = nullptr, Device dev = Device{}) {
    const int64_t shape[2] = {rows, cols}, strides[2] = {cols, 1};
    return TensorView(data ? data : bytes.data(), dt, dev, 2, shape, strides);
  }
};

// The code of input feature k in row `row`, read from the header's definition.
int code_at(const Buffer& packed, int bits, int64_t row, int64_t k) {
  const int64_t block = k / (512 / bits), r = k % (512 / bits);
  int word, shift;
  if (bits == 4) {  // k = 32 i + 8 t + e, nibble p(e)
    const int i = static_cast<int>(r / 32), t = static_cast<int>(r % 32 / 8), e = static_cast<int>(r % 8);
    word = 4 * t + i;
    shift = 4 * (e % 2 == 0 ? e / 2 : e / 2 + 4);
  } else {  // k = 32 (i / 2) + 8 t + 4 (i % 2) + e, byte e
    const int hi = static_cast<int>(r / 32), t = static_cast<int>(r % 32 / 8), lo = static_cast<int>(r % 8 / 4);
    word = 4 * t + 2 * hi + lo;
    shift = 8 * static_cast<int>(r % 4);
  }
  uint32_t w;
  std::memcpy(&w, packed.bytes.data() + 4 * (row * packed.cols + 16 * block + word), 4);
  return static_cast<int>((w >> shift) & ((1u << bits) - 1));
}

struct Quantized {
  int bits;
  int64_t group, n, k;
  Buffer packed, scales, zeros;
  bool has_zeros;
  QuantizedWeight weight(Device dev = Device{}, void* p = nullptr, void* s = nullptr, void* z = nullptr) {
    QuantizedWeight w;
    w.packed = packed.view(p, dev);
    w.scales = scales.view(s, dev);
    if (has_zeros) w.zeros = zeros.view(z, dev);
    w.bits = bits;
    w.group_size = group;
    return w;
  }
};

Quantized make_quantized(DType dt, int bits, int64_t group, bool zeros, int64_t n, int64_t k) {
  Quantized q{bits, group, n, k, Buffer(DType::i32, n, k * bits / 32), Buffer(dt, n, k / group),
              Buffer(DType::u8, n, k / group), zeros};
  HostTensor w(DType::f32, n, k);
  w.randomize(0.0f, 0.05f);
  quantize_weight(q.weight(), w.view());
  return q;
}

// (q - z) * s rounded to T, from this file's reading of the layout.
float dequantized(const Quantized& q, int64_t row, int64_t k) {
  const int64_t gi = row * (q.k / q.group) + k / q.group;
  const int z = q.has_zeros ? q.zeros.bytes[static_cast<size_t>(gi)] : (1 << (q.bits - 1));
  HostTensor s(q.scales.dt, 1, 1);
  std::memcpy(s.bytes.data(), q.scales.bytes.data() + 2 * gi, 2);
  HostTensor v(q.scales.dt, 1, 1);
  v.set(0, 0, static_cast<float>(code_at(q.packed, q.bits, row, k) - z) * s.get(0, 0));
  return v.get(0, 0);
}

TEST(QuantizedGemm, CpuReferenceMatchesTheFormat) {
  for (DType dt : {DType::f16, DType::bf16})
    for (int bits : {4, 8}) {
      const int64_t n = 9, k = 256, m = 3;
      Quantized q = make_quantized(dt, bits, bits == 4 ? 128 : k, bits == 4, n, k);
      HostTensor deq(dt, n, k);
      dequantize_weight(deq.view(), q.weight());
      HostTensor x(dt, m, k), out(dt, m, n);
      x.randomize();
      out.poison();
      quantized_gemm(out.view(), x.view(), q.weight());
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < k; ++c) ASSERT_EQ(deq.get(j, c), dequantized(q, j, c)) << "row " << j << " k " << c;
        for (int64_t i = 0; i < m; ++i) {
          double s = 0;
          for (int64_t c = 0; c < k; ++c) s += double(x.get(i, c)) * deq.get(j, c);
          HostTensor r(dt, 1, 1);
          r.set(0, 0, static_cast<float>(s));
          EXPECT_NEAR(out.get(i, j), r.get(0, 0), std::fabs(r.get(0, 0)) * dtype_rtol(dt) + 1e-6) << i << "," << j;
        }
      }
    }
}

// Every CUDA path against the CPU reference: the streaming kernel (m <= 16, int8 to 128), the
// Hopper kernel (int4 at m = 17-128 on an sm_90 GPU: a row block of 256 rows (128 above 64
// tokens) split along K into a cluster of 1, 2, 3 (rows shared unevenly by the reduction), 4
// or 8 pieces, or several row blocks with the last partial; K of 5 blocks of 128, split
// unevenly; pieces of 8 blocks, which wrap the ring; g256; n not a multiple of 4) and
// dequantize + GEMM (m > 128); int4 with zero points (symmetric in the bias case), int8 per
// channel.
TEST(QuantizedGemm, GpuMatchesCpu) {
  LLMK_REQUIRE_GPU();
  struct Shape {
    int64_t n, k;
    std::vector<int64_t> ms;
    int64_t group4;  // int4's group size (k: per channel)
    bool zeros4 = true, bias = false;
  };
  const Device gpu{DeviceType::cuda, 0};
  const Shape cases[] = {{100, 512, {1, 5, 16, 17, 64, 65, 128, 300}, 128},
                         {520, 1024, {33, 100}, 1024},
                         {256, 768, {20}, 128},
                         {200, 640, {24, 64}, 128},
                         {300, 2048, {40, 128}, 128},
                         {100, 256, {30}, 128},
                         {1030, 8192, {40, 100}, 256, false, true}};
  for (const Shape& c : cases)
    for (DType dt : {DType::f16, DType::bf16})
      for (int bits : {4, 8})
        for (int64_t m : c.ms) {
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " bits " << bits << " m " << m << " n " << c.n
                                          << " k " << c.k);
          const int64_t n = c.n, k = c.k;
          const int64_t group = bits == 4 ? c.group4 : k;
          Quantized q = make_quantized(dt, bits, group, bits == 4 && c.zeros4, n, k);
          HostTensor x(dt, m, k, k + 8), out(dt, m, n, n + 4), want(dt, m, n), bias(dt, 1, n);
          x.randomize();
          bias.randomize();
          out.poison();
          const std::optional<TensorView> host_bias =
              c.bias ? std::optional<TensorView>(bias.view(true)) : std::nullopt;
          quantized_gemm(want.view(), x.view(), q.weight(), host_bias);
          // The streaming kernel may scale the fp32 sums of (q - z) x instead of multiplying by
          // the rounded weight (q - z) s: at most half a rounding step of each weight element,
          // sum |x w| 2^-8 (bf16) or 2^-11 (f16) per output.
          HostTensor deq(dt, n, k);
          dequantize_weight(deq.view(), q.weight());
          const double half_step = dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
          std::vector<double> xd(static_cast<size_t>(m * k)), wd(static_cast<size_t>(n * k)),
              dots(static_cast<size_t>(m * n)), weight_rounding(static_cast<size_t>(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < k; ++c) xd[static_cast<size_t>(i * k + c)] = x.get(i, c);
          for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < k; ++c) wd[static_cast<size_t>(j * k + c)] = deq.get(j, c);
          naive_dot_products(xd.data(), wd.data(), m, n, k, dots.data(), weight_rounding.data());
          for (double& b : weight_rounding) b *= half_step;
          DeviceTensor dx(x), dout(out), dbias(bias);
          void *p = nullptr, *s = nullptr, *z = nullptr, *ws = nullptr;
          ASSERT_EQ(cudaMalloc(&p, q.packed.bytes.size()), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&s, q.scales.bytes.size()), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&z, q.zeros.bytes.size()), cudaSuccess);
          cudaMemcpy(p, q.packed.bytes.data(), q.packed.bytes.size(), cudaMemcpyHostToDevice);
          cudaMemcpy(s, q.scales.bytes.data(), q.scales.bytes.size(), cudaMemcpyHostToDevice);
          cudaMemcpy(z, q.zeros.bytes.data(), q.zeros.bytes.size(), cudaMemcpyHostToDevice);
          const int64_t ws_elems = quantized_gemm_workspace_size(m, n, k, 0);
          EXPECT_EQ(ws_elems > 0, m > 128);  // the streaming kernel takes m <= 128
          std::optional<TensorView> workspace;
          if (ws_elems > 0) {
            ASSERT_EQ(cudaMalloc(&ws, static_cast<size_t>(ws_elems * 2)), cudaSuccess);
            const int64_t shape[1] = {ws_elems}, strides[1] = {1};
            workspace = TensorView(ws, dt, gpu, 1, shape, strides);
          }
          const std::optional<TensorView> device_bias =
              c.bias ? std::optional<TensorView>(dbias.view(true)) : std::nullopt;
          quantized_gemm(dout.view(), dx.view(), q.weight(gpu, p, s, z), device_bias, workspace);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const HostTensor got = dout.download();
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n + 4; ++j) {
              if (j >= n) {
                if (i + 1 == m) break;  // the last row has no gap
                ASSERT_TRUE(std::isnan(got.get(i, j))) << "gap written at " << i << "," << j;
                continue;
              }
              const float w = want.get(i, j);
              ASSERT_NEAR(got.get(i, j), w,
                          2 * std::fabs(w) * dtype_rtol(dt) + weight_rounding[static_cast<size_t>(i * n + j)] + 1e-3f)
                  << i << "," << j;
            }
          cudaFree(p);
          cudaFree(s);
          cudaFree(z);
          cudaFree(ws);
        }
}

TEST(QuantizedGemm, BadInputsWriteNothing) {
  const int64_t n = 16, k = 256;
  Quantized q = make_quantized(DType::bf16, 4, 128, true, n, k);
  HostTensor x(DType::bf16, 2, k), out(DType::bf16, 2, n);
  x.randomize();
  out.poison();
  QuantizedWeight w = q.weight();
  w.group_size = 64;
  expect_error([&] { quantized_gemm(out.view(), x.view(), w); }, "quantized_gemm: group_size 64 must be a multiple of 128");
  w = q.weight();
  w.bits = 8;
  expect_error([&] { quantized_gemm(out.view(), x.view(), w); }, "quantized_gemm: packed has shape [16, 32], expected [N, 64]");
  HostTensor x16(DType::f16, 2, k);
  x16.randomize();
  expect_error([&] { quantized_gemm(out.view(), x16.view(), q.weight()); }, "scales have dtype bfloat16, expected float16");
  HostTensor wide(DType::bf16, 2, n + 1);
  expect_error([&] { quantized_gemm(wide.view(), x.view(), q.weight()); }, "out has shape [2, 17]");
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < n; ++j) ASSERT_TRUE(std::isnan(out.get(i, j)));
}

}  // namespace
}  // namespace llmk::test
