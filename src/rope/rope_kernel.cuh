// RoPE kernel: rotates the first rot_dim elements of every q and k head in place.
//
// Block layout (x, y, z) = (pair chunks of one head, head lanes, tokens). Thread x holds
// the cos/sin of the P pairs [x * P, x * P + P) of its token and rotates those pairs in
// every head of q and k that its head lane visits (heads y, y + blockDim.y, ...). With a
// cache each thread reads its cos/sin row slice itself; from theta (double-precision
// math) the block computes each (token, pair) once into shared memory first. The first
// head's vectors are loaded before the angles, so their latency overlaps the position ->
// cache (or angle) chain. A pair chunk is two
// vectors of P elements: x[i .. i+P) and x[half + i .. half + i + P) in the NeoX style,
// x[2i .. 2i + 2P) in the GPT-J style (pairs adjacent), 16-byte vectors where alignment
// allows (P = 8 for f16/bf16, 4 for f32), else P = 1.
//
// Roofline: each rotated element is read and written once, 2 * tokens * (heads_q + heads_k)
// * rot_dim * sizeof(T) bytes, plus per token its position and rot_dim cache floats
// (~3% more at 40 heads of 128); ~6 FLOPs per pair. Memory-bound: at 8192 tokens, 32 + 8
// heads of 128 bf16, 168 MB move in ~56 us at 3.0 TB/s.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/vec.cuh"
#include "rope/rope_params.h"

namespace llmk::detail {

__device__ __forceinline__ int64_t rope_position(const RopeParams& p, int64_t b, int64_t s) {
  const int64_t i = b * p.positions_batch_stride + s;
  return p.positions_i64 ? static_cast<const int64_t*>(p.positions)[i]
                         : static_cast<const int32_t*>(p.positions)[i];
}

// (cos, sin) of pair i at position `pos`; NaN for a position outside the cache, which is
// never read past (the rotated elements of that token become NaN).
template <bool kCache>
__device__ __forceinline__ float2 rope_angle(const RopeParams& p, int64_t pos, int i) {
  float c, s;
  if constexpr (kCache) {
    if (pos < 0 || pos >= p.cache_rows) return make_float2(NAN, NAN);
    const float* row = p.cache + pos * p.rot_dim;
    c = row[i];
    s = row[p.rot_dim / 2 + i];
  } else {
    // The angle in double, reduced to [-pi, pi] before the float sincos: pos * inv_freq in
    // float would be off by ~1e-7 * pos radians.
    double angle = static_cast<double>(pos) * rope_inv_freq(p.theta, i, p.rot_dim);
    angle -= rint(angle * (1.0 / kTwoPi)) * kTwoPi;
    sincosf(static_cast<float>(angle), &s, &c);
  }
  return make_float2(c, p.sin_sign * s);
}

// The two vectors of a pair chunk: NeoX x[i..i+P) and x[half+i..); GPT-J x[2i..2i+2P).
template <class T, int P, RopeStyle S>
struct PairChunk {
  T* pa;
  T* pb;
  Vec<T, P> a, b;

  __device__ __forceinline__ void load(T* x, int i, int half) {
    pa = S == RopeStyle::neox ? x + i : x + 2 * i;
    pb = S == RopeStyle::neox ? x + half + i : x + 2 * i + P;
    a = load_vec<T, P>(pa);
    b = load_vec<T, P>(pb);
  }

  // NeoX: pair j is (a[j], b[j]); GPT-J: a and b are adjacent, pair j is elements 2j, 2j+1.
  __device__ __forceinline__ void rotate_and_store(const float2 (&cs)[P]) {
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
      const float2 r = cs[j];
      e[i1] = x1 * r.x - x2 * r.y;
      e[i2] = x2 * r.x + x1 * r.y;
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      a.v[j] = from_float<T>(e[j]);
      b.v[j] = from_float<T>(e[P + j]);
    }
    store_vec<T, P>(pa, a);
    store_vec<T, P>(pb, b);
  }
};

template <class T, int P, RopeStyle S, bool kCache>
__global__ void rope_kernel(const RopeParams p) {
  ptx::pdl_start();
  extern __shared__ float2 angles[];  // theta: [blockDim.z tokens][rot_dim / 2] (cos, sin)
  const int half = p.rot_dim / 2;
  const int64_t tokens = p.batch * p.seq;
  const int64_t first_token = static_cast<int64_t>(blockIdx.x) * blockDim.z;
  const int64_t token = first_token + threadIdx.z;
  const int heads = p.q.heads + p.k.heads;
  const int64_t b = token / p.seq, s = token - b * p.seq;
  auto head_data = [&](int h) {
    const bool in_q = h < p.q.heads;
    const int head = in_q ? h : h - p.q.heads;
    return static_cast<T*>(in_q ? p.q.data : p.k.data) +
           b * (in_q ? p.q.batch_stride : p.k.batch_stride) +
           s * (in_q ? p.q.seq_stride : p.k.seq_stride) +
           head * (in_q ? p.q.head_stride : p.k.head_stride);
  };
  const int i = threadIdx.x * P;
  PairChunk<T, P, S> chunk;
  const bool active = token < tokens && static_cast<int>(threadIdx.y) < heads;
  if (active) chunk.load(head_data(threadIdx.y), i, half);

  float2 cs[P];
  if constexpr (kCache) {
    // Cache rows are read by each thread directly (L1/L2 hits after the first head lane):
    // a shared-memory staging step with its barrier measured slower (65 vs 63 us at 8192 x
    // 40 heads of 128).
    if (!active) return;
    const int64_t pos = rope_position(p, b, s);
#pragma unroll
    for (int j = 0; j < P; ++j) cs[j] = rope_angle<true>(p, pos, i + j);
  } else {
    // Angles from theta cost double-precision math: each (token, pair) once per block.
    const int block_tokens =
        tokens - first_token < blockDim.z ? static_cast<int>(tokens - first_token) : blockDim.z;
    const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    for (int idx = tid; idx < block_tokens * half; idx += blockDim.x * blockDim.y * blockDim.z) {
      const int t = idx / half;
      const int64_t tb = (first_token + t) / p.seq, ts = first_token + t - tb * p.seq;
      angles[idx] = rope_angle<false>(p, rope_position(p, tb, ts), idx - t * half);
    }
    __syncthreads();
    if (!active) return;
#pragma unroll
    for (int j = 0; j < P; ++j) cs[j] = angles[threadIdx.z * half + i + j];
  }
  for (int h = threadIdx.y;;) {
    chunk.rotate_and_store(cs);
    h += blockDim.y;
    if (h >= heads) break;
    chunk.load(head_data(h), i, half);
  }
}

}  // namespace llmk::detail
