// Host side of the sm_90 cluster kernels (softmax_cluster_kernel.cuh), forward and backward:
// the dispatch rule and the launch. softmax.cu and softmax_backward.cu offer each call here
// first and fall back to the one-block kernels (softmax_launch.cuh).
//
// Dispatch rule, for R rows of V 16-byte vectors on a device of S SMs, with M the vectors one
// block holds in registers (forward 512 threads x 16, backward x 8: it holds y and dy) and
// L the slice a block takes at many rows (forward 512 x 4, backward 512 x 2):
//   few rows (R < 2 S):  C = min(8, max(ceil(V / M), floor(S / R)), floor(V / 1024)),
//   many rows:           C = min(8, ceil(V / L)),
// taken when the rows are 16-byte aligned, R <= 65535 (the grid's y), C >= 2 and
// C >= ceil(V / M).
//   - floor(S / R): as many blocks per row as keep R x C within one block per SM. One block
//     per row leaves S - R SMs idle, and a lone block is slow on a long row whatever the
//     bandwidth: one SM moves ~100 GB/s and runs 16 ex2 per clock (1 x 128256 bf16 is
//     ~1.1 us of ex2 alone on one SM at C = 8, ~9 us at C = 1).
//   - ceil(V / M): the fewest blocks whose registers hold the row. A row past one block's
//     registers takes the two-pass kernel on one block (forward 6 bytes per element instead
//     of 4, backward 10 instead of 6), so such rows take the cluster even when R x C exceeds
//     the SMs (R < 2 S: a few waves of read-once blocks beat two reads).
//   - floor(V / 1024): each block keeps at least 1024 vectors (16 KB): below that the two
//     cluster barriers and the DSMEM round trip (~0.5 us) cost about what the split saves.
//   - ceil(V / L), many rows: at most 4 vectors of data per thread. A thread that holds 8 or
//     16 runs a long serial chain (max, exponentials, sum, outputs) between its loads and
//     its stores, far off the copy rate; split over 2-8 blocks the rows come close to it
//     (the two-pass kernel reads the row twice); clusters of 3-4 at 128256 (8 or 16 vectors
//     per thread) were slower than the two-pass kernel.
// So, forward: 1 and 16 rows of 128256 or 151936 bf16 columns take C = 8, 1 x 32000 bf16
// C = 3, 8192 x 32000 bf16 C = 2, 8192 x 128256 bf16 C = 8; 1 x 8192 bf16 (1024 vectors),
// and many rows of up to 16384 bf16 columns, keep the one-block kernels. Backward: 8192 x
// 32000 bf16 C = 4, 8192 x 128256 C = 8, many rows of up to 8192 bf16 columns one block.
// The block shape within the cluster is the widest (common/row_shape.h): the smallest compiled
// VPT within 512 threads, 4 vectors per thread (backward 2 + 2, or 4 + 4) at many rows, where
// the kernels' launch bounds keep 4 blocks of 512 threads per SM (backward at VPT 4: 3).
// (Ranking shapes by resident threads, as the one-block kernels do, picked 8 vectors per
// thread for kernels whose VPT 4 spilled 4 bytes, and 3 blocks per SM at 38-40 registers
// were slower than 4 blocks at 32.) A device without
// sm_90 code in this build, or one that cannot hold the cluster
// (cudaOccupancyMaxActiveClusters = 0), keeps the one-block kernels.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "common/row_shape.h"
#include "softmax/softmax_cluster_kernel.cuh"

namespace llmk::detail {

// The rule's per-direction sizes, in 16-byte vectors per block.
struct SoftmaxClusterSizes {
  int64_t max_slice;        // M: what one block holds in registers
  int64_t many_rows_slice;  // L: at most this much per block at many rows
};

template <class Params>
inline constexpr SoftmaxClusterSizes kSoftmaxClusterSizes = std::is_same_v<Params, SoftmaxParams>
                                                                ? SoftmaxClusterSizes{512 * 16, 512 * 4}
                                                                : SoftmaxClusterSizes{512 * 8, 512 * 2};

inline constexpr int64_t kClusterMinSlice = 1024;  // 16-byte vectors per block at least (few rows)
inline constexpr int64_t kClusterMaxRows = 65535;  // the grid's y dimension, one row each

// Blocks per cluster for `rows` rows of `vectors` 16-byte vectors on `sms` SMs; 0: none.
inline int softmax_cluster_blocks(int64_t rows, int64_t vectors, int sms, SoftmaxClusterSizes sizes) {
  if (rows > kClusterMaxRows) return 0;
  const int64_t fit = (vectors + sizes.max_slice - 1) / sizes.max_slice;
  const int64_t c =
      few_rows(rows, sms)
          ? std::min({int64_t{kSoftmaxMaxCluster}, std::max(fit, sms / rows), vectors / kClusterMinSlice})
          : std::min(int64_t{kSoftmaxMaxCluster}, (vectors + sizes.many_rows_slice - 1) / sizes.many_rows_slice);
  return c >= 2 && c >= fit ? static_cast<int>(c) : 0;
}

// Whether `kernel` has sm_90 code for `device` and a cluster of `cluster` blocks of
// `threads` fits on it; remembered per (kernel, threads, cluster, device).
inline bool softmax_cluster_runs(const void* kernel, int threads, int cluster, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int>, bool> cache;
  const auto key = std::make_tuple(kernel, threads, cluster, device);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaFuncAttributes attributes{};
  const bool sm90 = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.binaryVersion >= 90;
  if (!sm90) (void)cudaGetLastError();  // no code for the device: not a candidate; clear the error
  const bool runs = sm90 && max_active_clusters(kernel, threads, 0, cluster) > 0;
  cache.emplace(key, runs);
  return runs;
}

// Launches the cluster kernel of Params (forward or backward) when the rule above takes the
// call; false: it does not.
template <class Params>
bool launch_softmax_cluster(const char* op, const Params& p, bool log, DType dtype, bool vector_ok,
                            cudaStream_t stream) {
  if (!vector_ok) return false;
  int device = 0, major = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return false;
  return dispatch_dtype(dtype, op, [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = kVec16<T>;
    const int64_t vectors = p.n / N;
    const int cluster = softmax_cluster_blocks(p.rows, vectors, sm_count_of(device), kSoftmaxClusterSizes<Params>);
    if (cluster == 0) return false;
    const int64_t slice = (vectors + cluster - 1) / cluster;
    auto kernel_for = [&](int vpt) {
      const void* kernel = nullptr;
      dispatch_vpt(vpt, [&](auto v) { kernel = softmax_cluster_kernel_ptr<Params, T, decltype(v)::value>(log); });
      return kernel;
    };
    const RowShape shape = widest_row_shape(slice, kernel_for);
    if (shape.vpt == 0 || !softmax_cluster_runs(kernel_for(shape.vpt), shape.threads, cluster, device)) return false;
    int slice_columns = static_cast<int>(slice * N);
    void* args[] = {const_cast<Params*>(&p), &slice_columns};
    launch_pdl_cluster(kernel_for(shape.vpt), dim3(cluster, static_cast<unsigned>(p.rows)), dim3(shape.threads), 0,
                       stream, args, cluster);
    LLMK_CHECK_LAUNCH(op, stream);
    return true;
  });
}

}  // namespace llmk::detail
