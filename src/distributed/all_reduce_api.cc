// all_reduce_add_rmsnorm's entry points: peer buffers (allocation, CUDA IPC handles and
// mappings) and the fused call, which validates the group and every tensor (a rejected call
// writes nothing) before its launch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cuda_check.h"
#include "common/env_path.h"
#include "common/rows.h"
#include "distributed/all_reduce_params.h"
#include "llmk/all_reduce.h"
#include "llmk/norm.h"
#include "norm/norm_checks.h"

namespace llmk {

namespace {

constexpr const char* kOp = "all_reduce_add_rmsnorm";
// Groups of 3 or more ranks take the two-shot kernel from messages of 128 KiB or rows of 16
// KiB: it sends 2 (w - 1) / w x the message instead of (w - 1) x and a row's block receives 1 /
// w of the row from each rank before the gather instead of the whole row, for a second NVLink
// latency (H200, 4 ranks: two-shot faster from 128 KiB at hidden 4096, at every size at 8192;
// one-shot faster at 2 ranks everywhere; docs/kernels/distributed.md).
constexpr int64_t kTwoShotMinBytes = 128 << 10;
constexpr int64_t kTwoShotMinRowBytes = 16 << 10;

// How long a kernel's thread waits for a peer before it traps (a rank that skipped a call):
// LLMK_ALL_REDUCE_TIMEOUT_S seconds, 600 (NCCL's default watchdog) without it; in the
// kernel's ticks of 2^20 ns, at least one.
uint32_t timeout_ticks() {
  const char* env = std::getenv("LLMK_ALL_REDUCE_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return static_cast<uint32_t>(600e9 / (1 << 20));
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  LLMK_CHECK(end != env && *end == '\0' && std::isfinite(seconds) && seconds > 0 && seconds <= 4e6, kOp,
             ": LLMK_ALL_REDUCE_TIMEOUT_S=", env, " is not a number of seconds in (0, 4e6]");
  return static_cast<uint32_t>(std::max(1.0, seconds * 1e9 / (1 << 20)));
}

// The kernel of a call: the rule above, or LLMK_ALL_REDUCE_KERNEL (auto | one_shot | two_shot).
detail::AllReduceKernel pick_kernel(int world, int64_t bytes, int64_t row_bytes) {
  switch (detail::env_path(kOp, "LLMK_ALL_REDUCE_KERNEL", {"auto", "one_shot", "two_shot"})) {
    case 1: return detail::AllReduceKernel::one_shot;
    case 2: return detail::AllReduceKernel::two_shot;
    default:
      return world >= 3 && (bytes >= kTwoShotMinBytes || row_bytes >= kTwoShotMinRowBytes)
                 ? detail::AllReduceKernel::two_shot
                 : detail::AllReduceKernel::one_shot;
  }
}

void check_world(const char* op, int world) {
  LLMK_CHECK(world >= 1 && world <= kPeerMaxRanks, op, ": world must be 1..", kPeerMaxRanks, " ranks, got ",
             world);
}

void check_capacity(const char* op, size_t capacity) {
  LLMK_CHECK(capacity > 0 && capacity % 16 == 0, op, ": capacity must be a positive multiple of 16 bytes, got ",
             static_cast<int64_t>(capacity));
}

void check_group(const PeerGroup& g) {
  check_world(kOp, g.world);
  LLMK_CHECK(g.rank >= 0 && g.rank < g.world, kOp, ": group rank ", g.rank, " is not in 0..", g.world - 1);
  check_capacity(kOp, g.capacity);
  if (g.world == 1) return;  // add_rmsnorm_, no buffers
  for (int r = 0; r < g.world; ++r)
    LLMK_CHECK(g.buffers[r] != nullptr && detail::is_aligned(g.buffers[r], 256), kOp, ": the group's buffer of rank ",
               r, " is ", g.buffers[r] == nullptr ? "missing" : "not a peer buffer (misaligned)",
               " (allocate_peer_buffer, or open_peer_buffer for another rank's)");
}

// x's rows as the kernel takes them, or the reason it cannot (empty when it can).
std::string unfit_reason(const PeerGroup& g, const TensorView& x, const detail::Rows& rows) {
  const int64_t elem = dtype_size(x.dtype());
  if (rows.rows > 1 && rows.row_stride != rows.d)
    return detail::concat("x's rows must be contiguous (row stride ", rows.row_stride, ", d ", rows.d, ")");
  if (!detail::rows_vectorizable({rows}, x.dtype()))
    return detail::concat("x must start 16-byte aligned and its rows hold whole 16-byte vectors (d = ", rows.d,
                          " of ", dtype_name(x.dtype()), ")");
  const int64_t bytes = rows.rows * rows.d * elem;
  if (bytes > static_cast<int64_t>(g.capacity))
    return detail::concat("x holds ", bytes, " bytes, more than the group's capacity of ",
                          static_cast<int64_t>(g.capacity),
                          " (a larger message takes the collective library's all-reduce and add_rmsnorm_)");
  return {};
}

}  // namespace

size_t peer_buffer_bytes(int world, size_t capacity) {
  check_world("peer_buffer_bytes", world);
  check_capacity("peer_buffer_bytes", capacity);
  return detail::kPeerDataOffset + 2 * (static_cast<size_t>(world) + 1) * capacity;
}

void* allocate_peer_buffer(size_t bytes) {
  LLMK_CHECK(bytes >= detail::kPeerDataOffset, "allocate_peer_buffer: ", static_cast<int64_t>(bytes),
             " bytes is smaller than a peer buffer's header (", static_cast<int64_t>(detail::kPeerDataOffset),
             "); size it with peer_buffer_bytes");
  void* p = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&p, bytes));
  cudaError_t done = cudaMemset(p, 0, detail::kPeerDataOffset);
  if (done == cudaSuccess) {
    try {
      detail::fill_peer_slots_cuda(p, bytes);
    } catch (const Error&) {
      cudaFree(p);
      throw;
    }
    done = cudaDeviceSynchronize();
  }
  if (done != cudaSuccess) {
    cudaFree(p);
    LLMK_CUDA_CHECK(done);
  }
  return p;
}

