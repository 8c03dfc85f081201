// Kernel parameter block of cross_entropy, shared by the launcher, the kernels and the CPU
// reference, and the launcher and reference they are called through (by loss_api.cc,
// after the arguments are validated).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "llmk/dtype.h"

namespace llmk::detail {

// What both ops read and write per row: logits and dlogits [rows, n] with their own row
// strides, target [rows], and the loss's arguments.
struct CrossEntropyRows {
  void* dlogits;  // nullptr (cross_entropy only): no gradient
  const void* logits;
  const void* target;  // int64 or int32
  int64_t rows;
  int64_t n;
  int64_t logits_stride;
  int64_t dlogits_stride;
  int64_t ignore_index;
  bool target_i64;
  // In double for the CPU reference; the kernels round each to float once.
  double label_smoothing;
  double z_loss;
};

// cross_entropy: loss, lse [rows] written; the gradient scaled by grad_scale.
struct CrossEntropyParams : CrossEntropyRows {
  float* loss;
  float* lse;
  double grad_scale;
};

// `vector_ok`: logits (and dlogits) rows are 16-byte aligned, n a multiple of the vector.
void cross_entropy_cuda(const CrossEntropyParams& p, DType dtype, bool vector_ok, cudaStream_t stream);
void cross_entropy_cpu(const CrossEntropyParams& p, DType dtype);

// cross_entropy_backward: the upstream gradient and the forward's lse, [rows] each.
struct CrossEntropyBackwardParams : CrossEntropyRows {
  const float* dloss;
  const float* lse;
};

void cross_entropy_backward_cuda(const CrossEntropyBackwardParams& p, DType dtype, bool vector_ok,
                                 cudaStream_t stream);
void cross_entropy_backward_cpu(const CrossEntropyBackwardParams& p, DType dtype);

}  // namespace llmk::detail
