// Facts about a CUDA device that llmk uses to pick code paths and to state rooflines.
#pragma once

#include <string>

namespace llmk {

struct DeviceInfo {
  bool available = false;       // false when no CUDA device (or driver) is present
  std::string error;            // why it is not available
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int max_threads_per_sm = 0;
  int shared_mem_per_block_optin = 0;  // bytes a block may use after opting in
  int shared_mem_per_sm = 0;
  int l2_bytes = 0;
  int memory_bus_bits = 0;
  int memory_clock_khz = 0;
  double peak_bandwidth_gbs = 0;       // datasheet: 2 (DDR) * clock * bus width
  double peak_bf16_tflops = 0;         // dense tensor-core estimate from SMs and clock
  int sm_clock_khz = 0;
};

// Returns the facts of CUDA device `index` (or available == false with a reason).
DeviceInfo device_info(int index = 0);

// Number of CUDA devices visible, 0 when there is no device or no driver.
int cuda_device_count();

}  // namespace llmk

namespace llmk {

// The CUDA architectures this build of llmk carries machine code for, e.g. "80;90a".
const char* build_cuda_archs();
// The architecture whose PTX the build embeds ("80" by default; empty: none), which the
// driver JIT-compiles on a newer GPU that has no machine code of the build (the sm_80 paths).
const char* build_ptx_arch();

}  // namespace llmk
