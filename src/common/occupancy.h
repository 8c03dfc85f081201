// Resident blocks per SM of a kernel at a block size, from the CUDA occupancy calculator,
// and whether the kernel spills to local memory; remembered per (kernel, block size,
// device) so a launch pays for the queries once.
#pragma once

namespace llmk::detail {

struct KernelFit {
  int blocks_per_sm;
  bool spills;  // uses local memory (register spills or a dynamically indexed array)
};

KernelFit kernel_fit(const void* kernel, int threads, int device);

// Streaming multiprocessors of CUDA device `device`.
int sm_count_of(int device);

}  // namespace llmk::detail
