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

// The backward holds two rows (y and dy) in registers; beyond 4 vectors per thread only
// one block fits per SM (and 16 spills), so longer rows take the loop kernel.
template <class Params, class T, int N, int VPT, bool kLog>
const void* softmax_vec_kernel_ptr() {
  if constexpr (std::is_same_v<Params, SoftmaxBackwardParams>) {
    if constexpr (VPT > 4) return nullptr;
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

// Blocks of the loop kernel: rows in flight (one per block) bounded so that their bytes
// fit in half the L2, where the second pass finds them; at least one block per SM.
inline int softmax_loop_blocks(int64_t rows, int64_t row_bytes) {
  int device = 0, sm_count = 0, l2_bytes = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const int64_t fit = std::max<int64_t>(sm_count, l2_bytes / 2 / std::max<int64_t>(row_bytes, 1));
  return static_cast<int>(std::min({rows, fit, kMaxRowBlocks}));
}

template <class Params>
void launch_softmax(const char* op, const Params& p, bool log, DType dtype, bool vector_ok,
                    cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  constexpr int kTensorsRead = std::is_same_v<Params, SoftmaxBackwardParams> ? 2 : 1;
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
      else {
        const int loop_blocks = softmax_loop_blocks(p.rows, kTensorsRead * p.n * int64_t{sizeof(T)});
        if (vector_ok)
          launch_row_kernel(softmax_loop_kernel_ptr<Params, T, N, kLog>(), loop_blocks, 512, p, stream);
        else
          launch_row_kernel(softmax_loop_kernel_ptr<Params, T, 1, kLog>(), loop_blocks,
                            round_up_warp(std::min<int64_t>(p.n, 512)), p, stream);
      }
    };
    if (log) with_log(std::true_type{});
    else with_log(std::false_type{});
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
