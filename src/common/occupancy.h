// Resident blocks per SM of a kernel at a block size, from the CUDA occupancy calculator,
// remembered per (kernel, block size, device) so a launch pays for the query once.
#pragma once

namespace llmk::detail {

int blocks_per_sm(const void* kernel, int threads, int device);

}  // namespace llmk::detail
