// Checked CUDA calls, the LLMK_DEBUG_SYNC switch and a guard that makes a tensor's
// device current for the duration of a call.
#pragma once

#include <cuda_runtime_api.h>

#include "llmk/error.h"
#include "llmk/tensor.h"

namespace llmk::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// After a launch: report a launch error; with LLMK_DEBUG_SYNC=1 in the environment also
// synchronize the stream so that an asynchronous fault is pinned to this kernel.
void check_launch(const char* kernel, cudaStream_t stream, const char* file, int line);

// Makes the device of `t` (the CUDA tensor argument `arg` of `op`) current until the end
// of the scope. The first CUDA call of every op: a machine without a CUDA GPU (or driver)
// and a device index out of range are reported in plain words, naming op and argument.
class DeviceGuard {
 public:
  DeviceGuard(const char* op, const char* arg, const TensorView& t);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace llmk::detail

#define LLMK_CUDA_CHECK(expr)                                                  \
  do {                                                                         \
    cudaError_t llmk_err_ = (expr);                                            \
    if (llmk_err_ != cudaSuccess)                                              \
      ::llmk::detail::throw_cuda_error(llmk_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define LLMK_CHECK_LAUNCH(kernel_name, stream) \
  ::llmk::detail::check_launch(kernel_name, stream, __FILE__, __LINE__)
