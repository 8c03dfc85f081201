// Launcher of the attention forward's sm_80 kernel (the choice between it and the Hopper
// kernel: attention_path.cc): the tile shape of each head dim and the dispatch
// over dtype (fp16, bf16) and head dim. Every (dtype, head dim) pair is one kernel;
// causal, varlen and GQA are run-time parameters of it.
#include <cstdint>

#include "attention/sm80/forward_kernel.cuh"
#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/dispatch.h"

namespace llmk::detail {

namespace {

// 128 query rows per block as 4 warps of 2 x 16 rows: each K and V fragment loaded from
// shared memory feeds two mma tiles. D = 256 keeps its 128 fp32 O registers per thread
// with 64-row blocks of 4 warps x 16 rows (two blocks per SM; 8 warps x 16 rows of 128 was
// slower). Key-block widths the fastest measured (docs/history/attention.md):
// 128 keys at D <= 64 and 64 at D >= 96, without spills since the tile loads walk their
// rows by pointer increments; 8-warp and 64-row shapes were slower at D = 64 and 128.
// Shared memory: (kBlockM + 2 kBlockN) rows of D + 8 elements, 30 KB (D = 32) to 101 KB
// (D = 256); 248-255 registers per thread: 2 blocks (8 warps) per SM at every head dim.
template <int kHeadDim> struct TileOf;
template <> struct TileOf<32> { using type = ForwardTile<32, 128, 128, 4>; };
template <> struct TileOf<64> { using type = ForwardTile<64, 128, 128, 4>; };
template <> struct TileOf<96> { using type = ForwardTile<96, 128, 64, 4>; };
template <> struct TileOf<128> { using type = ForwardTile<128, 128, 64, 4>; };
template <> struct TileOf<256> { using type = ForwardTile<256, 64, 64, 4>; };

template <class T, class Tile>
void launch(const AttentionParams& p, cudaStream_t stream) {
  const void* kernel = reinterpret_cast<const void*>(&attention_forward_kernel<T, Tile>);
  const int smem = Tile::kSmemElems * static_cast<int>(sizeof(T));
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid((p.seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, p.heads_q, p.batch);
  attention_forward_kernel<T, Tile><<<grid, Tile::kThreads, smem, stream>>>(p);
}

}  // namespace

void attention_forward_sm80(const AttentionParams& p, DType dtype, cudaStream_t stream) {
  const char* op = "attention_forward_kernel";
  LLMK_CHECK(dtype == DType::f16 || dtype == DType::bf16, "attention: dtype ", dtype_name(dtype),
             " is not float16 or bfloat16");
  dispatch_dtype(dtype, op, [&](auto tag) {
    if constexpr (decltype(tag)::value != DType::f32) {
      using T = device_type_t<decltype(tag)>;
      for_compiled_head_dim("attention", p.head_dim, [&](auto dim) {
        launch<T, typename TileOf<decltype(dim)::value>::type>(p, stream);
      });
    }
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
