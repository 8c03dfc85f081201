// Host-side launch of the softmax kernels, forward (SoftmaxParams) and backward
// (SoftmaxBackwardParams): the register-resident vector kernel when the row is aligned and
// fits (its shape from common/row_shape.h), else the two-pass loop kernel. (The forward
// and backward first offer long rows to the sm_90 cluster kernels: softmax_cluster_launch.cuh.)
#pragma once

#include <type_traits>

#include "common/occupancy.h"
#include "common/row_launch.cuh"
#include "common/row_shape.h"
#include "softmax/softmax_backward_kernel.cuh"
#include "softmax/softmax_kernel.cuh"

namespace llmk::detail {

// The backward holds two rows (y and dy) in registers: at 16 vectors per thread it would
// spill, so it stops at 8 (rows up to 4096 vectors) and longer rows take the loop kernel.
// The forward over few rows (common/row_shape.h's few_rows: one row per SM, latency bound)
// keeps its exponentials where it can (softmax_vec_kernel's kKeepExps).
template <class Params, class T, int N, int VPT, bool kLog>
const void* softmax_vec_kernel_ptr(bool few) {
  if constexpr (std::is_same_v<Params, SoftmaxBackwardParams>) {
    if constexpr (VPT > 8) return nullptr;
    else return reinterpret_cast<const void*>(softmax_backward_vec_kernel<T, N, VPT, kLog>);
  } else if constexpr (kSoftmaxCanKeepExps<T, VPT, kLog>) {
    return few ? reinterpret_cast<const void*>(softmax_vec_kernel<T, N, VPT, kLog, true>)
               : reinterpret_cast<const void*>(softmax_vec_kernel<T, N, VPT, kLog>);
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

template <class Params>
void launch_softmax(const char* op, const Params& p, bool log, DType dtype, bool vector_ok,
                    cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const bool few = few_rows(p.rows, sm_count_of(device));
  auto with_log = [&](auto log_constant) {
    using Log = decltype(log_constant);
    launch_row_op(
        op, p, dtype, vector_ok, stream,
        [few](auto t, auto vpt) {
          return softmax_vec_kernel_ptr<Params, decltype(t), kVec16<decltype(t)>, decltype(vpt)::value, Log::value>(
              few);
        },
        [](auto t, auto n) { return softmax_loop_kernel_ptr<Params, decltype(t), decltype(n)::value, Log::value>(); });
  };
  if (log) with_log(std::true_type{});
  else with_log(std::false_type{});
}

}  // namespace llmk::detail
