// Host-side launch of the normalization forward kernels (RMSNorm, RMSNorm with residual
// add or a SiLU gate, LayerNorm): picks the vector kernel's shape from the row length and the compiled
// kernels' occupancy, or the loop kernel for unaligned rows.
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
#include "common/occupancy.h"
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

// RMSNorm (plain or with the residual add) over many rows of at least kStreamMinVectors
// 16-byte vectors takes the streaming kernel (norm_loop_kernel with vectors): holding no
// row it runs 2048 threads per SM at 32 registers and re-reads the row from L2, where the
// register kernel's 40-62 registers leave a quarter to half of the SM's threads (and their
// loads) out. Measured (H200, bf16, 8192 rows): 4% faster at 4096 columns, 9-13% at 5120
// and 8192, 17-28% for add_rmsnorm at 8192-16384; from 64 vectors the gains at 896-2048
// columns were 3-4% for rmsnorm and 1-3% losses for add_rmsnorm. LayerNorm (a third pass
// for the centered sum) and the gated form (a third input) lost 0-26% this way and keep
// the register kernel, as do few rows (decode): one memory round trip.
inline constexpr int64_t kStreamMinVectors = 512;

inline int stream_threads(int64_t vectors) {
  return round_up_warp(std::min<int64_t>((vectors + 1) / 2, 1024));
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
    const int64_t vectors = p.d / N;
    if constexpr (!kCentered && !kGate) {
      if (vector_ok && vectors >= kStreamMinVectors) {
        int device = 0;
        LLMK_CUDA_CHECK(cudaGetDevice(&device));
        if (!few_rows(p.rows, sm_count_of(device))) {
          launch_pdl(norm_loop_kernel<T, W, N, kAdd, kCentered, kGate>, dim3(blocks), dim3(stream_threads(vectors)),
                     0, stream, p);
          return;
        }
      }
    }
    const RowShape shape =
        vector_ok ? norm_shape<kAdd, kCentered, kGate, T, W>(p.rows, vectors) : RowShape{0, 0};
    // Rows of at most 32 vectors: 256-thread blocks of 256 / lanes rows.
    const bool short_rows = shape.vpt == 1 && vectors <= 32;
    dim3 block(shape.threads), grid(blocks);
    if (short_rows) {
      unsigned lanes = 1;
      while (lanes < vectors) lanes *= 2;
      block = dim3(lanes, 256 / lanes);
      grid = dim3(static_cast<unsigned>(std::min((p.rows + block.y - 1) / block.y, kMaxRowBlocks)));
    }
    const bool vector_launched = dispatch_vpt(shape.vpt, [&](auto v) {
      launch_pdl(norm_vec_kernel<T, W, N, decltype(v)::value, kAdd, kCentered, kGate>, grid, block, 0, stream, p);
    });
    if (!vector_launched)
      launch_pdl(norm_loop_kernel<T, W, 1, kAdd, kCentered, kGate>, dim3(blocks),
                 dim3(round_up_warp(std::min<int64_t>(p.d, 512))), 0, stream, p);
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
