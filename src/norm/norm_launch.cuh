// Host-side launch of the normalization forward kernels (RMSNorm, RMSNorm with residual
// add or a SiLU gate, LayerNorm): picks the vector kernel's shape from the row length and the compiled
// kernels' occupancy, or the loop kernel for unaligned rows.
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/pdl_launch.h"
#include "common/row_shape.h"
#include "norm/norm_kernel.cuh"

namespace llmk::detail {

template <bool kAdd, bool kCentered, bool kGate, class T, class W>
const void* norm_vec_kernel_for(int vpt) {
  const void* kernel = nullptr;
  dispatch_vpt(vpt, [&](auto v) {
    kernel = reinterpret_cast<const void*>(norm_vec_kernel<T, W, kVec16<T>, decltype(v)::value, kAdd, kCentered, kGate>);
  });
  return kernel;
}

// The vector kernel's shape (common/row_shape.h) for rows of n 16-byte vectors.
template <bool kAdd, bool kCentered, bool kGate, class T, class W>
RowShape norm_shape(int64_t rows, int64_t n) {
  return pick_row_shape(rows, n, [](int vpt) { return norm_vec_kernel_for<kAdd, kCentered, kGate, T, W>(vpt); });
}

// `act`: x's dtype; `affine`: the weight's (and bias's) dtype. `vector_ok`: every pointer
// and row stride is aligned to 16 bytes and d to the vector.
template <bool kAdd, bool kCentered, bool kGate = false>
void launch_norm(const char* op, const NormParams& p, DType act, DType affine, bool vector_ok,
                 cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  dispatch_act_weight(act, affine, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const RowShape shape =
        vector_ok ? norm_shape<kAdd, kCentered, kGate, T, W>(p.rows, p.d / N) : RowShape{0, 0};
    // Rows of at most 32 vectors: 256-thread blocks of 256 / lanes rows.
    const bool short_rows = shape.vpt == 1 && p.d / N <= 32;
    dim3 block(shape.threads), grid(blocks);
    if (short_rows) {
      unsigned lanes = 1;
      while (lanes < p.d / N) lanes *= 2;
      block = dim3(lanes, 256 / lanes);
      grid = dim3(static_cast<unsigned>(std::min((p.rows + block.y - 1) / block.y, kMaxRowBlocks)));
    }
    const bool vector_launched = dispatch_vpt(shape.vpt, [&](auto v) {
      launch_pdl(norm_vec_kernel<T, W, N, decltype(v)::value, kAdd, kCentered, kGate>, grid, block, 0, stream, p);
    });
    if (!vector_launched)
      launch_pdl(norm_loop_kernel<T, W, kAdd, kCentered, kGate>, dim3(blocks),
                 dim3(round_up_warp(std::min<int64_t>(p.d, 512))), 0, stream, p);
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
