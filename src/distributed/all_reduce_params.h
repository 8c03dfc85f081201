// all_reduce_add_rmsnorm's peer buffer layout and the parameter block of its kernel (shared
// by the API, which validates and fills it, and the launcher).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "llmk/all_reduce.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// The kernel's grid, the same at every call (see the kernel's header: the call count that
// picks a call's message slots is kept per block).
inline constexpr int kPeerBlocks = 128;
// A peer buffer: flags at 0, uint32 [kPeerBlocks][kPeerMaxRanks], where rank r's block b
// stores its call count at [b][r] once its rows are in this rank's slots (the two-shot
// kernel's second exchange uses the gather flags, the same array at kPeerGatherFlagsOffset);
// this rank's call counts per block at kPeerCountsOffset, uint32 [kPeerBlocks]; then the
// message slots at kPeerDataOffset, capacity bytes each: [2 (call count parity)][world
// (source rank)], then the two-shot kernel's gather slots [2 (parity)].
inline constexpr size_t kPeerFlagsOffset = 0;
inline constexpr size_t kPeerGatherFlagsOffset = sizeof(uint32_t) * kPeerBlocks * kPeerMaxRanks;
inline constexpr size_t kPeerCountsOffset = 2 * kPeerGatherFlagsOffset;
inline constexpr size_t kPeerDataOffset = 16384;
static_assert(kPeerCountsOffset + sizeof(uint32_t) * kPeerBlocks <= kPeerDataOffset, "peer buffer header");

// The kernel of a call: one-shot (each rank sends (world - 1) x the message) or two-shot
// (2 (world - 1) / world x, one more exchange).
enum class AllReduceKernel { one_shot, two_shot };

struct AllReduceNormParams {
  void* x = nullptr;                   // [rows, d], contiguous rows
  void* residual = nullptr;            // [rows, d], rows residual_stride elements apart
  const void* weight = nullptr;        // [d]
  int64_t rows = 0;
  int64_t d = 0;
  int64_t residual_stride = 0;
  float eps = 0.0f;
  float offset = 0.0f;
  int rank = 0;
  int world = 0;
  int64_t capacity = 0;                // bytes of one message slot
  unsigned long long timeout_ns = 0;   // how long a block waits for a peer before it traps
  uint8_t* buffers[kPeerMaxRanks] = {};
};

void all_reduce_add_rmsnorm_cuda(const AllReduceNormParams& p, AllReduceKernel kernel, DType act, DType weight,
                                 cudaStream_t stream);

}  // namespace llmk::detail
