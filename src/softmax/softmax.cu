// Launcher of the softmax and log_softmax forward: the cluster kernel for long rows on sm_90
// (softmax_cluster_kernel.cuh), else the one-block-per-row kernels (softmax_launch.cuh).
//
// Dispatch rule of the cluster kernel, for R rows of V 16-byte vectors on a device of S SMs:
//   few rows (R < 2 S):  C = min(8, max(ceil(V / 8192), floor(S / R)), floor(V / 1024)),
//   many rows:           C = min(8, ceil(V / 2048)),
// taken when the rows are 16-byte aligned, R <= 65535 (the grid's y), C >= 2 and
// C >= ceil(V / 8192).
//   - floor(S / R): as many blocks per row as keep R x C within one block per SM. One block
//     per row leaves S - R SMs idle, and a lone block is slow on a long row whatever the
//     bandwidth: one SM moves ~100 GB/s and runs 16 ex2 per clock (1 x 128256 bf16 is
//     ~1.1 us of ex2 alone on one SM at C = 8, ~9 us at C = 1).
//   - ceil(V / 8192): the fewest blocks whose registers hold the row (512 threads x 16
//     vectors each). A row past one block's registers takes the two-pass kernel on one
//     block, 6 bytes per element instead of 4, so such rows take the cluster even when
//     R x C exceeds the SMs (R < 2 S: a few waves of read-once blocks beat two reads).
//   - floor(V / 1024): each block keeps at least 1024 vectors (16 KB): below that the two
//     cluster barriers and the DSMEM round trip (~0.5 us) cost about what the split saves.
//   - ceil(V / 2048), many rows: at most 512 threads x 4 vectors per block. A thread that
//     holds 8 or 16 vectors runs a long serial chain (max, exponentials, sum, outputs)
//     between its loads and its stores, and a block per row at 32000 bf16 columns reached
//     78% of copy; the same rows over 2 blocks reached 89% (8192 x 32000), and 8192 x 128256
//     over 8 blocks 81% where the two-pass kernel reads the row twice (65%). Clusters of 3-4
//     at 128256 (8 or 16 vectors per thread) were slower than the two-pass kernel.
// So 1 and 16 rows of 128256 or 151936 bf16 columns take C = 8, 1 x 32000 bf16 C = 3,
// 8192 x 32000 bf16 C = 2, 8192 x 128256 bf16 C = 8; 1 x 8192 bf16 (1024 vectors), and many
// rows of up to 16384 bf16 columns, keep the one-block kernels. The block shape within the
// cluster is pick_row_shape's (common/row_shape.h) for R x C rows of a slice. A device without
// sm_90 code in this build, or one that cannot hold the cluster
// (cudaOccupancyMaxActiveClusters = 0), keeps the one-block kernels.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "common/occupancy.h"
#include "softmax/softmax_cluster_kernel.cuh"
#include "softmax/softmax_launch.cuh"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

namespace {

constexpr int64_t kClusterMinSlice = 1024;          // 16-byte vectors per block at least (few rows)
constexpr int64_t kClusterMaxSlice = 512 * 16;      // vectors one block holds in registers
constexpr int64_t kClusterManyRowsSlice = 512 * 4;  // vectors per block at most (many rows)
constexpr int64_t kClusterMaxRows = 65535;          // the grid's y dimension, one row each

// Blocks per cluster for `rows` rows of `vectors` 16-byte vectors on `sms` SMs; 0: none.
int cluster_blocks(int64_t rows, int64_t vectors, int sms) {
  if (rows > kClusterMaxRows) return 0;
  const int64_t fit = (vectors + kClusterMaxSlice - 1) / kClusterMaxSlice;
  const int64_t c =
      few_rows(rows, sms)
          ? std::min({int64_t{kSoftmaxMaxCluster}, std::max(fit, sms / rows), vectors / kClusterMinSlice})
          : std::min(int64_t{kSoftmaxMaxCluster}, (vectors + kClusterManyRowsSlice - 1) / kClusterManyRowsSlice);
  return c >= 2 && c >= fit ? static_cast<int>(c) : 0;
}

// Whether `kernel` has sm_90 code for `device` and a cluster of `cluster` blocks of
// `threads` fits on it; remembered per (kernel, threads, cluster, device).
bool cluster_runs(const void* kernel, int threads, int cluster, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int>, bool> cache;
  const auto key = std::make_tuple(kernel, threads, cluster, device);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaFuncAttributes attributes{};
  cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);  // fails without code for the device
  int clusters = 0;
  if (err == cudaSuccess && attributes.binaryVersion >= 90) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    config.attrs = &attribute;
    config.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  }
  if (err != cudaSuccess) (void)cudaGetLastError();  // not a candidate; clear the error it left
  const bool runs = err == cudaSuccess && clusters > 0;
  cache.emplace(key, runs);
  return runs;
}

// Launches the cluster kernel when the rule above takes the call; false: it does not.
bool launch_softmax_cluster(const char* op, const SoftmaxParams& p, bool log, DType dtype, bool vector_ok,
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
    const int cluster = cluster_blocks(p.rows, vectors, sm_count_of(device));
    if (cluster == 0) return false;
    const int64_t slice = (vectors + cluster - 1) / cluster;
    auto kernel_for = [&](int vpt) {
      const void* kernel = nullptr;
      dispatch_vpt(vpt, [&](auto v) { kernel = softmax_cluster_kernel_ptr<T, decltype(v)::value>(log); });
      return kernel;
    };
    const RowShape shape = pick_row_shape(p.rows * cluster, slice, kernel_for);
    if (shape.vpt == 0 || !cluster_runs(kernel_for(shape.vpt), shape.threads, cluster, device)) return false;
    int slice_columns = static_cast<int>(slice * N);
    void* args[] = {const_cast<SoftmaxParams*>(&p), &slice_columns};
    launch_pdl_cluster(kernel_for(shape.vpt), dim3(cluster, static_cast<unsigned>(p.rows)), dim3(shape.threads), 0,
                       stream, args, cluster);
    LLMK_CHECK_LAUNCH(op, stream);
    return true;
  });
}

}  // namespace

void softmax_cuda(const SoftmaxParams& p, bool log, DType dtype, bool vector_ok, cudaStream_t stream) {
  const char* op = log ? "log_softmax" : "softmax";
  if (!launch_softmax_cluster(op, p, log, dtype, vector_ok, stream))
    launch_softmax(op, p, log, dtype, vector_ok, stream);
}

}  // namespace llmk::detail
