// Weight-only quantized matrix multiply (W4A16 and W8A16): out = x · dequantize(W)ᵀ + bias.
//
// The format. A weight W [N, K] (nn.Linear's layout: N output features, K input features)
// is stored as unsigned integer codes q in [0, 2^bits), one scale per group of `group_size`
// consecutive input features of each row, and a zero point z per group (optional):
//
//   W[n, k] = (q[n, k] - z[n, k / G]) * s[n, k / G]        (G = group_size)
//
// evaluated in the scales' dtype (float16 or bfloat16) as (q - z) exactly, then one rounded
// multiply: dequantize_weight returns that weight, which the CPU reference and the GPU paths
// multiply by, except int4 on the GPU at m <= 16: there the kernel sums (q - z) x in fp32 and
// multiplies each group's sum by s, i.e. the unrounded (q - z) s (within half a rounding step of
// the dtype of each weight element; closer to the quantized model, not further). The tests hold
// every path to float64 on that exact weight, torch's F.linear on the rounded one the yardstick.
//   bits 4: G a multiple of 128 that divides K (128 is GPTQ's and AWQ's group; G = K is one
//           scale per output channel); K a multiple of 128.
//   bits 8: G a multiple of 64 that divides K (G = K: per channel, the usual W8A16);
//           K a multiple of 64.
//   zeros absent: z = 2^(bits - 1) (8 for int4, 128 for int8: symmetric quantization).
//
// The tensors (all contiguous):
//   packed  int32   [N, K * bits / 32]  the codes in llmk's layout (below)
//   scales  f16/bf16 [N, K / G]         the activations' dtype
//   zeros   uint8   [N, K / G]          optional, each < 2^bits
//
// llmk's layout. Each row's codes are stored in blocks of 512 bits (16 int32 words: 128
// codes for int4, 64 for int8), the words of block b at packed[n, 16 b .. 16 b + 16). Word
// j = 4 t + i (t, i in 0..3; the kernels' lane t of a quad loads words 4t .. 4t + 3 as one
// 16-byte load) holds the codes of input features
//   int4: k = 128 b + 32 i + 8 t + e, e = 0..7, code e in bits 4 p(e) .. 4 p(e) + 3,
//         p(2 j) = j, p(2 j + 1) = j + 4 (codes 2j and 2j + 1 sit 16 bits apart, so that one
//         mask and one OR turn them into a pair of 16-bit floats);
//   int8: k = 64 b + 32 (i / 2) + 8 t + 4 (i % 2) + e, e = 0..3, code e in byte e.
// (Any order of k works for a dot product as long as x follows it: this one makes a lane's
// x fragment 16 contiguous bytes and its weight fragment 16 contiguous bytes.)
// quantize_weight (round to nearest from a float weight) and pack_quantized_weight (from
// codes, as the GPTQ and AWQ importers produce them) write this layout; dequantize_weight
// reads it back.
//
// quantized_gemm: out[..., N] = x[..., K] · dequantize(W)ᵀ + bias, fp32 accumulation.
//   x: [..., K], float16 or bfloat16, rows uniformly strided, 16-byte aligned, last dim
//      contiguous; out: x's leading dims and dtype, last dim N contiguous; bias: optional
//      [N] of x's dtype. scales have x's dtype.
//   Paths: int4 at 17 <= M <= 128 on an sm_90 GPU (sm_90a build): a wgmma kernel (the codes
//   through a TMA ring, dequantized in registers into wgmma's A operand, split-K reduced in
//   order with the bias); else for M <= 128 rows a weight-streaming kernel (the codes read
//   once per 64 rows, dequantized in registers into mma.sync fragments, split-K inside the
//   CTA and across a thread-block cluster on sm_90); above, each slab of up to 16384 weight rows is dequantized into
//   `workspace` and multiplied by llmk::gemm (tensor-core GEMM speed plus the slab's pass).
//   workspace: a 1-d contiguous tensor of x's dtype, at least quantized_gemm_workspace_size(m, n, k, device)
//   elements on x's device (0 when the streaming kernel takes the call).
//
// CPU tensors run the reference (double accumulation over the dequantized weight). Nothing
// is written when a call is rejected.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "llmk/tensor.h"

namespace llmk {

struct QuantizedWeight {
  TensorView packed;               // int32 [N, K * bits / 32], llmk's layout
  TensorView scales;               // [N, K / group_size], float16 or bfloat16
  std::optional<TensorView> zeros;  // uint8 [N, K / group_size]; absent: 2^(bits - 1)
  int bits = 4;                    // 4 or 8
  int64_t group_size = 128;
};

// out = x · dequantize(w)ᵀ + bias (CPU or CUDA tensors, all on one device).
void quantized_gemm(const TensorView& out, const TensorView& x, const QuantizedWeight& w,
                    const std::optional<TensorView>& bias = std::nullopt,
                    const std::optional<TensorView>& workspace = std::nullopt, cudaStream_t stream = nullptr);

// Elements of x's dtype the call with x of m rows and a weight [n, k] needs as workspace on
// `device` (0 when none).
int64_t quantized_gemm_workspace_size(int64_t m, int64_t n, int64_t k, int device = 0);

// Round-to-nearest quantization of weight [N, K] (float32, float16 or bfloat16, CPU) into
// w.packed, w.scales (their dtype chosen by the caller: float16 or bfloat16) and, when
// present, w.zeros. Symmetric (no zeros): s = max|W| / (2^(bits-1) - 1) per group, q =
// clamp(round(W / s) + 2^(bits-1), 0, 2^bits - 1). Asymmetric (zeros): s = (max - min) /
// (2^bits - 1), z = clamp(round(-min / s), 0, 2^bits - 1), q = clamp(round(W / s) + z).
// A group of zeros gets s = 1. Host memory only.
void quantize_weight(const QuantizedWeight& w, const TensorView& weight);

// Packs codes [N, K] (uint8, each < 2^bits, CPU) into w.packed in llmk's layout.
void pack_quantized_weight(const TensorView& packed, const TensorView& codes, int bits);

// out [N, K] (the scales' dtype) = dequantize(w), on the CPU or the GPU.
void dequantize_weight(const TensorView& out, const QuantizedWeight& w, cudaStream_t stream = nullptr);

}  // namespace llmk
