// Launcher of the Hopper kernel of quantized_gemm (quantized_sm90_kernel.cuh): x permuted
// into scratch memory, the TMA maps, the split along K, the reduction with the bias.
//
// Instantiations (the only list): {bf16, fp16} x {64, 128} tokens, int4 codes; the
// reduction: gemm_split_reduce_kernel {bf16, fp16} x none.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/scratch.h"
#include "common/sm90/kernel_support.h"
#include "common/sm90/tma.h"
#include "gemm/gemm_split_reduce.cuh"
#include "gemm/quantized.h"
#include "gemm/quantized_sm90_kernel.cuh"

namespace llmk::detail {

namespace {

using sm90::QuantSm90Args;
using sm90::QuantSm90Config;

template <class T, int kTokens>
const void* kernel_for() {
  return reinterpret_cast<const void*>(sm90::quantized_sm90_kernel<T, kTokens>);
}

// Pieces of K for `row_blocks` blocks of 256 rows: as many as fill the SMs once, each >= 2
// blocks of 128 k, and a piece's partial sums (4 m bytes per row) at most twice its codes
// (k / (2 pieces) bytes per row): k / (4 m) pieces.
int k_pieces(const QuantizedParams& p, int64_t row_blocks, int sms) {
  const int64_t k_blocks = p.k / 128;
  int64_t pieces = std::max<int64_t>(1, sms / row_blocks);
  pieces = std::min<int64_t>(pieces, std::max<int64_t>(1, k_blocks / 2));
  pieces = std::min<int64_t>(pieces, std::max<int64_t>(1, p.k / (4 * p.m)));
  return static_cast<int>(std::min<int64_t>(pieces, 16));
}

template <class T, int kTokens>
void launch(const QuantizedParams& p, int device, cudaStream_t stream) {
  using C = QuantSm90Config<kTokens>;
  constexpr const char* kOp = "quantized_gemm";
  // x in the kernel's k order, contiguous.
  T* xp = static_cast<T*>(scratch_alloc(sizeof(T) * static_cast<size_t>(p.m * p.k), device, stream));
  const int64_t pairs = p.m * p.k / 2;
  const unsigned permute_grid =
      static_cast<unsigned>(std::min<int64_t>((pairs + 255) / 256, int64_t{8} * sm_count_of(device)));
  sm90::quantized_permute_x_kernel<T><<<permute_grid, 256, 0, stream>>>(static_cast<const T*>(p.x), p.ldx, xp, p.m,
                                                                          p.k);
  // x: [m, k] in boxes of kTokens rows x 64 k (rows past m read as zeros); codes: [n, k / 8]
  // 32-bit words in boxes of 256 rows x 16 words (TMA copies them as opaque 4-byte elements).
  const CUtensorMap map_x = sm90::make_tma_2d(
      kOp, {xp, p.dtype, uint64_t(p.m), uint64_t(p.k), uint64_t(p.k), static_cast<uint32_t>(kTokens), 64});
  const CUtensorMap map_codes = sm90::make_tma(
      kOp, sm90::TmaShape{p.packed, DType::f32, 2, {uint64_t(p.k / 8), uint64_t(p.n)}, {1, uint64_t(p.k / 8)},
                          {16, static_cast<uint32_t>(C::kRows)}, false});
  const int64_t row_blocks = (p.n + C::kRows - 1) / C::kRows;
  QuantSm90Args args{};
  args.p = p;
  args.k_blocks = static_cast<int>(p.k / 128);
  int pieces = k_pieces(p, row_blocks, sm_count_of(device));
  args.piece_blocks = (args.k_blocks + pieces - 1) / pieces;
  pieces = (args.k_blocks + args.piece_blocks - 1) / args.piece_blocks;  // every piece non-empty
  args.ld_partial = (p.n + 3) / 4 * 4;
  args.partial = static_cast<float*>(
      scratch_alloc(sizeof(float) * static_cast<size_t>(pieces * p.m * args.ld_partial), device, stream));

  // Set per call, as the dense kernel's launcher does: each device's context holds its own.
  LLMK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel_for<T, kTokens>(), cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSharedBytes));
  sm90::quantized_sm90_kernel<T, kTokens>
      <<<dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(pieces)), C::kThreads, C::kSharedBytes,
         stream>>>(map_x, map_codes, args);

  GemmParams g = plain_gemm_params(p.out, p.ld_out, p.x, p.ldx, p.packed, p.k / 8, p.m, p.n, p.k, p.dtype);
  g.bias = p.bias;
  const int64_t items = p.m * (args.ld_partial / 4);
  const unsigned reduce_grid =
      static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, int64_t{8} * sm_count_of(device)));
  gemm_split_reduce_kernel<T, GemmActivation::none>
      <<<reduce_grid, 256, 0, stream>>>(g, args.partial, pieces, args.ld_partial);
  scratch_free(args.partial, stream);
  scratch_free(xp, stream);
  LLMK_CHECK_LAUNCH(kOp, stream);
}

}  // namespace

bool quantized_sm90_takes(const QuantizedParams& p, int device) {
  if (p.bits != 4 || p.m < 1 || p.m > kQuantizedSm90MaxM || p.k % 128 != 0 || p.group_size % 128 != 0) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if (reinterpret_cast<uintptr_t>(p.packed) % 16 != 0 || p.n >= (int64_t{1} << 31) || p.k >= (int64_t{1} << 31))
    return false;
  if (!scratch_available(device)) return false;
  return sm90::sm90a_kernel_runs(kernel_for<__nv_bfloat16, 128>(), device);
}

void quantized_gemm_sm90_cuda(const QuantizedParams& p, cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const bool few = p.m <= 64;
  if (p.dtype == DType::bf16) {
    if (few) launch<__nv_bfloat16, 64>(p, device, stream);
    else launch<__nv_bfloat16, 128>(p, device, stream);
  } else {
    if (few) launch<__half, 64>(p, device, stream);
    else launch<__half, 128>(p, device, stream);
  }
}

}  // namespace llmk::detail
