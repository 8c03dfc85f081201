// Warpgroup roles of the warp-specialized kernels: one producer warpgroup issues TMA and
// gives most of its registers away (setmaxnreg.dec), consumer warpgroups take them
// (setmaxnreg.inc) for their accumulators. setmaxnreg only takes effect in a kernel with
// a register cap at entry (__launch_bounds__(threads, 1)), and the counts must be
// multiples of 8 whose sum over the block fits the register file (64K per SM).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

namespace llmk::detail::sm90 {

inline constexpr int kWarpgroupThreads = 128;
// The most dynamic shared memory one block may opt into on sm_90 (227 KB).
inline constexpr int kMaxBlockSharedBytes = 232448;

template <int kRegs>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barriers: common/ptx.cuh's, as the warp-specialized kernels name them.
using ptx::named_barrier_arrive;
using ptx::named_barrier_sync;

__device__ __forceinline__ int warpgroup_index() { return static_cast<int>(threadIdx.x) / kWarpgroupThreads; }

}  // namespace llmk::detail::sm90
