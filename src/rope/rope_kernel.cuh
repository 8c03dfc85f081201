// RoPE kernel: rotates the first rot_dim elements of every q and k head, in place or from
// the inputs into separate outputs (then also copying elements [rot_dim, head_dim)).
//
// Block layout (x, y, z) = (chunks of one head, head lanes, tokens). Thread x < rot_dim / 2P
// holds the cos/sin of the P pairs [x * P, x * P + P) of its token and rotates those pairs
// in every head of q and k that its head lane visits (heads y, y + blockDim.y, ...). With a
// cache each thread reads its cos/sin row slice itself; from theta (double-precision math)
// the block computes each (token, pair) once into shared memory first. Two heads are in
// flight per thread: the first two are loaded before the angles, so their latency overlaps
// the position -> cache (or angle) chain, and each later head is loaded while the one before
// it is rotated and stored. Loaded vectors stay packed (opaque: 4 registers per 16 bytes,
// not one per 16-bit element) until they are rotated. A pair chunk is two vectors of P
// elements: x[i .. i+P) and x[half + i .. half + i + P) in the NeoX style, x[2i .. 2i + 2P)
// in the GPT-J style (pairs adjacent), 16-byte vectors where alignment allows (P = 8 for
// f16/bf16, 4 for f32), else P = 1. Out of place, the threads after the pair chunks each
// hold two vectors of the tail [rot_dim, head_dim) instead and copy them: the same loads,
// stores and head loop without the rotation, so the tail costs neither registers nor a
// second code path. In place is the same kernel with out == in and no tail threads (run-time
// values, one instantiation).
//
// Roofline: in place each rotated element is read and written once, 2 * tokens * (heads_q +
// heads_k) * rot_dim * sizeof(T) bytes; out of place every element is, 2 * tokens *
// (heads_q + heads_k) * head_dim * sizeof(T) (a copy followed by the in-place op moves
// 2x that at full rotary); plus per token its position and rot_dim cache floats (~3% more
// at 40 heads of 128); ~6 FLOPs per pair. Memory-bound: at 8192 tokens, 32 + 8 heads of
// 128 bf16, 168 MB move in ~56 us at 3.0 TB/s, in place or out of place. Bytes in flight
// decide how close it gets, hence two heads in flight per thread (docs/history/rope.md,
// "Two heads in flight"): 61 us, 91% of the copy rate.
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

// The two vectors of P elements a thread moves per head, at element offsets a_at and b_at:
// thread x < chunks holds pair chunk x (NeoX x[i..i+P) and x[half+i..); GPT-J
// x[2i..2i+2P), i = x * P), which it rotates; out of place, thread chunks + t holds tail
// vectors 2t and 2t + 1 of [rot_dim, head_dim) (the second absent past head_dim), which it
// copies. One code path for both, so that copying the tail costs no registers.
template <class T, int P, RopeStyle S>
struct HeadChunk {
  int a_at, b_at;
  bool has_b;
  Vec<T, P> a, b;

  __device__ __forceinline__ HeadChunk(const RopeParams& p, bool rotates) {
    const int half = p.rot_dim / 2, i = threadIdx.x * P;
    if (rotates) {
      a_at = S == RopeStyle::neox ? i : 2 * i;
      b_at = S == RopeStyle::neox ? half + i : 2 * i + P;
    } else {
      a_at = p.rot_dim + 2 * (i - half);
      b_at = a_at + P;
    }
    has_b = b_at < p.rot_dim + p.tail || rotates;
  }

  __device__ __forceinline__ void load(const T* x) {
    a = load_vec<T, P>(x + a_at);
    if (has_b) b = load_vec<T, P>(x + b_at);
    // Kept as loaded until rotate(): ptxas otherwise unpacks the 16-bit elements on arrival
    // and holds a head in twice the registers.
    if constexpr (sizeof(Vec<T, P>) % 4 == 0) {
      opaque(a);
      opaque(b);
    }
  }

