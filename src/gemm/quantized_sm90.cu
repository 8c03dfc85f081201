// Launcher of the Hopper kernel of quantized_gemm (quantized_sm90_kernel.cuh): x permuted
// into scratch memory, the TMA maps, the split along K (a cluster of pieces per row block).
//
// Instantiations (the only list): {bf16, fp16} x {64, 128} tokens, int4 codes.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "common/scratch.h"
#include "common/sm90/kernel_support.h"
#include "common/sm90/tma.h"
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

// Pieces of K (the blocks of a row block's cluster) for `row_blocks` blocks of C::kRows rows: as
// many as fill the SMs once, each >= 2 blocks of 128 k, at most a portable cluster (8), and
// every row block's cluster resident at once (a second wave of clusters would double the
// time).
template <class C>
int k_pieces(const void* kernel, const QuantizedParams& p, int64_t row_blocks, int device) {
  const int64_t k_blocks = p.k / 128;
  int64_t pieces = std::max<int64_t>(1, sm_count_of(device) / row_blocks);
  pieces = std::min<int64_t>({pieces, std::max<int64_t>(1, k_blocks / 2), int64_t{C::kMaxPieces}});
  for (; pieces > 1; --pieces)
    if (row_blocks <= resident_clusters(kernel, C::kThreads, C::kSharedBytes, static_cast<int>(pieces), device)) break;
  return static_cast<int>(pieces);
}

template <class T, int kTokens>
void launch(const QuantizedParams& p, int device, cudaStream_t stream) {
  using C = QuantSm90Config<kTokens>;
  constexpr const char* kOp = "quantized_gemm";
  // x in the kernel's k order, contiguous.
  T* xp = static_cast<T*>(scratch_alloc(sizeof(T) * static_cast<size_t>(p.m * p.k), device, stream));
  const dim3 permute_grid(static_cast<unsigned>((p.k / 8 + 255) / 256), static_cast<unsigned>(p.m));
  launch_pdl(sm90::quantized_permute_x_kernel<T>, permute_grid, dim3(256), 0, stream, static_cast<const T*>(p.x), p.ldx,
             xp, p.k);
  // x: [m, k] in boxes of kTokens rows x 64 k (rows past m read as zeros); codes: [n, k / 8]
  // 32-bit words in boxes of kRows rows x 16 words (TMA copies them as opaque 4-byte elements).
  const CUtensorMap map_x = sm90::make_tma_2d(
      kOp, {xp, p.dtype, uint64_t(p.m), uint64_t(p.k), uint64_t(p.k), static_cast<uint32_t>(kTokens), 64});
  const CUtensorMap map_codes = sm90::make_tma(
      kOp, sm90::TmaShape{p.packed, DType::f32, 2, {uint64_t(p.k / 8), uint64_t(p.n)}, {1, uint64_t(p.k / 8)},
                          {16, static_cast<uint32_t>(C::kRows)}, false});
  const int64_t row_blocks = (p.n + C::kRows - 1) / C::kRows;
  QuantSm90Args args{};
  args.p = p;
  args.out = plain_gemm_params(p.out, p.ld_out, p.x, p.ldx, p.packed, p.k / 8, p.m, p.n, p.k, p.dtype);
  args.out.bias = p.bias;
  args.k_blocks = static_cast<int>(p.k / 128);

  // Set per call, as the dense kernel's launcher does: each device's context holds its own.
  const void* kernel = kernel_for<T, kTokens>();
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSharedBytes));
  int pieces = k_pieces<C>(kernel, p, row_blocks, device);
  args.piece_blocks = (args.k_blocks + pieces - 1) / pieces;
  pieces = (args.k_blocks + args.piece_blocks - 1) / args.piece_blocks;  // every piece non-empty
  void* params[] = {const_cast<CUtensorMap*>(&map_x), const_cast<CUtensorMap*>(&map_codes), &args};
  launch_pdl_cluster(kernel, dim3(static_cast<unsigned>(pieces), static_cast<unsigned>(row_blocks)), dim3(C::kThreads),
                     C::kSharedBytes, stream, params, static_cast<unsigned>(pieces));
  scratch_free(xp, stream);
  LLMK_CHECK_LAUNCH(kOp, stream);
}

}  // namespace

bool quantized_sm90_takes(const QuantizedParams& p, int device) {
  if (p.bits != 4 || p.m < 1 || p.m > kQuantizedSm90MaxM || p.k % 128 != 0 || p.group_size % 128 != 0) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  // The grid's y holds the row blocks (at most 65535, of 128 rows above 64 tokens); scale
  // offsets are 32-bit.
  if (reinterpret_cast<uintptr_t>(p.packed) % 16 != 0 || p.n > int64_t{65535} * 128 || p.k >= (int64_t{1} << 31) ||
      p.n * (p.k / p.group_size) >= (int64_t{1} << 31))
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
