// wgmma (sm_90a): warpgroup matrix multiply-accumulate with operands in shared memory.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. One
// wgmma_m64nNk16 (wgmma_ops.cuh) computes a 64 x N fp32 tile D += A[64 x 16] . B[N x 16]^T
// from two shared-memory descriptors. Accumulator fragment of thread (warp w of the
// group, lane l): d[4j + {0,1}] at row 16w + l/4, columns 8j + 2(l%4) + {0,1}, and
// d[4j + {2,3}] at row 16w + l/4 + 8, same columns (j < N/8).
//
// Operand tiles come from TMA with the 128-byte swizzle (tma.h), stored as rows of 128
// bytes (64 16-bit elements):
//   K-major (rows = M or N, 64 k per row): 8-row groups 1024 bytes apart (the stride
//     byte offset); the k16 step s starts 32 s bytes into the rows.
//   MN-major (rows = k, 64 M/N per row): 8-k-row groups 1024 bytes apart (stride byte
//     offset), consecutive 64-wide M/N chunks `chunk_bytes` apart (leading byte offset);
//     the k16 step s starts 2048 s bytes in.
// Order: wgmma_fence() before the first wgmma of a batch (and whenever other code touched
// the accumulators), wgmma_commit() after the batch, wgmma_wait<n>() until at most n
// batches are in flight before reading the accumulators or releasing their operands.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/sm90/wgmma_ops.cuh"

namespace llmk::detail::sm90 {

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (each >> 4), layout type 1 in bits [62, 64).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// `desc` moved on by `bytes` (a multiple of 16): the address field (bits 0-13) holds
// addr >> 4 and shared addresses stay below 256 KB, so the sum never carries out of it;
// one 32-bit add instead of the descriptor's masks and shifts again.
__device__ __forceinline__ uint64_t descriptor_advanced(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Bytes from the start of a K-major tile (128-byte swizzle, 64-column chunks of
// `chunk_bytes`) to its k16 step `s`: 32 per step within a chunk, four steps per chunk.
__device__ __forceinline__ uint32_t kmajor_step_bytes(int s, uint32_t chunk_bytes) {
  return (s / 4) * chunk_bytes + 32u * (s % 4);
}

// `v` as lane 0 holds it, for a value every lane of the warp holds (a shared address):
// ptxas then knows it is warp-uniform and keeps descriptor arithmetic on it in uniform
// registers, instead of vector registers and an R2UR per wgmma operand. Every lane calls it.
__device__ __forceinline__ uint32_t warp_uniform(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }

// Descriptor of k16 step `s` of a swizzled tile at `smem_addr` (see above).
template <bool kKMajor>
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t smem_addr, int s, uint32_t chunk_bytes) {
  if constexpr (kKMajor) return smem_descriptor(smem_addr + 32u * s, 16, 1024);
  else return smem_descriptor(smem_addr + 2048u * s, chunk_bytes, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The fp32 accumulators `acc` of a 64 x 16 kK tile (its 8-column tiles acc[0][nt]) rounded to
// T as the register A operands of kK k16 steps (the _rs wgmma forms): a[k] packs the pairs of
// 8-column tiles 2k and 2k + 1, rows lane/4 and lane/4 + 8.
template <class T, int kK>
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[kK][4], const float (&acc)[1][2 * kK][4]) {
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    a[k][0] = ptx::pack2<T>(acc[0][2 * k][0], acc[0][2 * k][1]);
    a[k][1] = ptx::pack2<T>(acc[0][2 * k][2], acc[0][2 * k][3]);
    a[k][2] = ptx::pack2<T>(acc[0][2 * k + 1][0], acc[0][2 * k + 1][1]);
    a[k][3] = ptx::pack2<T>(acc[0][2 * k + 1][2], acc[0][2 * k + 1][3]);
  }
}

// Keeps the compiler from moving accumulator reads/writes across an async wgmma.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for register A operands: keeps them (and their registers) live until here, so
// that nothing is written over them while an async wgmma may still read them.
template <int kK>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[kK][4]) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
}

}  // namespace llmk::detail::sm90
