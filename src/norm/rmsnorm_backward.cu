// Launcher of the RMSNorm backward: the vector path for aligned rows that fit in registers,
// else the loop path; then the deterministic dweight reduction.
#include <algorithm>

#include "common/cuda_check.h"
#include "norm/norm_launchers.h"
#include "norm/rmsnorm_backward_kernel.cuh"
#include "norm/rmsnorm_launch.cuh"

namespace llmk::detail {

// Vectors per thread of the backward: the fewest that keep a block at or under 512
// threads; at most 4, so that x, dy and the dweight accumulators stay in registers.
static int backward_vectors_per_thread(int64_t n) {
  for (int vpt : {1, 2, 4})
    if ((n + vpt - 1) / vpt <= 512) return vpt;
  return 0;
}

// Threads per block of the backward for rows of d elements of `elem_bytes` each.
static int backward_threads(int64_t d, int elem_bytes, bool vector_ok) {
  const int64_t n = d * elem_bytes / 16;
  const int vpt = vector_ok ? backward_vectors_per_thread(n) : 0;
  return vpt ? round_up_warp((n + vpt - 1) / vpt) : 512;
}

// Enough blocks for ~1024 resident threads per SM (at most 8 blocks per SM): fewer blocks
// means fewer partial dweight rows to write and reduce.
static int64_t blocks_for(int64_t rows, int threads, int sm_count) {
  const int64_t per_sm = std::clamp<int64_t>(1024 / threads, 1, 8);
  return std::max<int64_t>(1, std::min<int64_t>(rows, per_sm * sm_count));
}

int64_t rmsnorm_backward_blocks(int64_t rows, int sm_count) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{8} * sm_count));
}

template <class T, class W, int VPT>
static void launch_backward_vec(const RMSNormBackwardParams& p, int threads,
                                cudaStream_t stream) {
  rmsnorm_backward_vec_kernel<T, W, kVec16<T>, VPT>
      <<<static_cast<int>(p.blocks), threads, 0, stream>>>(p);
}

void rmsnorm_backward_cuda(const RMSNormBackwardParams& params, DType act, DType weight,
                           bool vector_ok, cudaStream_t stream) {
  int device = 0, sm_count = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  dispatch_act_weight(act, weight, "rmsnorm_backward", [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const int vpt = vector_ok ? backward_vectors_per_thread(params.d / N) : 0;
    const int threads = backward_threads(params.d, sizeof(T), vpt != 0);
    RMSNormBackwardParams p = params;
    p.blocks = std::min(blocks_for(p.rows, threads, sm_count),
                        rmsnorm_backward_blocks(p.rows, sm_count));
    switch (vpt) {
      case 1: launch_backward_vec<T, W, 1>(p, threads, stream); break;
      case 2: launch_backward_vec<T, W, 2>(p, threads, stream); break;
      case 4: launch_backward_vec<T, W, 4>(p, threads, stream); break;
      default: {
        // r per row lives after the partial sums in the workspace.
        float* rstd = p.partial + rmsnorm_backward_blocks(p.rows, sm_count) * p.d;
        const int row_blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
        rmsnorm_backward_loop_kernel<T, W><<<row_blocks, 512, 0, stream>>>(p, rstd);
        LLMK_CHECK_LAUNCH("rmsnorm_backward_loop_kernel", stream);
        const dim3 grid(static_cast<unsigned>((p.d + 255) / 256), static_cast<unsigned>(p.blocks));
        rmsnorm_backward_columns_kernel<T><<<grid, 256, 0, stream>>>(p, rstd);
        break;
      }
    }
    LLMK_CHECK_LAUNCH("rmsnorm_backward", stream);
    const dim3 reduce_grid(static_cast<unsigned>((p.d + 31) / 32));
    rmsnorm_dweight_reduce_kernel<W><<<reduce_grid, dim3(32, 16), 0, stream>>>(p);
    LLMK_CHECK_LAUNCH("rmsnorm_dweight_reduce_kernel", stream);
  });
}

}  // namespace llmk::detail
