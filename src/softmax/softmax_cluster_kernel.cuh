// Softmax / log-softmax forward and backward of long rows, each row [n] split over a
// thread-block cluster of C <= 8 blocks (sm_90): grid (C, rows), cluster (C, 1, 1). At small
// batch it spreads a few rows over the SMs; at many rows it shortens each thread's serial
// work (softmax_cluster_launch.cuh has the rule and its reasons).
//
// Algorithm. Block r of a row's cluster holds columns [r * slice, (r + 1) * slice) in
// registers (VPT 16-byte vectors per thread, load_row as in softmax_vec_kernel) and reduces
// them to its (max key, sum) pair with block_max_sum, exactly as the one-block kernels do.
// Thread 0 publishes the pair in the block's shared memory; a cluster barrier (arrive.release
// / wait.acquire) makes every block's pair visible to the cluster. Lane k < C of every warp
// then reads block k's pair through distributed shared memory (mapa + ld.shared::cluster,
// by __cluster_map_shared_rank) and the warp merges the C pairs (warp_max_sum: the max, one
// rescale per pair, a sum; the same merge as the block's), so each warp holds the row's pair
// without another block barrier. The block then writes y of its slice from the registers:
// the row is read from memory once and written once, by C SMs instead of one. A second
// cluster barrier, arrived at once the peers' pairs are read and waited on before exit,
// keeps every block (and its shared memory) alive until no peer reads it any more; its
// arrival is off the critical path (the stores run between arrive and wait). The backward
// does the same with each block's part of dot = sum(dy y) (log_softmax: sum(dy)).
// Masked (-inf) entries and fully masked rows follow the other kernels (an all-masked slice
// publishes {-inf, 0}; an all-masked row gives zeros, log: -inf). In place (out == x) is
// safe: each block writes only the columns it read itself.
//
// Roofline. 1 x 128256 bf16: 256.5 KB read + 256.5 KB written = 513 KB, 0.17 us at 3 TB/s:
// the floor is launch and latency, not bandwidth. Per SM (C = 8): 16k elements, 32 KB in and
// out (~0.3 us each at one SM's ~100 GB/s), 32k ex2 at 16 per clock (~1.1 us at 1.75 GHz),
// one DRAM round trip (~1 us), block reduction + cluster barrier + DSMEM read (~0.5 us):
// expected ~5 us of kernel time in a CUDA graph. 16 x 151936 bf16: 9.7 MB, 3.2 us at 3 TB/s
// over 128 of 132 SMs; expected ~7 us.
// Cluster size 16 (non-portable) would halve the per-SM work at 1-8 rows again (~1 us less
// at 1 x 128256) but needs 16 co-resident SMs of one GPC: not tried.
// Many rows (bf16, H100): ~92% of copy at 8192 x 32000 over 2 blocks and 8192 x 128256 over 8.
#pragma once

#include <cuda/ptx>
#include <type_traits>

#include "softmax/softmax_backward_kernel.cuh"
#include "softmax/softmax_kernel.cuh"

namespace llmk::detail {

// Blocks per cluster at most: the portable limit.
inline constexpr int kSoftmaxMaxCluster = 8;

// The vectors per thread compiled for the forward cluster kernel: slices of 128 x 4 to
// 512 x 16 16-byte vectors; for the backward, which holds y and dy, 128 x 2 to 512 x 8.
inline constexpr bool softmax_cluster_vpt(int vpt) { return vpt == 4 || vpt == 8 || vpt == 16; }
inline constexpr bool softmax_backward_cluster_vpt(int vpt) { return vpt == 2 || vpt == 4 || vpt == 8; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Each block of the cluster publishes `own`, its block's value (in `published`, its shared
// memory); every thread gets the C blocks' values merged (warp_merge over lanes k < C, which
// read block k's value through distributed shared memory; the other lanes pass `empty`).
// Then the block may write its outputs; it waits on the cluster barrier before exit
// (cluster_merge_done), so that no peer reads its shared memory after it is gone.
template <class V, class WarpMerge>
__device__ __forceinline__ V cluster_merge(V& published, V own, V empty, WarpMerge warp_merge) {
  if (threadIdx.x == 0) published = own;
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
  const unsigned lane = threadIdx.x % 32;
  V peer = empty;
  if (lane < gridDim.x) peer = *static_cast<const V*>(__cluster_map_shared_rank(&published, lane));
  const V merged = warp_merge(peer);
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);  // done reading the peers' shared memory
  return merged;
}

__device__ __forceinline__ void cluster_merge_done() { cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire); }
#endif

