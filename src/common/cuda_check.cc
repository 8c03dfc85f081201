#include "common/cuda_check.h"

#include <cstdlib>
#include <cstring>

namespace llmk::detail {

// The runtime's answer on a machine without a GPU: no driver (or one too old for this
// runtime), or a driver that sees no device.
static bool no_gpu(cudaError_t err) {
  return err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice;
}

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw CudaError(concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                         ") in ", what, " at ", file, ":", line,
                         no_gpu(err) ? ": no CUDA GPU is present" : ""));
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

DeviceGuard::DeviceGuard(const char* op, const char* arg, const TensorView& t) {
  const cudaError_t err = cudaGetDevice(&previous_);
  if (no_gpu(err)) {
    cudaGetLastError();
    throw CudaError(concat(op, ": ", arg, " is a CUDA tensor but no CUDA GPU is present (",
                           cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")"));
  }
  LLMK_CUDA_CHECK(err);
  const int device = t.device().index;
  if (previous_ == device) return;
  const cudaError_t set = cudaSetDevice(device);
  if (set == cudaErrorInvalidDevice) {
    cudaGetLastError();
    int count = 0;
    LLMK_CUDA_CHECK(cudaGetDeviceCount(&count));
    throw CudaError(concat(op, ": ", arg, " is on cuda:", device, " but ", count,
                           " CUDA device", count == 1 ? " is" : "s are", " present"));
  }
  LLMK_CUDA_CHECK(set);
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

}  // namespace llmk::detail
