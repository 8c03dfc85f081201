// Kernel parameter blocks of the gemm family, shared by gemm_api.cc (which validates the
// arguments and picks a path), the CUDA launchers and the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/host_device.h"
#include "llmk/dtype.h"
#include "llmk/gemm.h"

namespace llmk::detail {

// out[i, j] = act(sum_k A(i, k) B(j, k) + bias[j]) + residual[i, j], i < m, j < n_out,
//   A(i, k) = a[i * lda + k] when a_k_major, else a[k * lda + i];
//   B(j, k) = b[j * ldb + k] when b_k_major, else b[k * ldb + j];
//   out[i, j] at out[i * ld_out + j], residual[i, j] at residual[i * ld_residual + j].
// n counts the columns of A·Bᵀ: n_out = n / 2 for silu_mul (gate columns [0, n/2), up
// columns [n/2, n)), n otherwise. bias ([n]) and residual are in out_dtype, nullptr when
// absent; residual may equal out (same pointer and stride).
struct GemmParams {
  void* out;
  int64_t ld_out;
  const void* a;
  int64_t lda;
  bool a_k_major;
  const void* b;
  int64_t ldb;
  bool b_k_major;
  const void* bias;
  const void* residual;
  int64_t ld_residual;
  int64_t m, n, k;
  GemmActivation activation;
  DType in_dtype;   // f16 or bf16 (a and b)
  DType out_dtype;  // f32, f16 or bf16 (out, bias, residual)

  LLMK_HOST_DEVICE int64_t n_out() const { return activation == GemmActivation::silu_mul ? n / 2 : n; }
};

// out [m, n] = a [m, k] · b [n, k]ᵀ, both K-major, in one dtype, no epilogue: what the
// small-M kernel's other callers (rmsnorm_linear, quantized_gemm) start from.
inline GemmParams plain_gemm_params(void* out, int64_t ld_out, const void* a, int64_t lda, const void* b,
                                    int64_t ldb, int64_t m, int64_t n, int64_t k, DType dtype) {
  GemmParams g{};
  g.out = out;
  g.ld_out = ld_out;
  g.a = a;
  g.lda = lda;
  g.a_k_major = true;
  g.b = b;
  g.ldb = ldb;
  g.b_k_major = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.activation = GemmActivation::none;
  g.in_dtype = dtype;
  g.out_dtype = dtype;
  return g;
}

// rmsnorm_linear: out[i, j] = sum_k (x[i, k] * rstd_i * g[k]) * w[j, k],
// rstd_i = 1 / sqrt(mean_k x[i, k]^2 + eps); x, w and out in in_dtype, g in g_dtype
// (in_dtype or f32). Row strides in elements.
struct RmsnormLinearParams {
  void* out;
  int64_t ld_out;
  const void* x;
  int64_t ldx;
  const void* g;
  const void* w;
  int64_t ldw;
  int64_t m, n, k;
  double eps;
  DType in_dtype;
  DType g_dtype;
};

// The Hopper kernel (gemm_sm90.cu): takes the call when it returns true (an sm_90 device,
// an sm_90a build, TMA-compatible strides and pointers; any m, though the automatic path
// gives it only m above the small-M threshold).
bool gemm_sm90_takes(const GemmParams& p, int device);
void gemm_sm90_cuda(const GemmParams& p, cudaStream_t stream);

// The small-M kernel (gemm_small_m.cu): m <= kSmallM, b K-major, 16-byte aligned rows.
inline constexpr int64_t kGemmSmallM = 64;
// The automatic path gives the Hopper kernel m >= kGemmSm90FromM, the small-M kernel the
// rest (H200, Llama/Qwen projections: at m = 64 the Hopper kernel's one-block clusters ran
// 1.1-1.6x the small-M kernel; at m = 32 they were 0.7-1.1x of it).
inline constexpr int64_t kGemmSm90FromM = 33;
bool gemm_small_m_takes(const GemmParams& p);
void gemm_small_m_cuda(const GemmParams& p, cudaStream_t stream);
void rmsnorm_linear_cuda(const RmsnormLinearParams& p, cudaStream_t stream);

// The mma.sync kernel (gemm_sm80.cu): every shape, layout and alignment.
void gemm_sm80_cuda(const GemmParams& p, cudaStream_t stream);

// CPU references (gemm_cpu.cc), double accumulation.
void gemm_cpu(const GemmParams& p);
void rmsnorm_linear_cpu(const RmsnormLinearParams& p);

}  // namespace llmk::detail
