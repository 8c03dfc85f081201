// Occupancy queries: resident blocks per SM of a kernel at a block size, from the CUDA
// occupancy calculator, and whether the kernel spills to local memory (kernel_fit, remembered
// per (kernel, block size, device, shared memory) so a launch pays for the queries once); the device's SM
// count; resident clusters of a kernel (max_active_clusters; resident_clusters remembers the
// answers).
#pragma once

#include <cstddef>

namespace llmk::detail {

struct KernelFit {
  int blocks_per_sm;
  bool spills;  // uses local memory (register spills or a dynamically indexed array)
};

// `smem`: dynamic shared memory per block (a kernel that needs more than 48 KB must have
// been allowed it first, cudaFuncAttributeMaxDynamicSharedMemorySize).
KernelFit kernel_fit(const void* kernel, int threads, int device, size_t smem = 0);

// Streaming multiprocessors of CUDA device `device`.
int sm_count_of(int device);

// What the code of `kernel` that runs on `device` (the current device) allows: the most
// dynamic shared memory a block can ask for (the device's opt-in limit less the kernel's
// static shared memory), and the PTX version it was compiled from (80 for sm_80 machine
// code, or sm_80 PTX that the driver compiled for a newer GPU). Remembered per (kernel,
// device).
struct KernelLimits {
  int max_dynamic_smem;
  int ptx_version;
};
KernelLimits kernel_limits(const void* kernel, int device);

// Clusters of `cluster` blocks (along x) of `threads` threads and `smem` bytes of dynamic
// shared memory that `kernel` can keep resident at once on the current device
// (cudaOccupancyMaxActiveClusters); 0 where not even one fits or the device cannot launch
// the cluster (the error the query leaves is cleared).
int max_active_clusters(const void* kernel, int threads, size_t smem, int cluster);

// max_active_clusters of `kernel` on `device` (which must be the current device: the query
// runs there), remembered per (kernel, device, threads, smem, cluster): a launcher that picks
// its cluster size per call pays for the query once.
int resident_clusters(const void* kernel, int threads, size_t smem, int cluster, int device);

}  // namespace llmk::detail