// p: the whole rows; slice: columns per block (a multiple of N; the last block's slice may
// be shorter). Launched with gridDim = (C, rows) and cluster dims (C, 1, 1). At VPT 4, the
// many-rows shape, the launch bounds keep 4 blocks of 512 threads per SM (32 registers, 4
// bytes of spill): 3 blocks (38-40 registers) were slower.
template <class T, int N, int VPT, bool kLog>
__global__ void __launch_bounds__(512, VPT <= 4 ? 4 : 1) softmax_cluster_kernel(SoftmaxParams p, int slice) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::pdl_start();
  __shared__ MaxSum published;  // this block's pair, read by every block of the cluster
  const RowScale<T> sc(p);
  const int first = static_cast<int>(blockIdx.x) * slice;  // blockIdx.x is the cluster rank
  const int n = min(slice, static_cast<int>(p.n) - first);
  const int64_t row = blockIdx.y;
  Vec<T, N> s[VPT];
  const MaxSum own = block_max_sum(load_row(static_cast<const T*>(p.x) + row * p.x_stride + first, n, s, sc), sc);
  const MaxSum all =
      cluster_merge(published, own, MaxSum{-INFINITY, 0.0f}, [&](MaxSum v) { return warp_max_sum(v, sc); });
  store_row(static_cast<T*>(p.out) + row * p.out_stride + first, n, s, SoftmaxOut<T, kLog>(all, sc));
  cluster_merge_done();
#else
  (void)p;
  (void)slice;
#endif
}

// The backward over a cluster: each block holds its slice of y and dy in registers
// (load_backward_row), the blocks' partial dots merge as the forward's pairs do (a plain
// sum), and each block writes dx of its slice. In place (dx = y or dy) is safe: each block
// writes only the columns it read itself, after its block sum. Launch bounds: 4 blocks of
// 512 threads per SM at VPT 2 (the many-rows shape), 3 at VPT 4 (40 registers, no spill in
// 16-bit, 16 bytes in fp32; 48-51 registers otherwise, 2 blocks).
template <class T, int N, int VPT, bool kLog>
__global__ void __launch_bounds__(512, VPT <= 2 ? 4 : VPT == 4 ? 3 : 1)
    softmax_backward_cluster_kernel(SoftmaxBackwardParams p, int slice) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::pdl_start();
  __shared__ float published;  // this block's part of dot
  const int first = static_cast<int>(blockIdx.x) * slice;
  const int n = min(slice, static_cast<int>(p.n) - first);
  const int64_t row = blockIdx.y;
  Vec<T, N> yv[VPT], dyv[VPT];
  const float own = block_sum(load_backward_row<T, N, VPT, kLog>(
      static_cast<const T*>(p.y) + row * p.y_stride + first, static_cast<const T*>(p.dy) + row * p.dy_stride + first, n,
      yv, dyv));
  const float dot = cluster_merge(published, own, 0.0f, [](float v) { return warp_sum(v); });
  store_backward_row<T, N, VPT, kLog>(static_cast<T*>(p.dx) + row * p.dx_stride + first, n, yv, dyv, dot, p.scale);
  cluster_merge_done();
#else
  (void)p;
  (void)slice;
#endif
}

// The one instantiation list of the cluster kernels: every dtype, softmax and log_softmax,
// forward (Params = SoftmaxParams) and backward, VPT in softmax_cluster_vpt /
// softmax_backward_cluster_vpt; nullptr for any other VPT.
template <class Params, class T, int VPT>
const void* softmax_cluster_kernel_ptr(bool log) {
  constexpr int N = kVec16<T>;
  if constexpr (std::is_same_v<Params, SoftmaxParams>) {
    if constexpr (softmax_cluster_vpt(VPT))
      return log ? reinterpret_cast<const void*>(softmax_cluster_kernel<T, N, VPT, true>)
                 : reinterpret_cast<const void*>(softmax_cluster_kernel<T, N, VPT, false>);
  } else if constexpr (softmax_backward_cluster_vpt(VPT)) {
    return log ? reinterpret_cast<const void*>(softmax_backward_cluster_kernel<T, N, VPT, true>)
               : reinterpret_cast<const void*>(softmax_backward_cluster_kernel<T, N, VPT, false>);
  }
  (void)log;
  return nullptr;
}

}  // namespace llmk::detail
