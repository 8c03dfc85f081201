// Host-side launch of the normalization backward (RMSNorm and LayerNorm): the warp path for
// LayerNorm's rows of 33-128 vectors (LayerNorm's alone), the vector path for other aligned rows that fit in
// registers, else the loop path; then the deterministic column reductions of the partial
// sums into dweight (and dbias).
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "norm/norm_backward_kernel.cuh"
#include "norm/norm_launch.cuh"

namespace llmk::detail {

// Partial rows a call may use on a device with `sm_count` SMs (the workspace holds this
// many): enough for ~1024 resident threads per SM with the smallest blocks.
inline int64_t norm_backward_capacity(int64_t rows, int sm_count) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{8} * sm_count));
}

// f32 elements of workspace the backward needs.
inline int64_t norm_backward_workspace_elems(int64_t rows, int64_t d, bool centered, int sm_count) {
  if (rows == 0) return 0;
  return (centered ? 2 : 1) * norm_backward_capacity(rows, sm_count) * d + 2 * rows;
}

// Vectors per thread of the backward: the fewest that keep a block at or under 512
// threads; at most 4, so that x, dy and the gradient accumulators stay in registers.
inline int norm_backward_vectors_per_thread(int64_t n) {
  for (int vpt : {1, 2, 4})
    if ((n + vpt - 1) / vpt <= 512) return vpt;
  return 0;
}

// The backward's warp path: LayerNorm's (the forward's norm_has_warp), the only op whose rule
// takes it.
template <bool kCentered, bool kGate>
constexpr bool norm_backward_has_warp() {
  return kCentered && !kGate;
}

// Whether the warp path takes the call: LayerNorm, 33-128 vectors, over many rows by the
// rule or when LLMK_NORM_PATH=warp asks; few rows never by the rule (one row per block of
// the vector path gives the shortest latency).
template <bool kCentered, bool kGate>
bool norm_backward_takes_warp(NormPath asked, int64_t rows, int64_t vectors, int sm_count) {
  if (!norm_backward_has_warp<kCentered, kGate>() || vectors < kWarpMinVectors || vectors > kWarpMaxVectors)
    return false;
  if (asked == NormPath::warp) return true;
  return asked == NormPath::automatic && !few_rows(rows, sm_count);
}

template <bool kCentered, bool kGate = false>
void launch_norm_backward(const char* op, const NormBackwardParams& params, DType act,
                          DType affine, bool vector_ok, cudaStream_t stream) {
  const NormPath asked = norm_path(op);
  int device = 0, sm_count = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  dispatch_act_weight(act, affine, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const int64_t vectors = params.d / N;
    NormBackwardParams p = params;
    const int64_t capacity = norm_backward_capacity(p.rows, sm_count);
    const NormWorkspace ws = norm_workspace(p.partial, capacity, p.d, p.rows, kCentered);
    bool launched = false;
    if constexpr (norm_backward_has_warp<kCentered, kGate>()) {
      if (vector_ok && norm_backward_takes_warp<kCentered, kGate>(asked, p.rows, vectors, sm_count)) {
        auto launch = [&](auto vpl) {
          constexpr int kVpl = decltype(vpl)::value;
          const auto kernel = norm_backward_warp_kernel<T, W, N, kVpl, kCentered>;
          constexpr int kSmem = norm_backward_warp_smem_bytes<kVpl, N, kCentered>();
          LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
          // One persistent block per SM: each block writes one partial row.
          p.blocks = std::min({capacity, (p.rows + kNormBackwardWarps - 1) / kNormBackwardWarps, int64_t{sm_count}});
          launch_pdl(kernel, dim3(static_cast<unsigned>(p.blocks)), dim3(kNormBackwardWarps * 32), kSmem, stream, p,
                     ws);
        };
        if (vectors <= 64) launch(std::integral_constant<int, 2>{});
        else if (vectors <= 96) launch(std::integral_constant<int, 3>{});
        else launch(std::integral_constant<int, 4>{});
        launched = true;
      }
    }
    const int vpt = vector_ok && !launched ? norm_backward_vectors_per_thread(vectors) : 0;
    if (!launched && vpt != 0) {
      const int threads = round_up_warp((vectors + vpt - 1) / vpt);
      auto launch = [&](auto v, auto rows_in_flight) {
        const auto kernel =
            norm_backward_vec_kernel<T, W, N, decltype(v)::value, kCentered, kGate, decltype(rows_in_flight)::value>;
        // Enough blocks for ~1024 resident threads per SM (at most 8 per SM): fewer blocks
        // means fewer partial rows to write and reduce. The rule also keeps to the blocks
        // that are resident at once: LayerNorm's 80-register 512-thread blocks fit one per
        // SM, and a second wave of persistent blocks only doubled the partial rows
        // (LLMK_NORM_PATH=vec: the count without that limit, as before).
        int64_t per_sm = std::clamp<int64_t>(1024 / threads, 1, 8);
        if (asked != NormPath::vec)
          per_sm = std::min<int64_t>(
              per_sm, std::max(1, kernel_fit(reinterpret_cast<const void*>(kernel), threads, device).blocks_per_sm));
        p.blocks = std::min(capacity, per_sm * sm_count);
        launch_pdl(kernel, dim3(static_cast<unsigned>(p.blocks)), dim3(threads), 0, stream, p, ws);
      };
      using One = std::integral_constant<int, 1>;
      using Two = std::integral_constant<int, 2>;
      switch (vpt) {
        case 1:
          // LayerNorm and the gated form: one row in flight, two blocks per SM
          // (norm_backward_vec_kernel's R).
          if constexpr (kCentered || kGate) {
            if (asked != NormPath::vec) {
              launch(One{}, One{});
              break;
            }
          }
          launch(One{}, Two{});
          break;
        case 2: launch(Two{}, Two{}); break;
        default: launch(std::integral_constant<int, 4>{}, One{}); break;
      }
      launched = true;
    }
    if (!launched) {  // unaligned, or longer than the vector path holds
      p.blocks = std::min(capacity, int64_t{2} * sm_count);
      const int row_blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
      launch_pdl(norm_backward_loop_kernel<T, W, kCentered, kGate>, dim3(row_blocks), dim3(512), 0, stream, p, ws);
      LLMK_CHECK_LAUNCH(op, stream);
      const dim3 grid(static_cast<unsigned>((p.d + 255) / 256), static_cast<unsigned>(p.blocks));
      launch_pdl(norm_backward_columns_kernel<T, kCentered, kGate>, grid, dim3(256), 0, stream, p, ws);
    }
    LLMK_CHECK_LAUNCH(op, stream);
    if (p.dweight != nullptr) {
      launch_column_reduce(ws.dweight, static_cast<W*>(p.dweight), p.blocks, p.d, stream);
      LLMK_CHECK_LAUNCH(op, stream);
    }
    if (kCentered && p.dbias != nullptr) {
      launch_column_reduce(ws.dbias, static_cast<W*>(p.dbias), p.blocks, p.d, stream);
      LLMK_CHECK_LAUNCH(op, stream);
    }
  });
}

}  // namespace llmk::detail
