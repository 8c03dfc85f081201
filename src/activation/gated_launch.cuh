// Host-side launch of the gated activation kernels: the 2-d launch geometry and the
// dispatch over activation, dtype and vector width shared by the forward and backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "activation/gated_kernel.cuh"
#include "common/cuda_check.h"
#include "common/pdl_launch.h"

namespace llmk::detail {

// 256 threads: x over the row's vectors (a power of two, up to 256), y over rows.
// (Spreading a lone row over ~one block per SM, as Inductor's kernels do, was no faster.)
struct GatedGeometry {
  dim3 grid, block;
};

inline GatedGeometry gated_geometry(int64_t rows, int64_t vectors_per_row) {
  int tx = 1;
  while (tx < 256 && tx < vectors_per_row) tx *= 2;
  const int ty = 256 / tx;
  const int64_t blocks_x = (vectors_per_row + tx - 1) / tx;
  // gridDim.y is at most 65535; further rows are grid-strided.
  const int64_t blocks_y = std::min<int64_t>((rows + ty - 1) / ty, 65535);
  return {dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y)), dim3(tx, ty)};
}

// Calls f(type tag, vector width, activation constant) for the run-time choices.
template <class F>
void dispatch_gated(Activation act, DType dtype, bool vector_ok, const char* op, F&& f) {
  dispatch_dtype(dtype, op, [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    auto with_width = [&](auto act_constant) {
      if (vector_ok) f(tag, std::integral_constant<int, kVec16<T>>{}, act_constant);
      else f(tag, std::integral_constant<int, 1>{}, act_constant);
    };
    switch (act) {
      case Activation::silu: with_width(std::integral_constant<Activation, Activation::silu>{}); break;
      case Activation::gelu: with_width(std::integral_constant<Activation, Activation::gelu>{}); break;
      case Activation::gelu_tanh: with_width(std::integral_constant<Activation, Activation::gelu_tanh>{}); break;
    }
  });
}

// The forward (GatedParams) or backward (GatedBackwardParams) kernel for the run-time
// choices of activation, dtype and vector width.
template <class Params>
void launch_gated(const char* op, const Params& p, Activation act, DType dtype, bool vector_ok,
                  cudaStream_t stream) {
  constexpr bool kBackward = std::is_same_v<Params, GatedBackwardParams>;
  dispatch_gated(act, dtype, vector_ok, op, [&](auto tag, auto width, auto act_constant) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = decltype(width)::value;
    constexpr Activation A = decltype(act_constant)::value;
    const GatedGeometry g = gated_geometry(p.rows, p.d / N);
    if constexpr (kBackward) launch_pdl(gated_backward_kernel<T, N, A>, g.grid, g.block, 0, stream, p);
    else launch_pdl(gated_forward_kernel<T, N, A>, g.grid, g.block, 0, stream, p);
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
