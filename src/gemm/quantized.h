// Kernel parameter blocks of quantized_gemm, shared by quantized_api.cc (validation, path),
// the CUDA launchers (quantized_gemm.cu) and the CPU reference (quantized_cpu.cc). The
// format and llmk's packed layout: include/llmk/quantized_gemm.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/host_device.h"
#include "gemm/gemm.h"
#include "llmk/quantized_gemm.h"

namespace llmk::detail {

// The input feature of code e of word j (= 4 t + i) in a row's 512-bit block b.
LLMK_HOST_DEVICE inline int64_t quantized_code_k(int bits, int64_t block, int word, int e) {
  const int t = word / 4, i = word % 4;
  if (bits == 4) return 128 * block + 32 * i + 8 * t + e;
  return 64 * block + 32 * (i / 2) + 8 * t + 4 * (i % 2) + e;
}
// The bit offset of code e in its word.
LLMK_HOST_DEVICE inline int quantized_code_shift(int bits, int e) {
  if (bits == 4) return 4 * (e % 2 == 0 ? e / 2 : e / 2 + 4);
  return 8 * e;
}
// Codes per 512-bit block of a row: 128 (int4), 64 (int8).
LLMK_HOST_DEVICE inline int quantized_block_k(int bits) { return 512 / bits; }

struct QuantizedParams {
  // out [m, n] (row stride ld_out) = x [m, k] (row stride ldx) · Wᵀ + bias; x, out, bias and
  // scales in `dtype` (f16 or bf16).
  void* out;
  int64_t ld_out;
  const void* x;
  int64_t ldx;
  const void* bias;
  const int32_t* packed;  // [n, k * bits / 32]
  const void* scales;     // [n, k / group_size]
  const uint8_t* zeros;   // [n, k / group_size] or nullptr (2^(bits - 1))
  int bits;
  int64_t group_size;
  int64_t m, n, k;
  DType dtype;
  // The dequantize-then-GEMM path: `workspace` (dtype) of workspace_elems elements.
  void* workspace;
  int64_t workspace_elems;
};

// The streaming kernel takes m <= kQuantizedStreamMaxM (in 64-row chunks above 64); above,
// slabs of kQuantizedSlabRows weight rows are dequantized into the workspace and multiplied
// by llmk::gemm. H200, both paths forced in one run (e927c2a, 8 int4 / int8 shapes each):
// streaming ran 1.16-1.65x the dequantize path at m = 128 on all 16, 0.60-0.86x at 256
// (o: 1.01-1.03x).
inline constexpr int64_t kQuantizedStreamMaxM = 128;
inline constexpr int64_t kQuantizedSlabRows = 16384;

void quantized_gemm_stream_cuda(const QuantizedParams& p, cudaStream_t stream);

// The Hopper kernel (quantized_sm90.cu, int4 codes, m <= kQuantizedSm90MaxM, k and the group
// multiples of 128): takes the call when quantized_sm90_takes (an sm_90 device, an sm_90a
// build); the automatic path gives it m >= kQuantizedSm90FromM.
inline constexpr int64_t kQuantizedSm90FromM = 17;
inline constexpr int64_t kQuantizedSm90MaxM = 128;
bool quantized_sm90_takes(const QuantizedParams& p, int device);
void quantized_gemm_sm90_cuda(const QuantizedParams& p, cudaStream_t stream);
// out [n, k] (dtype, row stride ld_out) = dequantize(W) on the GPU.
void dequantize_weight_cuda(const QuantizedParams& p, void* out, int64_t ld_out, cudaStream_t stream);

// CPU (quantized_cpu.cc).
void quantized_gemm_cpu(const QuantizedParams& p);
void dequantize_weight_cpu(const QuantizedParams& p, void* out, int64_t ld_out);
// codes [n, k] (row-major, each < 2^bits) -> packed [n, k * bits / 32].
void pack_codes(int32_t* packed, const uint8_t* codes, int64_t n, int64_t k, int bits);
// w's tensors (validated, host) from weight [n, k] (host, contiguous).
void quantize_weight_cpu(const QuantizedWeight& w, const TensorView& weight);

}  // namespace llmk::detail
