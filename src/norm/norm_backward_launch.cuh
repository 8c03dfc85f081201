// Host-side launch of the normalization backward (RMSNorm and LayerNorm): the vector path
// for aligned rows that fit in registers, else the loop path; then the deterministic
// column reductions of the partial sums into dweight (and dbias).
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
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

template <bool kCentered, bool kGate, class T, class W, int VPT>
void launch_norm_backward_vec(const NormBackwardParams& p, const NormWorkspace& ws, int threads,
                              cudaStream_t stream) {
  launch_pdl(norm_backward_vec_kernel<T, W, kVec16<T>, VPT, kCentered, kGate>, dim3(static_cast<unsigned>(p.blocks)),
             dim3(threads), 0, stream, p, ws);
}

template <bool kCentered, bool kGate = false>
void launch_norm_backward(const char* op, const NormBackwardParams& params, DType act,
                          DType affine, bool vector_ok, cudaStream_t stream) {
  int device = 0, sm_count = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  dispatch_act_weight(act, affine, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const int vpt = vector_ok ? norm_backward_vectors_per_thread(params.d / N) : 0;
    const int threads = vpt ? round_up_warp((params.d / N + vpt - 1) / vpt) : 512;
    NormBackwardParams p = params;
    // Enough blocks for ~1024 resident threads per SM (at most 8 per SM): fewer blocks
    // means fewer partial rows to write and reduce.
    const int64_t capacity = norm_backward_capacity(p.rows, sm_count);
    p.blocks = std::min(capacity, std::clamp<int64_t>(1024 / threads, 1, 8) * sm_count);
    const NormWorkspace ws = norm_workspace(p.partial, capacity, p.d, p.rows, kCentered);
    switch (vpt) {
      case 1: launch_norm_backward_vec<kCentered, kGate, T, W, 1>(p, ws, threads, stream); break;
      case 2: launch_norm_backward_vec<kCentered, kGate, T, W, 2>(p, ws, threads, stream); break;
      case 4: launch_norm_backward_vec<kCentered, kGate, T, W, 4>(p, ws, threads, stream); break;
      default: {
        const int row_blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
        launch_pdl(norm_backward_loop_kernel<T, W, kCentered, kGate>, dim3(row_blocks), dim3(512), 0, stream, p, ws);
        LLMK_CHECK_LAUNCH(op, stream);
        const dim3 grid(static_cast<unsigned>((p.d + 255) / 256), static_cast<unsigned>(p.blocks));
        launch_pdl(norm_backward_columns_kernel<T, kCentered, kGate>, grid, dim3(256), 0, stream, p, ws);
        break;
      }
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
