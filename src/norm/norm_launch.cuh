// Host-side launch of the normalization forward kernels (RMSNorm, RMSNorm with residual
// add, LayerNorm): picks the vector kernel's shape from the row length and the compiled
// kernels' occupancy, or the loop kernel for unaligned rows.
#pragma once

#include <algorithm>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "norm/norm_kernel.cuh"

namespace llmk::detail {

// The largest grid a row-wise kernel launches; longer inputs are grid-strided.
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// Vectors per thread and threads per block of a row kernel.
struct RowShape {
  int vpt;
  int threads;
};

inline int round_up_warp(int64_t threads) {
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

template <bool kAdd, bool kCentered, class T, class W>
const void* norm_vec_kernel_for(int vpt) {
  constexpr int N = kVec16<T>;
  switch (vpt) {
    case 1: return reinterpret_cast<const void*>(norm_vec_kernel<T, W, N, 1, kAdd, kCentered>);
    case 2: return reinterpret_cast<const void*>(norm_vec_kernel<T, W, N, 2, kAdd, kCentered>);
    case 4: return reinterpret_cast<const void*>(norm_vec_kernel<T, W, N, 4, kAdd, kCentered>);
    case 8: return reinterpret_cast<const void*>(norm_vec_kernel<T, W, N, 8, kAdd, kCentered>);
    case 16: return reinterpret_cast<const void*>(norm_vec_kernel<T, W, N, 16, kAdd, kCentered>);
  }
  return nullptr;
}

// The vector kernel's shape for rows of n 16-byte vectors: VPT in {1, 2, 4, 8, 16} with
// 128 <= d / (N * VPT) <= 512 threads (fewer only for VPT = 1). Few rows (under two per
// SM): the most threads per row, for latency. Otherwise the most resident threads per SM
// (ties: more, smaller blocks), which keeps the most loads in flight, among the kernels
// that do not spill (a spilling kernel only when nothing else holds the row).
// vpt = 0: the row does not fit in registers.
template <bool kAdd, bool kCentered, class T, class W>
RowShape norm_shape(int64_t rows, int64_t n) {
  int device = 0, sm_count = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  const bool few_rows = rows < 2 * int64_t{sm_count};
  RowShape best{0, 0};
  int64_t best_score = -1;
  for (int vpt : {1, 2, 4, 8, 16}) {
    const int threads = round_up_warp((n + vpt - 1) / vpt);
    if (threads > 512 || (threads < 128 && vpt > 1)) continue;
    if (few_rows) return {vpt, threads};
    const KernelFit fit = kernel_fit(norm_vec_kernel_for<kAdd, kCentered, T, W>(vpt), threads, device);
    // Non-spilling kernels rank above every spilling one.
    const int64_t score = int64_t{fit.blocks_per_sm} * threads + (fit.spills ? 0 : (int64_t{1} << 32));
    if (score >= best_score) {
      best = {vpt, threads};
      best_score = score;
    }
  }
  return best;
}

// `act`: x's dtype; `affine`: the weight's (and bias's) dtype. `vector_ok`: every pointer
// and row stride is aligned to 16 bytes and d to the vector.
template <bool kAdd, bool kCentered>
void launch_norm(const char* op, const NormParams& p, DType act, DType affine, bool vector_ok,
                 cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  dispatch_act_weight(act, affine, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const RowShape shape =
        vector_ok ? norm_shape<kAdd, kCentered, T, W>(p.rows, p.d / N) : RowShape{0, 0};
    switch (shape.vpt) {
      case 1: norm_vec_kernel<T, W, N, 1, kAdd, kCentered><<<blocks, shape.threads, 0, stream>>>(p); break;
      case 2: norm_vec_kernel<T, W, N, 2, kAdd, kCentered><<<blocks, shape.threads, 0, stream>>>(p); break;
      case 4: norm_vec_kernel<T, W, N, 4, kAdd, kCentered><<<blocks, shape.threads, 0, stream>>>(p); break;
      case 8: norm_vec_kernel<T, W, N, 8, kAdd, kCentered><<<blocks, shape.threads, 0, stream>>>(p); break;
      case 16: norm_vec_kernel<T, W, N, 16, kAdd, kCentered><<<blocks, shape.threads, 0, stream>>>(p); break;
      default:
        norm_loop_kernel<T, W, kAdd, kCentered>
            <<<blocks, round_up_warp(std::min<int64_t>(p.d, 512)), 0, stream>>>(p);
        break;
    }
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