void free_peer_buffer(void* buffer) {
  if (buffer != nullptr) LLMK_CUDA_CHECK(cudaFree(buffer));
}

std::array<uint8_t, kPeerHandleBytes> peer_buffer_handle(void* buffer) {
  LLMK_CHECK(buffer != nullptr, "peer_buffer_handle: the buffer is null");
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == kPeerHandleBytes, "CUDA IPC handle size");
  LLMK_CUDA_CHECK(cudaIpcGetMemHandle(&handle, buffer));
  std::array<uint8_t, kPeerHandleBytes> out;
  std::memcpy(out.data(), &handle, kPeerHandleBytes);
  return out;
}

void* open_peer_buffer(const uint8_t* handle, size_t bytes) {
  LLMK_CHECK(handle != nullptr && bytes == kPeerHandleBytes, "open_peer_buffer: a handle is ",
             static_cast<int64_t>(kPeerHandleBytes), " bytes, got ", static_cast<int64_t>(bytes));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, kPeerHandleBytes);
  void* p = nullptr;
  LLMK_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

void close_peer_buffer(void* mapped) {
  if (mapped != nullptr) LLMK_CUDA_CHECK(cudaIpcCloseMemHandle(mapped));
}

bool all_reduce_add_rmsnorm_fits(const PeerGroup& group, const TensorView& x) {
  if (!x.is_cuda() || (x.dtype() != DType::f32 && x.dtype() != DType::f16 && x.dtype() != DType::bf16)) return false;
  if (group.world < 1 || group.world > kPeerMaxRanks || group.capacity == 0 || group.capacity % 16 != 0) return false;
  try {
    const detail::Rows rows = detail::as_rows(kOp, "x", x);
    return rows.d >= 1 && unfit_reason(group, x, rows).empty();
  } catch (const Error&) {  // not rows at all
    return false;
  }
}

void all_reduce_add_rmsnorm(const PeerGroup& group, const TensorView& x, const TensorView& residual,
                            const TensorView& weight, double eps, double offset, cudaStream_t stream) {
  check_group(group);
  detail::check_float_dtype(kOp, "x", x);
  const detail::Rows rows = detail::as_rows(kOp, "x", x);
  LLMK_CHECK(rows.d >= 1, kOp, ": x has an empty last dim (shape ", detail::shape_string(x), ")");
  if (group.world == 1) return add_rmsnorm_(x, residual, weight, eps, offset, stream);  // nothing to reduce
  LLMK_CHECK(x.is_cuda(), kOp, ": x is on the CPU; the fused all-reduce of ", group.world,
             " ranks runs on CUDA peer buffers (on the CPU: a collective library's all-reduce, then add_rmsnorm_)");
  const std::string unfit = unfit_reason(group, x, rows);
  LLMK_CHECK(unfit.empty(), kOp, ": ", unfit);
  const detail::Rows res = detail::check_like(kOp, "residual", residual, "x", x);
  LLMK_CHECK(detail::rows_vectorizable({res}, x.dtype()), kOp,
             ": residual must start 16-byte aligned with a row stride of whole 16-byte vectors");
  detail::check_column_param(kOp, "weight", weight, x, rows.d);
  LLMK_CHECK(detail::is_aligned(weight.data(), 16), kOp, ": weight must start 16-byte aligned");
  detail::check_eps(kOp, eps);
  detail::check_offset(kOp, offset);
  detail::check_no_overlap(kOp, "x", x, "residual", residual, false);
  detail::check_no_overlap(kOp, "x", x, "weight", weight, false);
  detail::check_no_overlap(kOp, "residual", residual, "weight", weight, false);
  if (rows.rows == 0) return;

  detail::AllReduceNormParams p;
  p.x = rows.data;
  p.residual = res.data;
  p.weight = weight.data();
  p.rows = rows.rows;
  p.d = rows.d;
  p.residual_stride = res.row_stride;
  p.eps = static_cast<float>(eps);
  p.offset = static_cast<float>(offset);
  p.rank = group.rank;
  p.world = group.world;
  p.capacity = static_cast<int64_t>(group.capacity);
  for (int r = 0; r < group.world; ++r) p.buffers[r] = static_cast<uint8_t*>(group.buffers[r]);
  p.timeout_ticks = timeout_ticks();
  const int64_t row_bytes = rows.d * dtype_size(x.dtype());
  const detail::AllReduceKernel kernel = pick_kernel(group.world, rows.rows * row_bytes, row_bytes);
  detail::DeviceGuard guard(kOp, "x", x);
  detail::all_reduce_add_rmsnorm_cuda(p, kernel, x.dtype(), weight.dtype(), stream);
}

}  // namespace llmk
