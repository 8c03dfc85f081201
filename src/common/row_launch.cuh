// Host-side launch of a row-wise op that has a register-resident kernel per VPT and a
// loop kernel: the vector kernel when the rows are aligned and fit (its shape from
// common/row_shape.h), else the loop kernel over 16-byte vectors (512 threads), else the
// scalar loop kernel (unaligned rows: one element per access, a block of at most 512).
// Shared by softmax (forward and backward) and cross_entropy.
#pragma once

#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/pdl_launch.h"
#include "common/row_shape.h"
#include "common/vec.cuh"

namespace llmk::detail {

// Launches `kernel` (a __global__ function taking Params) through the runtime API, so
// that kernels of different template arguments share one launch path.
template <class Params>
void launch_row_kernel(const void* kernel, int blocks, int threads, const Params& p, cudaStream_t stream) {
  void* args[] = {const_cast<Params*>(&p)};
  launch_pdl(kernel, dim3(blocks), dim3(threads), 0, stream, args);
}

// One block per row (grid-strided past kMaxRowBlocks) over p.rows rows of p.n columns.
// vec_kernel(T{}, std::integral_constant<int, VPT>{}) gives the register-resident kernel of
// element type T (nullptr: none at that VPT); loop_kernel(T{}, std::integral_constant<int, N>{})
// the loop kernel of N-element accesses (N = 16-byte vector, or 1).
template <class Params, class VecKernel, class LoopKernel>
void launch_row_op(const char* op, const Params& p, DType dtype, bool vector_ok, cudaStream_t stream,
                   VecKernel&& vec_kernel, LoopKernel&& loop_kernel) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  dispatch_dtype(dtype, op, [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = kVec16<T>;
    auto kernel_for = [&](int vpt) {
      const void* kernel = nullptr;
      dispatch_vpt(vpt, [&](auto v) { kernel = vec_kernel(T{}, v); });
      return kernel;
    };
    const RowShape shape = vector_ok ? pick_row_shape(p.rows, p.n / N, kernel_for) : RowShape{0, 0};
    if (shape.vpt != 0)
      launch_row_kernel(kernel_for(shape.vpt), blocks, shape.threads, p, stream);
    else if (vector_ok)
      launch_row_kernel(loop_kernel(T{}, std::integral_constant<int, N>{}), blocks, 512, p, stream);
    else
      launch_row_kernel(loop_kernel(T{}, std::integral_constant<int, 1>{}), blocks,
                        round_up_warp(std::min<int64_t>(p.n, 512)), p, stream);
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
