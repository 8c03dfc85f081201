// Launcher of the mma.sync GEMM (kernel and design in gemm_sm80_kernel.cuh).
//
// Instantiations (the only list): {f16, bf16} x {A K-major, M-major} x {B K-major,
// N-major} x {16-byte aligned operands, element-wise loads} = 16 kernels. The out dtype,
// bias, residual and activation are run-time branches of the epilogue.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "gemm/gemm.h"
#include "gemm/gemm_sm80_kernel.cuh"

namespace llmk::detail {

namespace {

using sm80::Config;

// The 16-byte cp.async path needs each operand's data pointer 16-byte aligned, its
// non-contiguous stride a whole number of 16-byte vectors (unless the dimension it steps
// over has size 1) and, for silu_mul with an N-major b, the up half starting on a vector.
bool operands_aligned(const GemmParams& p) {
  auto ok = [](const void* ptr, int64_t ld, int64_t stepped) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (stepped <= 1 || (ld * 2) % 16 == 0);
  };
  const bool silu = p.activation == GemmActivation::silu_mul;
  return ok(p.a, p.lda, p.a_k_major ? p.m : p.k) && ok(p.b, p.ldb, p.b_k_major ? p.n : p.k) &&
         !(silu && !p.b_k_major && (p.n / 2) % 8 != 0);
}

template <class T, bool kAK, bool kBK, bool kAligned>
void launch(const GemmParams& p, unsigned grid, cudaStream_t stream) {
  sm80::gemm_sm80_kernel<T, kAK, kBK, kAligned><<<grid, Config::kThreads, 0, stream>>>(p);
}

template <class T>
void launch_typed(const GemmParams& p, unsigned grid, bool aligned, cudaStream_t stream) {
  auto with_a_layout = [&](auto ak) {
    constexpr bool kAK = decltype(ak)::value;
    auto with_b_layout = [&](auto bk) {
      constexpr bool kBK = decltype(bk)::value;
      if (aligned) launch<T, kAK, kBK, true>(p, grid, stream);
      else launch<T, kAK, kBK, false>(p, grid, stream);
    };
    if (p.b_k_major) with_b_layout(std::true_type{});
    else with_b_layout(std::false_type{});
  };
  if (p.a_k_major) with_a_layout(std::true_type{});
  else with_a_layout(std::false_type{});
}

}  // namespace

void gemm_sm80_cuda(const GemmParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n_out() == 0) return;
  const int64_t out_cols = p.activation == GemmActivation::silu_mul ? Config::kBlockN / 2 : Config::kBlockN;
  const int64_t tiles = ((p.m + Config::kBlockM - 1) / Config::kBlockM) * ((p.n_out() + out_cols - 1) / out_cols);
  LLMK_CHECK(tiles <= INT_MAX, "gemm: ", tiles, " output tiles of 128 x ", out_cols,
             " exceed the mma.sync kernel's grid (m ", p.m, ", n ", p.n, ")");
  const bool aligned = operands_aligned(p);
  const unsigned grid = static_cast<unsigned>(tiles);
  if (p.in_dtype == DType::f16) launch_typed<__half>(p, grid, aligned, stream);
  else if (p.in_dtype == DType::bf16) launch_typed<__nv_bfloat16>(p, grid, aligned, stream);
  else throw_error("gemm: the mma.sync kernel takes float16 or bfloat16 inputs, got ", dtype_name(p.in_dtype));
  LLMK_CHECK_LAUNCH("gemm_sm80_kernel", stream);
}

}  // namespace llmk::detail
