// Host-side launch of the RMSNorm forward kernels (plain and with residual add): picks the
// vector kernel's shape from the row length, or the loop kernel for unaligned rows.
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "norm/rmsnorm_kernel.cuh"

namespace llmk::detail {

// The largest grid a row-wise kernel launches; longer inputs are grid-strided.
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// Vectors per thread for a row of n 16-byte vectors: the fewest that keep a block at or
// under 128 threads (more rows resident per SM, several loads in flight per thread, a
// short reduction), up to 16 with 512 threads. 0: the row does not fit in registers.
inline int rmsnorm_vectors_per_thread(int64_t n) {
  for (int vpt : {1, 2, 4, 8, 16})
    if ((n + vpt - 1) / vpt <= 128) return vpt;
  return (n + 15) / 16 <= 512 ? 16 : 0;
}

inline int round_up_warp(int64_t threads) {
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

template <bool kAdd, class T, class W, int VPT>
void launch_rmsnorm_vec(const RMSNormParams& p, int threads, int blocks, cudaStream_t stream) {
  rmsnorm_vec_kernel<T, W, kVec16<T>, VPT, kAdd><<<blocks, threads, 0, stream>>>(p);
}

// `vector_ok`: every pointer and row stride is aligned to 16 bytes and d to the vector.
template <bool kAdd>
void launch_rmsnorm(const RMSNormParams& p, DType act, DType weight, bool vector_ok,
                    cudaStream_t stream) {
  const char* op = kAdd ? "add_rmsnorm" : "rmsnorm";
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  dispatch_act_weight(act, weight, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const int vpt = vector_ok ? rmsnorm_vectors_per_thread(p.d / N) : 0;
    const int threads = round_up_warp(vpt ? (p.d / N + vpt - 1) / vpt : std::min<int64_t>(p.d, 512));
    switch (vpt) {
      case 1: launch_rmsnorm_vec<kAdd, T, W, 1>(p, threads, blocks, stream); break;
      case 2: launch_rmsnorm_vec<kAdd, T, W, 2>(p, threads, blocks, stream); break;
      case 4: launch_rmsnorm_vec<kAdd, T, W, 4>(p, threads, blocks, stream); break;
      case 8: launch_rmsnorm_vec<kAdd, T, W, 8>(p, threads, blocks, stream); break;
      case 16: launch_rmsnorm_vec<kAdd, T, W, 16>(p, threads, blocks, stream); break;
      default: rmsnorm_loop_kernel<T, W, kAdd><<<blocks, threads, 0, stream>>>(p); break;
    }
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
