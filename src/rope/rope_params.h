// Kernel parameters of RoPE and the inverse-frequency formula shared by the CUDA kernel
// and the CPU reference.
#pragma once

#include <cmath>
#include <cstdint>

#include "llmk/dtype.h"
#include "common/host_device.h"
#include "llmk/rope.h"

namespace llmk::detail {

// Element strides of a [batch, seq, heads, head_dim] tensor (head_dim contiguous).
struct HeadStrides {
  int64_t batch = 0, seq = 0, head = 0;
};

// One rotated tensor: read from `in`, written to `out`; heads == 0: absent. In place, out
// is in and out_strides are in_strides.
struct RopeTensor {
  const void* in = nullptr;
  void* out = nullptr;
  int heads = 0;
  HeadStrides in_strides, out_strides;
};

// Frequencies from theta: log2(theta) and the Llama 3.1 scaling (factor 0: none).
struct RopeThetaParams {
  double log2_theta = 0;
  double factor = 0, low_freq_factor = 0, high_freq_factor = 0, original_max_position = 0;
};

struct RopeParams {
  RopeTensor q, k;
  int64_t batch = 0, seq = 0;  // tokens = batch * seq
  const void* positions = nullptr;
  bool positions_i64 = false;
  int64_t positions_batch_stride = 0;  // 0: one row of positions for every batch entry
  int rot_dim = 0;
  // Elements [rot_dim, rot_dim + tail) of each head copied from in to out: head_dim -
  // rot_dim out of place, 0 in place.
  int tail = 0;
  float sin_sign = 1.0f;  // -1: the inverse rotation (backward)
  const float* cache = nullptr;  // [cache_rows, rot_dim] cos | sin; null: theta
  int64_t cache_rows = 0;
  RopeThetaParams theta;
};

constexpr double kTwoPi = 6.283185307179586476925;

// inv_freq[i] = theta^(-2i / rot_dim), with Llama 3.1's rescaling of long wavelengths.
LLMK_HOST_DEVICE inline double rope_inv_freq(const RopeThetaParams& t, int i, int rot_dim) {
  const double inv = exp2(-2.0 * i / rot_dim * t.log2_theta);
  if (t.factor == 0) return inv;
  const double wavelen = kTwoPi / inv;
  if (wavelen < t.original_max_position / t.high_freq_factor) return inv;
  if (wavelen > t.original_max_position / t.low_freq_factor) return inv / t.factor;
  const double smooth = (t.original_max_position / wavelen - t.low_freq_factor) /
                        (t.high_freq_factor - t.low_freq_factor);
  return (1.0 - smooth) * inv / t.factor + smooth * inv;
}

// The CUDA launcher and the CPU reference, called after the arguments are validated.
// `vector_ok`: q and k and their outputs start 16-byte aligned, their strides are whole
// 16-byte vectors and rot_dim / 2 and the tail are multiples of the 16-byte vector.
void rope_cuda(const RopeParams& p, RopeStyle style, DType dtype, bool vector_ok,
               cudaStream_t stream);
void rope_cpu(const RopeParams& p, RopeStyle style, DType dtype);

}  // namespace llmk::detail
