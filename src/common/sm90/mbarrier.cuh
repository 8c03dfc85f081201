// The multi-stage shared-memory ring between a producer (TMA) and its consumers (wgmma),
// on raw mbarriers with parity waits (cheaper than cuda::barrier's arrival tokens).
//
// Stage s has two barriers: full[s] (one producer arrival + the TMA bytes) and empty[s]
// (one arrival per consumer warpgroup once its MMAs no longer read the stage). Both sides
// walk the stages in the same order with a RingState; the phase bit flips each time the
// ring wraps. The producer waits on empty with the opposite parity, so its first pass
// over a fresh ring does not block. With a cluster sharing loads by multicast, a stage is
// free only when the consumers of every block that receives it released it: they arrive
// on the empty barrier of each of those blocks (mbarrier_arrive_cluster).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace llmk::detail::sm90 {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  cuda::ptx::mbarrier_init(bar, count);
}

// Makes the initialized barriers visible to the async proxy (TMA) and the other threads
// (follow with __syncthreads()).
__device__ __forceinline__ void mbarrier_init_fence() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  (void)cuda::ptx::mbarrier_arrive(bar);
}

// The arrival of this thread's cp.async copies issued so far, once they complete (the
// barrier's pending count is raised now and lowered then: the expected count stays).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// Arrives on the barrier at the same shared offset as `bar` in block `cta_rank` of the
// cluster (this block's own included). CTA-scope release: the consumers that arrive only
// read the stage (through wgmma), so nothing of theirs must become visible to the other
// block; a .release.cluster arrive costs a cluster-wide fence per k step (measured: half
// the kernel's speed).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(local),
      "r"(cta_rank)
      : "memory");
}

// All threads of all blocks of the cluster (a block-wide barrier too).
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The producer's arrival, announcing `bytes` of TMA transactions.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, bar, bytes);
}

template <int kStages>
struct RingState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace llmk::detail::sm90
