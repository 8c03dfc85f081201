#include "common/occupancy.h"

#include <map>
#include <mutex>
#include <tuple>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"

namespace llmk::detail {

int blocks_per_sm(const void* kernel, int threads, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> cache;
  const auto key = std::make_tuple(kernel, threads, device);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int blocks = 0;
  LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  cache.emplace(key, blocks);
  return blocks;
}

}  // namespace llmk::detail
