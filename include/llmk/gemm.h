// Dense matrix multiply with fused epilogues (the linear layers of a transformer).
//
// gemm: out = act(a · bᵀ + bias) + residual, fp32 accumulation.
//   a:   [M, K]; either K-contiguous rows (any leading dims [..., K] that flatten into
//        uniformly strided rows: the activations of nn.Linear) or a 2-d M-contiguous
//        view (stride(0) == 1: a transposed [K, M] tensor, as the weight gradient needs).
//   b:   [N, K], 2-d; K-contiguous (the nn.Linear weight layout) or N-contiguous
//        (stride(0) == 1: a transposed [K, N] tensor, as the input gradient needs).
//   out: [..., N_out] with a's leading dims (or [M, N_out] for a 2-d a), last dim
//        contiguous, rows may be strided. N_out = N, or N / 2 for silu_mul.
//   a and b: float16 or bfloat16, the same; out: float32, float16 or bfloat16.
//   bias:     optional [N] (before the activation), out's dtype, contiguous.
//   residual: optional, out's shape and dtype (added after the activation; may be out
//             itself: out += act(a · bᵀ + bias)).
//   activation:
//     none       out = a·bᵀ + bias + residual
//     silu_mul   b holds a gate projection over its first N/2 rows and an up projection
//                over the rest (torch.cat([gate_w, up_w])): with z = a·bᵀ + bias,
//                out = silu(z[:, :N/2]) * z[:, N/2:] + residual (the SwiGLU MLP's first GEMM)
//     gelu       erf GELU;  gelu_tanh: tanh approximation
//   Rows of a and b (their non-contiguous strides) and their data pointers must be
//   16-byte aligned, unless the dimension they step over has size 1.
//   Paths (llmk info names them): on Hopper (sm_90a build) a warp-specialized TMA + wgmma
//   kernel for M > 64; for M <= 64 a split-K kernel that streams the weight at the
//   bandwidth limit; elsewhere (Ampere, or shapes the other two do not take) an
//   mma.sync kernel.
//
// rmsnorm_linear: out = rmsnorm(x, norm_weight, eps) · weightᵀ (decode):
//   x [..., K] K-contiguous rows; norm_weight [K] of x's dtype or float32; weight [N, K]
//   K-contiguous of x's dtype; out [..., N] of x's dtype. Up to 32 rows in one launch (the
//   small-M kernel normalizes x as it stages it); from 33 rows on a Hopper GPU, rmsnorm into
//   stream-ordered scratch memory (at most 2048 x K) and the Hopper GEMM. With LLMK_GEMM_PATH
//   set to a kernel, the one-launch kernel at every M (it reads the weight once per 64 rows).
//
// CPU tensors run the reference (double accumulation). Nothing is written when a call is
// rejected.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "llmk/tensor.h"

namespace llmk {

enum class GemmActivation { none, silu_mul, gelu, gelu_tanh };

struct GemmEpilogue {
  std::optional<TensorView> bias;
  std::optional<TensorView> residual;
  GemmActivation activation = GemmActivation::none;
};

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmEpilogue& epilogue = {},
          cudaStream_t stream = nullptr);

void rmsnorm_linear(const TensorView& out, const TensorView& x, const TensorView& norm_weight,
                    const TensorView& weight, double eps, cudaStream_t stream = nullptr);

}  // namespace llmk
