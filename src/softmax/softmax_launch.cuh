// Host-side launch of the softmax kernels, forward (SoftmaxParams) and backward
// (SoftmaxBackwardParams): the register-resident vector kernel when the row is aligned and
// fits (its shape from common/row_shape.h), else the two-pass loop kernel.
#pragma once

#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/row_shape.h"
#include "softmax/softmax_backward_kernel.cuh"
#include "softmax/softmax_kernel.cuh"

namespace llmk::detail {

// The backward holds two rows (y and dy) in registers: at 16 vectors per thread it would
// spill, so it stops at 8 (rows up to 4096 vectors) and longer rows take the loop kernel.
template <class Params, class T, int N, int VPT, bool kLog>
const void* softmax_vec_kernel_ptr() {
  if constexpr (std::is_same_v<Params, SoftmaxBackwardParams>) {
    if constexpr (VPT > 8) return nullptr;
    else return reinterpret_cast<const void*>(softmax_backward_vec_kernel<T, N, VPT, kLog>);
  } else
    return reinterpret_cast<const void*>(softmax_vec_kernel<T, N, VPT, kLog>);
}

template <class Params, class T, int N, bool kLog>
const void* softmax_loop_kernel_ptr() {
  if constexpr (std::is_same_v<Params, SoftmaxBackwardParams>)
    return reinterpret_cast<const void*>(softmax_backward_loop_kernel<T, N, kLog>);
  else
    return reinterpret_cast<const void*>(softmax_loop_kernel<T, N, kLog>);
}

// Launches `kernel` (a __global__ function taking Params) through the runtime API, so
// that the forward and backward share one launch path.
template <class Params>
void launch_row_kernel(const void* kernel, int blocks, int threads, const Params& p, cudaStream_t stream) {
  void* args[] = {const_cast<Params*>(&p)};
  LLMK_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(blocks), dim3(threads), args, 0, stream));
}

template <class Params>
void launch_softmax(const char* op, const Params& p, bool log, DType dtype, bool vector_ok,
                    cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  dispatch_dtype(dtype, op, [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = kVec16<T>;
    auto with_log = [&](auto log_constant) {
      constexpr bool kLog = decltype(log_constant)::value;
      auto kernel_for = [](int vpt) {
        const void* kernel = nullptr;
        dispatch_vpt(vpt, [&](auto v) { kernel = softmax_vec_kernel_ptr<Params, T, kVec16<T>, decltype(v)::value, kLog>(); });
        return kernel;
      };
      const RowShape shape = vector_ok ? pick_row_shape(p.rows, p.n / N, kernel_for) : RowShape{0, 0};
      if (shape.vpt != 0)
        launch_row_kernel(kernel_for(shape.vpt), blocks, shape.threads, p, stream);
      else if (vector_ok)
        launch_row_kernel(softmax_loop_kernel_ptr<Params, T, N, kLog>(), blocks, 512, p, stream);
      else
        launch_row_kernel(softmax_loop_kernel_ptr<Params, T, 1, kLog>(), blocks,
                          round_up_warp(std::min<int64_t>(p.n, 512)), p, stream);
    };
    if (log) with_log(std::true_type{});
    else with_log(std::false_type{});
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
