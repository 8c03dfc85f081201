// Programmatic dependent launch (PDL) of the memory-bound kernels: in a stream of llmk
// kernels, each one's launch and prologue overlap the previous one's tail (what costs at
// 1-16 tokens, where a kernel's own work is shorter than a launch). On sm_90 and newer the
// launch carries the programmatic-stream-serialization attribute; the kernel begins with
// ptx::pdl_start() (wait for the previous grid's memory, then let the next grid launch), so
// no input is read and no output written before the previous kernel has completed. Without
// a previous kernel, or on older GPUs, the wait returns at once. LLMK_PDL=0 turns it off.
// What a chain of dependent one-row kernels costs with and without it, and llmk's own at 1
// token: bench/micro/pdl_chain_floor.cu (results in docs/benchmarks.md).
//
// The parameter block's first reads. A launch's first read of each 64-byte line of its
// parameter block misses the constant cache; made after the wait, each such miss adds to a
// decode-sized kernel's time, and the misses serialize behind one another (the row check,
// then the row's addresses, then eps after the reduction). So the row kernels exit a block
// (or thread) that has no work before the wait, on a test that reads a field of each line
// their first row needs: the branch keeps the reads before the wait, where they overlap the
// previous kernel's tail. (Values merely held in registers through an empty asm did not:
// ptxas sank the reads past the wait.)
#pragma once

#include <cuda_runtime.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "common/cuda_check.h"

namespace llmk::detail {

// Whether launches on the current device carry the PDL attribute (cached per device).
bool pdl_enabled();

// A kernel known by address with an argument array (cudaLaunchKernel's form), with the PDL
// attribute where enabled.
void launch_pdl(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args);

// As launch_pdl, the grid in clusters of `cluster` blocks along x (the cluster-dimension
// launch attribute beside the PDL one; sm_90 and newer, grid.x a multiple of `cluster`).
// cluster = 1: no cluster attribute (launch_pdl).
void launch_pdl_cluster(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        void** args, unsigned cluster);

// As launch_pdl_cluster without the PDL attribute: for kernels that do not wait for the
// previous grid (they may read its outputs from their first instruction).
void launch_cluster(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
                    unsigned cluster);

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where enabled.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  std::tuple<std::remove_cv_t<Params>...> values(std::forward<Args>(args)...);
  std::apply(
      [&](auto&... v) {
        void* pointers[] = {static_cast<void*>(&v)...};
        launch_pdl(reinterpret_cast<const void*>(kernel), grid, block, smem, stream, pointers);
      },
      values);
}

}  // namespace llmk::detail
