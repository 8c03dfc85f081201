#include "llmk/device_info.h"

#include <cuda_runtime_api.h>

#ifndef LLMK_CUDA_ARCHS_STRING
#define LLMK_CUDA_ARCHS_STRING "unknown"
#endif

namespace llmk {

#ifndef LLMK_PTX_ARCH_STRING
#define LLMK_PTX_ARCH_STRING ""
#endif

const char* build_cuda_archs() { return LLMK_CUDA_ARCHS_STRING; }
const char* build_ptx_arch() { return LLMK_PTX_ARCH_STRING; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" / "no driver" error
    return 0;
  }
  return count;
}

// Dense bf16 tensor-core FLOPs per clock per SM, by architecture (fp32 accumulation).
static double tensor_flops_per_clock_per_sm(int major, int minor) {
  if (major >= 10) return 8192;
  if (major == 9) return 4096;
  if (major == 8 && minor == 0) return 2048;
  if (major >= 8) return 1024;
  return 512;
}

DeviceInfo device_info(int index) {
  DeviceInfo info;
  info.index = index;
  const int count = cuda_device_count();
  if (count == 0) {
    info.error = "no CUDA device or driver found";
    return info;
  }
  if (index < 0 || index >= count) {
    info.error = "device index out of range";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    info.error = cudaGetErrorString(cudaGetLastError());
    return info;
  }
  auto attr = [&](cudaDeviceAttr a) {
    int v = 0;
    cudaDeviceGetAttribute(&v, a, index);
    return v;
  };
  info.available = true;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  info.shared_mem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  info.shared_mem_per_sm = static_cast<int>(prop.sharedMemPerMultiprocessor);
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bus_bits = attr(cudaDevAttrGlobalMemoryBusWidth);
  info.memory_clock_khz = attr(cudaDevAttrMemoryClockRate);
  info.sm_clock_khz = attr(cudaDevAttrClockRate);
  // Double data rate: two transfers per clock over the bus.
  info.peak_bandwidth_gbs = 2.0 * info.memory_clock_khz * 1e3 * (info.memory_bus_bits / 8) / 1e9;
  info.peak_bf16_tflops = tensor_flops_per_clock_per_sm(info.cc_major, info.cc_minor) *
                          info.sm_count * info.sm_clock_khz * 1e3 / 1e12;
  return info;
}

}  // namespace llmk
