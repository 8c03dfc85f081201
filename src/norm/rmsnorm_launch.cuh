// Host-side launch of the RMSNorm forward kernels (plain and with residual add): picks the
// vector kernel's shape from the row length, or the loop kernel for unaligned rows.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "norm/rmsnorm_kernel.cuh"

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

inline bool exp_pipelined() {
  static const bool on = std::getenv("LLMK_EXP_PIPE") && std::getenv("LLMK_EXP_PIPE")[0] == '1';
  return on;
}

template <bool kAdd, class T, class W, int VPT>
const void* kernel_ptr() {
  constexpr int N = kVec16<T>;
  return exp_pipelined() ? reinterpret_cast<const void*>(rmsnorm_pipelined_kernel<T, W, N, VPT, kAdd>)
                         : reinterpret_cast<const void*>(rmsnorm_vec_kernel<T, W, N, VPT, kAdd>);
}

template <bool kAdd, class T, class W>
const void* rmsnorm_vec_kernel_for(int vpt) {
  switch (vpt) {
    case 1: return kernel_ptr<kAdd, T, W, 1>();
    case 2: return kernel_ptr<kAdd, T, W, 2>();
    case 4: return kernel_ptr<kAdd, T, W, 4>();
    case 8: return kernel_ptr<kAdd, T, W, 8>();
    case 16: return kernel_ptr<kAdd, T, W, 16>();
  }
  return nullptr;
}

template <bool kAdd, class T, class W, int VPT>
void launch_vec(const RMSNormParams& p, RowShape shape, int blocks, cudaStream_t stream) {
  constexpr int N = kVec16<T>;
  if (exp_pipelined()) {
    int device = 0, sm_count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    const KernelFit fit = kernel_fit(kernel_ptr<kAdd, T, W, VPT>(), shape.threads, device);
    const int grid = static_cast<int>(std::min<int64_t>(blocks, int64_t{fit.blocks_per_sm} * sm_count));
    rmsnorm_pipelined_kernel<T, W, N, VPT, kAdd><<<grid, shape.threads, 0, stream>>>(p);
  } else {
    rmsnorm_vec_kernel<T, W, N, VPT, kAdd><<<blocks, shape.threads, 0, stream>>>(p);
  }
}

// The vector kernel's shape for rows of n 16-byte vectors: VPT in {1, 2, 4, 8, 16} with
// 128 <= d / (N * VPT) <= 512 threads (fewer only for VPT = 1). Few rows (under two per
// SM): the most threads per row, for latency. Otherwise the most resident threads per SM
// (ties: more, smaller blocks), which keeps the most loads in flight, among the kernels
// that do not spill (a spilling kernel only when nothing else holds the row).
// vpt = 0: the row does not fit in registers.
template <bool kAdd, class T, class W>
RowShape rmsnorm_shape(int64_t rows, int64_t n) {
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
    const KernelFit fit = kernel_fit(rmsnorm_vec_kernel_for<kAdd, T, W>(vpt), threads, device);
    // Non-spilling kernels rank above every spilling one.
    const int64_t score = int64_t{fit.blocks_per_sm} * threads + (fit.spills ? 0 : (int64_t{1} << 32));
    if (score >= best_score) {
      best = {vpt, threads};
      best_score = score;
    }
  }
  return best;
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
    const RowShape shape = vector_ok ? rmsnorm_shape<kAdd, T, W>(p.rows, p.d / N) : RowShape{0, 0};
    switch (shape.vpt) {
      case 1: launch_vec<kAdd, T, W, 1>(p, shape, blocks, stream); break;
      case 2: launch_vec<kAdd, T, W, 2>(p, shape, blocks, stream); break;
      case 4: launch_vec<kAdd, T, W, 4>(p, shape, blocks, stream); break;
      case 8: launch_vec<kAdd, T, W, 8>(p, shape, blocks, stream); break;
      case 16: launch_vec<kAdd, T, W, 16>(p, shape, blocks, stream); break;
      default:
        rmsnorm_loop_kernel<T, W, kAdd>
            <<<blocks, round_up_warp(std::min<int64_t>(p.d, 512)), 0, stream>>>(p);
        break;
    }
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
