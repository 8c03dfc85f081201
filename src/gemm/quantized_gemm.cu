// CUDA paths of quantized_gemm (include/llmk/quantized_gemm.h has the format):
//
// * The weight-streaming kernel (m <= kQuantizedStreamMaxM; LLMK_QUANTIZED_PATH=stream
//   runs it at any m): gemm_small_m_kernel with
//   kBits = 4 or 8. Each lane loads 16 bytes of packed codes per weight row (32 int4 or 16
//   int8 codes), dequantizes them in registers into mma.sync fragments ((q - z) exact in
//   16-bit floats by the magic-number trick, then one multiply by the group's scale: the
//   weight dequantize_weight writes; int4 at m <= 16 instead scales each group's fp32 sum,
//   see the kernel's notes) and the rest is the dense small-M kernel's: x staged
//   in shared memory, split-K inside the CTA and over a cluster, a deterministic reduction.
//   Roofline: bytes = N*K*bits/8 + N*K/G*2 (scales) + M*K*2 per CTA from L2; at M = 1,
//   (14336, 4096) int4 g128 reads 29.4 + 0.9 MB: 7.1 us at the H200's 4.25 TB/s copy rate,
//   3.9x less than the bf16 weight. Dequantization costs 15 instructions per 8 int4 codes
//   (3.7 per byte of codes; 7 for bf16 int4 at m <= 16 with the scale after the mma), the same
//   order as the bytes' time at 8-12 warps per SM: the kernel is latency- and issue-bound
//   (Nsight Compute: 0.43 instructions per cycle per scheduler from 2 warps each), at 1.3-2.0
//   TB/s of codes (H200, docs/kernels/quantized_linear.md). Rows
//   beyond 64 (LLMK_QUANTIZED_PATH=stream) run as 64-token chunks along gridDim.z, each
//   dequantizing the codes again.
// * Larger m: each slab of up to kQuantizedSlabRows weight rows is dequantized into the
//   workspace (dequantize_kernel: one thread per packed word, 16- or 8-byte stores) and
//   multiplied by llmk::gemm: the GEMM's speed plus one read of the codes and one write and
//   read of the slab (~3% at M = 2048 on a 4096 x 14336 weight).
#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "gemm/gemm_small_m_kernel.cuh"
#include "gemm/quantized.h"

namespace llmk::detail {
namespace {

// The compiled instantiations, in one place: dtype (f16, bf16) x bits (4, 8) x 8-token
// tiles (1, 2, 4, 8).
const void* quantized_stream_kernel(DType dtype, int bits, int nt) {
  auto pick = [&](auto tag, auto bits_tag) -> const void* {
    using T = device_type_t<decltype(tag)>;
    constexpr int kBits = decltype(bits_tag)::value;
    switch (nt) {
      case 1: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 1, false, kBits>);
      case 2: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 2, false, kBits>);
      case 4: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 4, false, kBits>);
      case 8: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 8, false, kBits>);
      default: return nullptr;
    }
  };
  auto by_bits = [&](auto tag) -> const void* {
    if (bits == 4) return pick(tag, std::integral_constant<int, 4>{});
    if (bits == 8) return pick(tag, std::integral_constant<int, 8>{});
    return nullptr;
  };
  if (dtype == DType::f16) return by_bits(DTypeTag<DType::f16>{});
  if (dtype == DType::bf16) return by_bits(DTypeTag<DType::bf16>{});
  return nullptr;
}

// One thread per packed word (x: the words of a row, y: rows, looping past 65535): its 8
// (int4) or 4 (int8) codes are consecutive input features (quantized_code_k), written as one
// 16- or 8-byte vector of T. 32-bit index math within a row (K < 2^31).
template <class T, int kBits>
__global__ void __launch_bounds__(256) dequantize_kernel(const QuantizedParams p, T* out, int64_t ld_out) {
  constexpr int kCodes = 32 / kBits;
  const int words_per_row = static_cast<int>(p.k * kBits / 32);
  const int wi = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (wi >= words_per_row) return;
  const int k0 = static_cast<int>(quantized_code_k(kBits, wi / 16, wi % 16, 0));
  const int groups = static_cast<int>(p.k / p.group_size);
  const int g = k0 / static_cast<int>(p.group_size);
  const T* scales = static_cast<const T*>(p.scales);
  for (int64_t row = blockIdx.y; row < p.n; row += gridDim.y) {
    const uint32_t word = __ldg(reinterpret_cast<const unsigned*>(p.packed) + row * words_per_row + wi);
    const int64_t gi = row * groups + g;
    const float s = to_float(scales[gi]);
    const int z = p.zeros ? p.zeros[gi] : (1 << (kBits - 1));
    T v[kCodes];
#pragma unroll
    for (int e = 0; e < kCodes; ++e) {
      const int q = static_cast<int>((word >> quantized_code_shift(kBits, e)) & ((1u << kBits) - 1));
      // (q - z) is exact in T; one rounded product, as the streaming kernel's __hmul2.
      v[e] = from_float<T>(to_float(from_float<T>(static_cast<float>(q - z))) * s);
    }
    T* dst = out + row * ld_out + k0;
    if constexpr (kCodes == 8)
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
    else
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
  }
}

}  // namespace

void quantized_gemm_stream_cuda(const QuantizedParams& p, cudaStream_t stream) {
  SmallMArgs args{};
  // ldb: int32 words per row of codes
  args.p = plain_gemm_params(p.out, p.ld_out, p.x, p.ldx, p.packed, p.k * p.bits / 32, p.m, p.n, p.k, p.dtype);
  args.p.bias = p.bias;
  args.g = nullptr;
  args.scales = p.scales;
  args.zeros = p.zeros;
  args.groups = p.k / p.group_size;
  LLMK_CHECK(p.n * args.groups < (int64_t{1} << 32), "quantized_gemm: scales has ", p.n * args.groups,
             " elements; the streaming kernel addresses at most 2^32");
  args.group_size = static_cast<int>(p.group_size);
  const bool pow2 = (p.group_size & (p.group_size - 1)) == 0;
  args.group_shift = args.groups == 1 ? 31 : pow2 ? __builtin_ctzll(static_cast<unsigned long long>(p.group_size)) : -1;
  const int nt = small_m_token_tiles(p.m);
  const int64_t chunks = (p.m + 8 * nt - 1) / (8 * nt);
  const void* kernel = quantized_stream_kernel(p.dtype, p.bits, nt);
  LLMK_CHECK(kernel != nullptr, "quantized_gemm: no kernel for ", dtype_name(p.dtype), " and ", p.bits, " bits");
  launch_small_m_kernel("quantized_gemm", kernel, args, nt, chunks, p.bits, stream);
}

void dequantize_weight_cuda(const QuantizedParams& p, void* out, int64_t ld_out, cudaStream_t stream) {
  const int64_t words_per_row = p.k * p.bits / 32;
  if (p.n == 0 || words_per_row == 0) return;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((words_per_row + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>(p.n, 65535)));
  auto launch = [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    if (p.bits == 4)
      dequantize_kernel<T, 4><<<grid, threads, 0, stream>>>(p, static_cast<T*>(out), ld_out);
    else
      dequantize_kernel<T, 8><<<grid, threads, 0, stream>>>(p, static_cast<T*>(out), ld_out);
  };
  if (p.dtype == DType::f16) launch(DTypeTag<DType::f16>{});
  else launch(DTypeTag<DType::bf16>{});
  LLMK_CHECK_LAUNCH("dequantize_weight", stream);
}

}  // namespace llmk::detail
