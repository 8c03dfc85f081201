#include "common/scratch.h"

#include <cstdint>
#include <map>
#include <mutex>

#include "common/cuda_check.h"

namespace llmk::detail {

namespace {

constexpr uint64_t kKeptBytes = uint64_t{256} << 20;  // cached by the pool between calls

cudaMemPool_t pool_of(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  LLMK_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t kept = kKeptBytes;
  LLMK_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept));
  pools.emplace(device, pool);
  return pool;
}

}  // namespace

bool scratch_available(int device) {
  int supported = 0;
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  return supported != 0;
}

void* scratch_alloc(size_t bytes, int device, cudaStream_t stream) {
  void* ptr = nullptr;
  LLMK_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, bytes, pool_of(device), stream));
  return ptr;
}

void scratch_free(void* ptr, cudaStream_t stream) { LLMK_CUDA_CHECK(cudaFreeAsync(ptr, stream)); }

}  // namespace llmk::detail