  __device__ __forceinline__ void store(T* y) const {
    store_vec<T, P>(y + a_at, a);
    if (has_b) store_vec<T, P>(y + b_at, b);
  }

  // NeoX: pair j is (a[j], b[j]); GPT-J: a and b are adjacent, pair j is elements 2j, 2j+1.
  __device__ __forceinline__ void rotate(const float2 (&cs)[P]) {
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
  }
};

// With a cache, 56 registers (ptxas takes 62-64 for the two heads in flight; 56 spills
// nothing): 7 blocks of 160 threads per SM instead of 6. The theta kernels, whose angles come
// from shared memory, keep ptxas's 63-64.
template <class T, int P, RopeStyle S, bool kCache>
__global__ void __maxnreg__(kCache ? 56 : 64) rope_kernel(const RopeParams p) {
  ptx::pdl_start();
  extern __shared__ float2 angles[];  // theta: [blockDim.z tokens][rot_dim / 2] (cos, sin)
  const int half = p.rot_dim / 2;
  const int64_t tokens = p.batch * p.seq;
  const int64_t first_token = static_cast<int64_t>(blockIdx.x) * blockDim.z;
  const int64_t token = first_token + threadIdx.z;
  const int heads = p.q.heads + p.k.heads;
  const int64_t b = token / p.seq, s = token - b * p.seq;
  // Head h of q (h < heads_q) or k: where it is read and where it is written (the same
  // memory in place). Field by field: a reference to p.q or p.k chosen at run time would
  // copy the parameters to local memory.
  auto head_in = [&](int h) {
    const bool in_q = h < p.q.heads;
    const int head = in_q ? h : h - p.q.heads;
    return static_cast<const T*>(in_q ? p.q.in : p.k.in) +
           b * (in_q ? p.q.in_strides.batch : p.k.in_strides.batch) +
           s * (in_q ? p.q.in_strides.seq : p.k.in_strides.seq) +
           head * (in_q ? p.q.in_strides.head : p.k.in_strides.head);
  };
  auto head_out = [&](int h) {
    const bool in_q = h < p.q.heads;
    const int head = in_q ? h : h - p.q.heads;
    return static_cast<T*>(in_q ? p.q.out : p.k.out) +
           b * (in_q ? p.q.out_strides.batch : p.k.out_strides.batch) +
           s * (in_q ? p.q.out_strides.seq : p.k.out_strides.seq) +
           head * (in_q ? p.q.out_strides.head : p.k.out_strides.head);
  };
  const int i = threadIdx.x * P;
  const bool rotates = i < half;
  HeadChunk<T, P, S> chunk(p, rotates), next = chunk;
  const int lanes = blockDim.y;
  const bool active = token < tokens && static_cast<int>(threadIdx.y) < heads;
  if (active) {
    chunk.load(head_in(threadIdx.y));
    if (threadIdx.y + lanes < heads) next.load(head_in(threadIdx.y + lanes));
  }

  float2 cs[P];
  if constexpr (kCache) {
    // Cache rows are read by each thread directly (L1/L2 hits after the first head lane):
    // a shared-memory staging step with its barrier was slower.
    if (!active) return;
    if (rotates) {
      const int64_t pos = rope_position(p, b, s);
#pragma unroll
      for (int j = 0; j < P; ++j) cs[j] = rope_angle<true>(p, pos, i + j);
    }
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
    if (rotates) {
#pragma unroll
      for (int j = 0; j < P; ++j) cs[j] = angles[threadIdx.z * half + i + j];
    }
  }
  for (int h = threadIdx.y;;) {
    if (rotates) chunk.rotate(cs);
    chunk.store(head_out(h));
    h += lanes;
    if (h >= heads) break;
    chunk = next;
    if (h + lanes < heads) next.load(head_in(h + lanes));
  }
}

}  // namespace llmk::detail
