#include "common/cuda_check.h"

#include <cstdlib>
#include <cstring>

namespace llmk::detail {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw CudaError(concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                         ") in ", what, " at ", file, ":", line));
}

static bool debug_sync_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LLMK_DEBUG_SYNC");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return enabled;
}

void check_launch(const char* kernel, cudaStream_t stream, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && debug_sync_enabled()) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) throw_cuda_error(err, kernel, file, line);
}

DeviceGuard::DeviceGuard(int device) {
  LLMK_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) LLMK_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

}  // namespace llmk::detail
