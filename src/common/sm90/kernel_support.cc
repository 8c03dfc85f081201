#include "common/sm90/kernel_support.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <tuple>
#include <vector>

#include "llmk/device_info.h"

namespace llmk::detail::sm90 {

bool sm90a_kernel_runs(const void* kernel, int device) {
  static std::mutex mutex;
  static std::vector<std::tuple<const void*, int, bool>> known;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [k, d, runs] : known)
    if (k == kernel && d == device) return runs;
  const DeviceInfo info = llmk::device_info(device);
  bool runs = info.available && info.cc_major == 9 && info.cc_minor == 0;
  if (runs) {
    cudaFuncAttributes attr{};
    runs = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion >= 90;
    (void)cudaGetLastError();  // a kernel without code for the device leaves an error behind
  }
  known.emplace_back(kernel, device, runs);
  return runs;
}

}  // namespace llmk::detail::sm90
