// Tensor parallel: the all-reduce of a row-parallel projection's partial sums (attention's
// o_proj, the MLP's down_proj) fused with the residual add and RMSNorm that follow it,
//
//   residual += sum over ranks of x;   x = rmsnorm(residual, weight, eps, offset)
//
// in one kernel per rank, over peer buffers: each rank of a group on one host maps every other
// rank's buffer into its address space (CUDA IPC) and the kernel moves the data with plain
// 16-byte stores and loads over NVLink (no NVLink multicast, no collective library); the data
// are their own arrival flags (an empty slot holds a mark no value sent holds). Groups of 2
// ranks take a one-shot kernel (every rank sends its x to every other); groups of 3 or more, from
// 128 KiB messages or 16 KiB rows, a two-shot one (a reduce-scatter then an all-gather of the
// sums: less NVLink traffic and less to receive per row, one more exchange), else the one-shot.
// LLMK_ALL_REDUCE_KERNEL=one_shot|two_shot forces one.
//
// The group: every rank allocates one peer buffer (allocate_peer_buffer, sized by
// peer_buffer_bytes for the largest message), sends its handle (peer_buffer_handle, 64 bytes)
// to the others by any means (llmk.distributed uses the torch process group) and maps theirs
// (open_peer_buffer). A PeerGroup then lists the buffers as this process sees them.
//
// Calls: every rank of the group calls all_reduce_add_rmsnorm with x of the same shape and
// dtype, in the same order, with the same LLMK_ALL_REDUCE_KERNEL setting (a mismatched call
// leaves data no rank reads, which a later call would take for its own); one call at a time
// per group (one stream, or calls ordered across streams; no programmatic dependent launch
// into it). A rank that skips a call leaves the others waiting: the kernel stops the process
// (a device trap, after a message naming the rank it waited for) once it has waited
// LLMK_ALL_REDUCE_TIMEOUT_S seconds (600 by default, NCCL's watchdog). The state that orders
// the calls lives in the buffers, so a call can be captured into a CUDA graph and replayed
// (every rank replaying the same sequence); such a graph holds the buffers' addresses, so it
// must be dropped before they are freed. Free a group's buffers only once every rank has
// closed its mapping of them.
//
// Numerics: the ranks' x are summed in fp32 in rank order and rounded to x's dtype (every
// rank computes the same bits), the sum is added to the residual and rounded, and the norm
// is rmsnorm's (fp32, one rounding). So every rank leaves the same residual and x.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "llmk/tensor.h"

namespace llmk {

// The most ranks of a group.
inline constexpr int kPeerMaxRanks = 8;
// Bytes of a peer buffer's CUDA IPC handle.
inline constexpr size_t kPeerHandleBytes = 64;

// Bytes of each rank's peer buffer for a group of `world` ranks whose largest message (x's
// bytes) is `capacity`: two message slots per rank and two for the two-shot kernel's gather
// (calls alternate between the two of each) and a 16 KiB header (the calls' counts).
size_t peer_buffer_bytes(int world, size_t capacity);

// A peer buffer of `bytes` on the current CUDA device (its own cudaMalloc: the unit CUDA IPC
// shares), its header zeroed and its message slots marked empty; the call returns after both
// complete.
void* allocate_peer_buffer(size_t bytes);
void free_peer_buffer(void* buffer);

// The CUDA IPC handle of a buffer allocate_peer_buffer returned, for the other ranks.
std::array<uint8_t, kPeerHandleBytes> peer_buffer_handle(void* buffer);
// This process's mapping of another process's peer buffer, from its handle (`bytes` =
// kPeerHandleBytes), on the current device (peer access enabled); close_peer_buffer unmaps it.
void* open_peer_buffer(const uint8_t* handle, size_t bytes);
void close_peer_buffer(void* mapped);

struct PeerGroup {
  int rank = 0;                             // this process's rank in the group
  int world = 0;                            // ranks in the group, 1..kPeerMaxRanks
  size_t capacity = 0;                      // the capacity the buffers were sized for
  void* buffers[kPeerMaxRanks] = {};        // rank r's buffer as mapped here ([rank]: its own;
                                            // none for a group of one)
};

// Whether x fits the one-kernel form on `group`: a CUDA tensor of f32, f16 or bf16, its rows
// contiguous (row stride d), 16-byte aligned with d a multiple of 16 bytes, and at most
// group.capacity bytes. (A caller with larger messages runs its collective library's
// all-reduce and add_rmsnorm_ instead.)
bool all_reduce_add_rmsnorm_fits(const PeerGroup& group, const TensorView& x);

// residual += sum over the group's ranks of x; x = rmsnorm(residual, weight, eps, offset), in
// place. x: [..., d] as all_reduce_add_rmsnorm_fits requires; residual: x's shape, dtype and
// device (rows may be strided by whole 16-byte vectors); weight: [d] of x's dtype or f32.
// Every argument (and the group) is checked before anything is written. A group of one rank
// (no buffers needed) runs add_rmsnorm_, on the CPU too.
void all_reduce_add_rmsnorm(const PeerGroup& group, const TensorView& x, const TensorView& residual,
                            const TensorView& weight, double eps, double offset = 0.0,
                            cudaStream_t stream = nullptr);

}  // namespace llmk
