// Launch description of the multi-tensor AdamW kernel: up to kAdamWMaxTensors tensors of
// one parameter dtype, split into chunks of kAdamWChunk elements (a block's unit of work). It is
// passed by value as a __grid_constant__ kernel parameter of ~13.6 KB, which needs the
// large kernel parameters of CUDA 12.1+ (Volta and later); 48 tensors (2.6 KB, the classic
// 4 KB limit) left lists of many small tensors with small, under-filled launches.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "llmk/dtype.h"

namespace llmk::detail {

constexpr int kAdamWMaxTensors = 256;
constexpr int64_t kAdamWChunk = 4096;

struct AdamWHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool maximize = false;
  const float* lr_ptr = nullptr;  // device lr, replaces `lr` when set
};

struct AdamWLaunch {
  void* param[kAdamWMaxTensors];
  const void* grad[kAdamWMaxTensors];
  float* exp_avg[kAdamWMaxTensors];
  float* exp_avg_sq[kAdamWMaxTensors];
  const float* step[kAdamWMaxTensors];
  int64_t numel[kAdamWMaxTensors];
  int32_t chunk_end[kAdamWMaxTensors];  // prefix sums of the tensors' chunk counts
  bool vector_ok[kAdamWMaxTensors];     // all four pointers 16-byte aligned
  int count = 0;
  AdamWHyper hyper;
};

void adamw_cuda(const AdamWLaunch& launch, DType dtype, cudaStream_t stream);
void adamw_cpu(const AdamWLaunch& launch, DType dtype);

}  // namespace llmk::detail
