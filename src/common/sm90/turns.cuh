// Turn counters in global memory that order bulk reduce-adds of several blocks into one
// place, so that the fp32 sums come out bitwise the same on every run. A block whose rank
// is r waits until the counter reads r, issues its reduce-adds, waits until they have
// completed (written, not only read their shared memory) and passes the turn (counter + 1).
// The counter starts at 0. The wait cannot deadlock if the ranks follow the order in which
// the blocks are dispatched (a block never waits on one dispatched after it), or if every
// block it waits on is dispatched while it waits (all of them fit the GPU at once).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace llmk::detail::sm90 {

__device__ __forceinline__ void wait_for_turn(const int* counter, int rank) {
  int seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    if (seen == rank) break;
    __nanosleep(32);
  }
  // The reduce-adds issued after this (async proxy) come after the earlier ranks' ones.
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
}

// After cp.async.bulk.wait_group 0 of this thread's reduce-adds.
__device__ __forceinline__ void pass_turn(int* counter) {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace llmk::detail::sm90
