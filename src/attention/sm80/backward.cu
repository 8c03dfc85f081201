// Launcher of the attention backward: the sm_80 kernels' tile shapes of each head dim and the
// dispatch over path, dtype and head dim. Per call: the rows kernel (D, the accumulator zeroed
// unless the Hopper kernel stores each tile's first dq share, the counters zeroed), the main
// kernel (dk, dv, dq reductions: the Hopper one, sm90/backward.cu, where it takes
// the call, else the sm_80 one), the rows kernel again (dq converted). Deterministic, the
// Hopper kernel adds dq in a fixed order of key blocks (turn counters) and the rest is the same; the
// sm_80 path runs the rows kernel (D), the main kernel without dq and the dq kernel. Causal,
// varlen and GQA are run-time parameters of each kernel.
#include <type_traits>

#include "attention/sm80/backward_kernel.cuh"
#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/dispatch.h"

namespace llmk::detail {

namespace {

// Main kernel: 8 warps, one block per SM (the dK/dV accumulators take most registers).
// BackwardTile<D, kBlockM, kBlockN, kAcross, kQWarpsD, kStages> (sm80/backward_kernel.cuh):
//   D = 32: every warp owns 16 whole key rows (S^T, dP^T, dK, dV), P^T and dS^T stay in
//   registers for dV and dK.
//   D = 64 .. 256: the warps of a band of 32 keys split the columns of S^T, dP^T, dK and
//   dV 2 (D = 256: 4) ways, P^T and dS^T pass through shared memory (FlashAttention 2's sm_80
//   warp grids; the whole-key-row grid was slower at D = 64 and 128).
//   128 x 128 at D <= 64, 64 query rows x 128 keys at D = 96, 128; D = 256: 64 x 64, one
//   Q_i/dO_i buffer in swizzled rows (kSwizzleQ). Shared memory fits the A100's 163 KB.
// fp32 registers per thread for dK + dV / S^T + dP^T / dQ: D = 32: 32 / 128 / 16;
// 64: 64 / 128 / 32; 96: 96 / 64 / 24; 128: 128 / 64 / 32; 256: 128 / 32 / 64.
// Shared memory: 96 KB, 144 KB, 123 KB, 155 KB, 140 KB.
template <int kHeadDim> struct BackwardTileOf;
template <> struct BackwardTileOf<32> { using type = BackwardTile<32, 128, 128, 1, 1, 2>; };
template <> struct BackwardTileOf<64> { using type = BackwardTile<64, 128, 128, 2, 2, 2>; };
template <> struct BackwardTileOf<96> { using type = BackwardTile<96, 64, 128, 2, 2, 2>; };
template <> struct BackwardTileOf<128> { using type = BackwardTile<128, 64, 128, 2, 4, 2>; };
template <> struct BackwardTileOf<256> { using type = BackwardTile<256, 64, 64, 4, 4, 1>; };

// Deterministic dq kernel: 4 warps, the forward's shapes with S and dP in registers beside
// the dQ accumulators (D = 32, 64: 32 rows per warp; 96, 128: 16; 256: 16 rows, 32 keys).
// Shared memory: Q, dO and two K/V stages, 40 KB (D = 32) to 135 KB (D = 256).
template <int kHeadDim> struct DqTileOf;
template <> struct DqTileOf<32> { using type = DqTile<32, 128, 64>; };
template <> struct DqTileOf<64> { using type = DqTile<64, 128, 64>; };
template <> struct DqTileOf<96> { using type = DqTile<96, 64, 64>; };
template <> struct DqTileOf<128> { using type = DqTile<128, 64, 64>; };
template <> struct DqTileOf<256> { using type = DqTile<256, 64, 32>; };

constexpr int kRowsPerBlock = 64;  // attention_backward_rows_kernel

int blocks(int n, int per_block) { return (n + per_block - 1) / per_block; }

template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class T, int kHeadDim>
void launch(const AttentionBackwardParams& p, bool hopper, DType dtype, cudaStream_t stream) {
  using Tile = typename BackwardTileOf<kHeadDim>::type;
  using Dq = typename DqTileOf<kHeadDim>::type;
  const AttentionParams& f = p.fwd;
  const bool rows = f.seqlen_q > 0 && f.heads_q > 0 && f.batch > 0;
  const dim3 row_grid(blocks(f.seqlen_q, kRowsPerBlock), f.heads_q, f.batch);
  if (rows) {
    attention_backward_rows_kernel<T, kHeadDim><<<row_grid, 128, 0, stream>>>(p, false);
    LLMK_CHECK_LAUNCH("attention_backward_rows_kernel (D)", stream);
  }
  if (hopper) {
    attention_backward_sm90(p, dtype, stream);
  } else if (f.seqlen_k > 0 && p.heads_kv > 0 && f.batch > 0) {
    auto kernel = &attention_backward_kernel<T, Tile>;
    allow_smem(kernel, Tile::kSmemBytes);
    kernel<<<dim3(blocks(f.seqlen_k, Tile::kBlockN), p.heads_kv, f.batch), Tile::kThreads, Tile::kSmemBytes,
             stream>>>(p);
    LLMK_CHECK_LAUNCH("attention_backward_kernel", stream);
  }
  if (!rows) return;
  if (p.dq_accum) {
    attention_backward_rows_kernel<T, kHeadDim><<<row_grid, 128, 0, stream>>>(p, true);
    LLMK_CHECK_LAUNCH("attention_backward_rows_kernel (dq)", stream);
    return;
  }
  auto kernel = &attention_backward_dq_kernel<T, Dq>;
  allow_smem(kernel, Dq::kSmemBytes);
  kernel<<<dim3(blocks(f.seqlen_q, Dq::kBlockM), f.heads_q, f.batch), Dq::kThreads, Dq::kSmemBytes, stream>>>(p);
  LLMK_CHECK_LAUNCH("attention_backward_dq_kernel", stream);
}

}  // namespace

void attention_backward_cuda(const AttentionBackwardParams& p, DType dtype, cudaStream_t stream) {
  const char* op = "attention_backward";
  LLMK_CHECK(dtype == DType::f16 || dtype == DType::bf16, op, ": dtype ", dtype_name(dtype),
             " is not float16 or bfloat16");
  const bool hopper = attention_runs_sm90(
      op, [&](int device, const char** why) { return attention_backward_sm90_takes(p, dtype, device, why); });
  // The score variants are compiled into the Hopper kernels only (nothing written).
  LLMK_CHECK(hopper || !p.fwd.variants.any(), op, ": window, softcap and sinks run on the Hopper backward (an sm_90 "
             "GPU, an sm_90a build, head dims 64-256) and on the CPU backend; this call would run the sm_80 kernel");
  AttentionBackwardParams run = p;
  if (hopper) {
    attention_backward_sm90_plan(run);
  } else {
    run.dq_counters = nullptr;
    if (run.dq_ordered) run.dq_accum = nullptr;  // deterministic on sm_80: the dq kernel
  }
  dispatch_dtype(dtype, op, [&](auto tag) {
    if constexpr (decltype(tag)::value != DType::f32) {
      using T = device_type_t<decltype(tag)>;
      for_compiled_head_dim(op, p.fwd.head_dim,
                            [&](auto dim) { launch<T, decltype(dim)::value>(run, hopper, dtype, stream); });
    }
  });
}

}  // namespace llmk::detail
