// CPU side of quantized_gemm: the reference (the weight dequantized exactly as the kernels
// dequantize it, then gemm's double-accumulation reference), dequantize_weight on the host,
// and the producers of llmk's layout, quantize_weight (round to nearest) and
// pack_quantized_weight (from codes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/dispatch.h"
#include "common/host_types.h"
#include "gemm/quantized.h"

namespace llmk::detail {

namespace {

template <class T>
using HostT = std::conditional_t<std::is_same_v<T, DTypeTag<DType::f16>>, HostHalf, HostBFloat16>;

// (q - z) * s in T: (q - z) is exact, the product of two T values is exact in float, so one
// rounding, as the kernels' 16-bit multiply.
template <class H>
H dequantize_one(int q, int z, H s) {
  return from_float<H>(to_float(from_float<H>(static_cast<float>(q - z))) * to_float(s));
}

template <class H>
void dequantize_rows(const QuantizedParams& p, H* out, int64_t ld_out) {
  const int bits = p.bits;
  const int64_t words_per_row = p.k * bits / 32, groups = p.k / p.group_size;
  const int codes = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const H* scales = static_cast<const H*>(p.scales);
  for (int64_t row = 0; row < p.n; ++row)
    for (int64_t wi = 0; wi < words_per_row; ++wi) {
      const uint32_t word = static_cast<uint32_t>(p.packed[row * words_per_row + wi]);
      for (int e = 0; e < codes; ++e) {
        const int64_t k = quantized_code_k(bits, wi / 16, static_cast<int>(wi % 16), e);
        const int64_t gi = row * groups + k / p.group_size;
        const int q = static_cast<int>((word >> quantized_code_shift(bits, e)) & mask);
        const int z = p.zeros ? p.zeros[gi] : (1 << (bits - 1));
        out[row * ld_out + k] = dequantize_one(q, z, scales[gi]);
      }
    }
}

template <class H, class W>
void quantize_rows(const QuantizedWeight& w, const W* weight, int64_t n, int64_t k, std::vector<uint8_t>& codes) {
  const int bits = w.bits;
  const int64_t g = w.group_size, groups = k / g;
  const int qmax = (1 << bits) - 1, half = 1 << (bits - 1);
  H* scales = static_cast<H*>(w.scales.data());
  uint8_t* zeros = w.zeros ? static_cast<uint8_t*>(w.zeros->data()) : nullptr;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t gi = 0; gi < groups; ++gi) {
      const W* src = weight + row * k + gi * g;
      double lo = 0.0, hi = 0.0;  // the range includes 0 (GPTQ's and AWQ's convention)
      for (int64_t i = 0; i < g; ++i) {
        const double v = static_cast<double>(to_float(src[i]));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const double s_exact = zeros ? (hi - lo) / qmax : std::max(hi, -lo) / (half - 1);
      H s = from_float<H>(static_cast<float>(s_exact));
      if (!(to_float(s) > 0.0f) || !std::isfinite(to_float(s))) s = from_float<H>(1.0f);
      const double sd = static_cast<double>(to_float(s));
      int z = half;
      if (zeros) z = static_cast<int>(std::clamp(std::nearbyint(-lo / sd), 0.0, static_cast<double>(qmax)));
      scales[row * groups + gi] = s;
      if (zeros) zeros[row * groups + gi] = static_cast<uint8_t>(z);
      for (int64_t i = 0; i < g; ++i) {
        const double q = std::nearbyint(static_cast<double>(to_float(src[i])) / sd) + z;
        codes[row * k + gi * g + i] = static_cast<uint8_t>(std::clamp(q, 0.0, static_cast<double>(qmax)));
      }
    }
}

}  // namespace

void pack_codes(int32_t* packed, const uint8_t* codes, int64_t n, int64_t k, int bits) {
  const int64_t words_per_row = k * bits / 32;
  const int per_word = 32 / bits;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t wi = 0; wi < words_per_row; ++wi) {
      uint32_t word = 0;
      for (int e = 0; e < per_word; ++e) {
        const int64_t kk = quantized_code_k(bits, wi / 16, static_cast<int>(wi % 16), e);
        word |= static_cast<uint32_t>(codes[row * k + kk]) << quantized_code_shift(bits, e);
      }
      packed[row * words_per_row + wi] = static_cast<int32_t>(word);
    }
}

void quantize_weight_cpu(const QuantizedWeight& w, const TensorView& weight) {
  const int64_t n = weight.size(0), k = weight.size(1);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  dispatch_dtype(w.scales.dtype(), "quantize_weight", [&](auto scale_tag) {
    using H = HostT<decltype(scale_tag)>;
    dispatch_dtype(weight.dtype(), "quantize_weight", [&](auto weight_tag) {
      constexpr DType wd = decltype(weight_tag)::value;
      using W = std::conditional_t<wd == DType::f32, float, HostT<decltype(weight_tag)>>;
      quantize_rows<H>(w, static_cast<const W*>(weight.data()), n, k, codes);
    });
  });
  pack_codes(static_cast<int32_t*>(w.packed.data()), codes.data(), n, k, w.bits);
}

void dequantize_weight_cpu(const QuantizedParams& p, void* out, int64_t ld_out) {
  if (p.dtype == DType::f16) dequantize_rows(p, static_cast<HostHalf*>(out), ld_out);
  else dequantize_rows(p, static_cast<HostBFloat16*>(out), ld_out);
}

void quantized_gemm_cpu(const QuantizedParams& p) {
  std::vector<uint16_t> w(static_cast<size_t>(p.n * p.k));
  dequantize_weight_cpu(p, w.data(), p.k);
  GemmParams g = plain_gemm_params(p.out, p.ld_out, p.x, p.ldx, w.data(), std::max<int64_t>(p.k, 1), p.m, p.n, p.k,
                                   p.dtype);
  g.bias = p.bias;
  gemm_cpu(g);
}

}  // namespace llmk::detail
