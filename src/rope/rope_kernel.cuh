// RoPE kernel: rotates the first rot_dim elements of every q and k head in place.
//
// Block layout (x, y, z) = (pair chunks of one head, head lanes, tokens). Thread x owns
// the P pairs [x * P, x * P + P) of the rotation: it computes their cos/sin once for its
// token (from the cache or from theta) and then rotates those pairs in every head of q
// and k that its head lane visits (heads y, y + blockDim.y, ...). A pair chunk is two
// vectors of P elements: x[i .. i+P) and x[half + i .. half + i + P) in the NeoX style,
// x[2i .. 2i + 2P) in the GPT-J style (pairs adjacent), 16-byte vectors where alignment
// allows (P = 8 for f16/bf16, 4 for f32), else P = 1.
//
// Roofline: each rotated element is read and written once, 2 * tokens * (heads_q + heads_k)
// * rot_dim * sizeof(T) bytes, plus the positions and (per token) rot_dim floats of cache
// read by every head lane, mostly from L1/L2; ~6 FLOPs per pair. Memory-bound: at 8192
// tokens, 32 + 8 heads of 128 bf16, 168 MB move in ~56 us at 3.0 TB/s.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/device_types.cuh"
#include "common/vec.cuh"
#include "rope/rope_params.h"

namespace llmk::detail {

__device__ __forceinline__ int64_t rope_position(const RopeParams& p, int64_t b, int64_t s) {
  const int64_t i = b * p.positions_batch_stride + s;
  return p.positions_i64 ? static_cast<const int64_t*>(p.positions)[i]
                         : static_cast<const int32_t*>(p.positions)[i];
}

// cos/sin of the P pairs starting at pair `i` for position `pos`; false when the position
// lies outside the cache (the caller then writes NaN instead of reading past it).
template <int P, bool kCache>
__device__ __forceinline__ bool rope_angles(const RopeParams& p, int64_t pos, int i,
                                            float (&cos_v)[P], float (&sin_v)[P]) {
  if constexpr (kCache) {
    if (pos < 0 || pos >= p.cache_rows) return false;
    const float* row = p.cache + pos * p.rot_dim + i;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      cos_v[j] = row[j];
      sin_v[j] = p.sin_sign * row[p.rot_dim / 2 + j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      // The angle in double, reduced to [-pi, pi] before the float sincos: pos * inv_freq
      // in float would be off by ~1e-7 * pos radians.
      double angle = static_cast<double>(pos) * rope_inv_freq(p.theta, i + j, p.rot_dim);
      angle -= rint(angle * (1.0 / kTwoPi)) * kTwoPi;
      sincosf(static_cast<float>(angle), &sin_v[j], &cos_v[j]);
      sin_v[j] *= p.sin_sign;
    }
  }
  return true;
}

template <class T, int P, RopeStyle S>
__device__ __forceinline__ void rope_rotate(T* x, int i, int half, const float (&cos_v)[P],
                                            const float (&sin_v)[P], bool valid) {
  // NeoX: pair j is (a[j], b[j]); GPT-J: a and b are adjacent, pair j is elements 2j, 2j+1.
  T* pa = S == RopeStyle::neox ? x + i : x + 2 * i;
  T* pb = S == RopeStyle::neox ? x + half + i : x + 2 * i + P;
  Vec<T, P> a = load_vec<T, P>(pa), b = load_vec<T, P>(pb);
  float e[2 * P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    e[j] = to_float(a.v[j]);
    e[P + j] = to_float(b.v[j]);
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i1 = S == RopeStyle::neox ? j : 2 * j;
    const int i2 = S == RopeStyle::neox ? P + j : 2 * j + 1;
    const float x1 = e[i1], x2 = e[i2];
    e[i1] = valid ? x1 * cos_v[j] - x2 * sin_v[j] : NAN;
    e[i2] = valid ? x2 * cos_v[j] + x1 * sin_v[j] : NAN;
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    a.v[j] = from_float<T>(e[j]);
    b.v[j] = from_float<T>(e[P + j]);
  }
  store_vec<T, P>(pa, a);
  store_vec<T, P>(pb, b);
}

template <class T, int P, RopeStyle S, bool kCache>
__global__ void rope_kernel(const RopeParams p) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z;
  if (token >= p.batch * p.seq) return;
  const int64_t b = token / p.seq, s = token - b * p.seq;
  const int i = threadIdx.x * P;
  float cos_v[P], sin_v[P];
  const bool valid = rope_angles<P, kCache>(p, rope_position(p, b, s), i, cos_v, sin_v);
  const int heads = p.q.heads + p.k.heads;
  for (int h = threadIdx.y; h < heads; h += blockDim.y) {
    const bool in_q = h < p.q.heads;
    const int head = in_q ? h : h - p.q.heads;
    T* base = static_cast<T*>(in_q ? p.q.data : p.k.data);
    const int64_t offset = b * (in_q ? p.q.batch_stride : p.k.batch_stride) +
                           s * (in_q ? p.q.seq_stride : p.k.seq_stride) +
                           head * (in_q ? p.q.head_stride : p.k.head_stride);
    rope_rotate<T, P, S>(base + offset, i, p.rot_dim / 2, cos_v, sin_v, valid);
  }
}

}  // namespace llmk::detail
