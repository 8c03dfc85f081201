// Programmatic dependent launch: the per-device switch and the runtime-API launch.
#include "common/pdl_launch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace llmk::detail {

bool pdl_enabled() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices] = {};  // 0 unknown, 1 off, 2 on
  static const bool off = [] {
    const char* env = std::getenv("LLMK_PDL");
    return env != nullptr && std::strcmp(env, "0") == 0;
  }();
  if (off) return false;
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  int s = state[device].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0;
    LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    s = major >= 9 ? 2 : 1;
    state[device].store(s, std::memory_order_relaxed);
  }
  return s == 2;
}

void launch_pdl(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args) {
  launch_pdl_cluster(kernel, grid, block, smem, stream, args, 1);
}

namespace {

// cudaLaunchKernelExC with the PDL attribute when `pdl` and the cluster attribute when
// cluster > 1.
void launch_ex(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
               unsigned cluster, bool pdl) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned count = 0;
  if (pdl) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count].val.clusterDim.x = cluster;
    attrs[count].val.clusterDim.y = 1;
    attrs[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = count > 0 ? attrs : nullptr;
  config.numAttrs = count;
  LLMK_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, args));
}

}  // namespace

void launch_pdl_cluster(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        void** args, unsigned cluster) {
  launch_ex(kernel, grid, block, smem, stream, args, cluster, pdl_enabled());
}

void launch_cluster(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
                    unsigned cluster) {
  launch_ex(kernel, grid, block, smem, stream, args, cluster, false);
}

}  // namespace llmk::detail
