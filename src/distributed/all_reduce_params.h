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
// A peer buffer: this rank's call counts per block at kPeerCountsOffset, uint32 [kPeerBlocks]
// (zero at allocation); then the message slots at kPeerDataOffset, capacity bytes each: [2
// (call count parity)][world (source rank)], then the two-shot kernel's gather slots [2
// (parity)], every word kEmptyWord at allocation (fill_peer_slots_cuda) and after each read.
inline constexpr size_t kPeerCountsOffset = 0;
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
  uint32_t timeout_ticks = 0;          // how long a thread waits for a peer before it traps, in
                                       // 2^20 ns ticks
  uint8_t* buffers[kPeerMaxRanks] = {};
};

// Marks every message slot of a new buffer of `bytes` empty (stream 0; the caller synchronizes).
void fill_peer_slots_cuda(void* buffer, size_t bytes);

void all_reduce_add_rmsnorm_cuda(const AllReduceNormParams& p, AllReduceKernel kernel, DType act, DType weight,
                                 cudaStream_t stream);

}  // namespace llmk::detail
