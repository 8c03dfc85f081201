#include "common/occupancy.h"

#include <map>
#include <mutex>
#include <tuple>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"

namespace llmk::detail {

KernelFit kernel_fit(const void* kernel, int threads, int device, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, size_t>, KernelFit> cache;
  const auto key = std::make_tuple(kernel, threads, device, smem);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  KernelFit fit{};
  LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit.blocks_per_sm, kernel, threads, smem));
  cudaFuncAttributes attributes{};
  LLMK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  fit.spills = attributes.localSizeBytes > 0;
  cache.emplace(key, fit);
  return fit;
}

int sm_count_of(int device) {
  int sm_count = 0;
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  return sm_count;
}

KernelLimits kernel_limits(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int>, KernelLimits> cache;
  const auto key = std::make_tuple(kernel, device);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int optin = 0;
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  LLMK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const KernelLimits limits{optin - static_cast<int>(attributes.sharedSizeBytes), attributes.ptxVersion};
  cache.emplace(key, limits);
  return limits;
}

int max_active_clusters(const void* kernel, int threads, size_t smem, int cluster) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

int resident_clusters(const void* kernel, int threads, size_t smem, int cluster, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, size_t, int>, int> cache;
  const auto key = std::make_tuple(kernel, device, threads, smem, cluster);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int clusters = max_active_clusters(kernel, threads, smem, cluster);
  cache.emplace(key, clusters);
  return clusters;
}

}  // namespace llmk::detail
