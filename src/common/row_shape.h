// The launch shape of a row kernel that holds a row in registers: thread t of a block
// holds VPT 16-byte vectors of the row. Shared by every row-wise op (normalization,
// softmax) so that each picks its block size by the same rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/occupancy.h"

namespace llmk::detail {

// The largest grid a row-wise kernel launches; longer inputs are grid-strided.
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// Vectors per thread and threads per block of a row kernel.
struct RowShape {
  int vpt;
  int threads;
};

inline int round_up_warp(int64_t threads) {
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

// Under two rows per SM a row kernel's rows are few (decode, sampling): its launch is chosen
// for latency, not for resident threads (pick_row_shape here; the norm streaming kernel
// serves only the many-rows side, and the sm_90 softmax cluster kernel has a rule per side).
inline bool few_rows(int64_t rows, int sm_count) { return rows < 2 * int64_t{sm_count}; }

// The block of a row of n 16-byte vectors at VPT vectors per thread: n / VPT threads rounded
// up to a warp, if within 128..512 (fewer than 128 only for VPT = 1); 0 otherwise.
inline int row_block_threads(int64_t n, int vpt) {
  const int threads = round_up_warp((n + vpt - 1) / vpt);
  return threads > 512 || (threads < 128 && vpt > 1) ? 0 : threads;
}

// The shape with the most threads for rows of n 16-byte vectors: the smallest compiled VPT
// in {1, 2, 4, 8, 16} with a row_block_threads block, the shortest serial work per thread.
// vpt = 0: the row does not fit.
template <class KernelFor>
RowShape widest_row_shape(int64_t n, KernelFor&& kernel_for) {
  for (int vpt : {1, 2, 4, 8, 16}) {
    const int threads = row_block_threads(n, vpt);
    if (threads != 0 && kernel_for(vpt) != nullptr) return {vpt, threads};
  }
  return {0, 0};
}

// The shape for rows of n 16-byte vectors: VPT in {1, 2, 4, 8, 16} with
// 128 <= n / VPT <= 512 threads (fewer only for VPT = 1). Few rows (under two per SM):
// the most threads per row, for latency. Otherwise the most resident threads per SM
// (ties: more, smaller blocks), which keeps the most loads in flight, among the kernels
// that do not spill (a spilling kernel only when nothing else holds the row).
// `kernel_for(vpt)` gives the compiled kernel of each VPT, nullptr for a VPT the op does
// not compile. vpt = 0: the row does not fit.
template <class KernelFor>
RowShape pick_row_shape(int64_t rows, int64_t n, KernelFor&& kernel_for) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  if (few_rows(rows, sm_count_of(device))) return widest_row_shape(n, kernel_for);
  RowShape best{0, 0};
  int64_t best_score = -1;
  for (int vpt : {1, 2, 4, 8, 16}) {
    const int threads = row_block_threads(n, vpt);
    const void* kernel = kernel_for(vpt);
    if (kernel == nullptr || threads == 0) continue;
    const KernelFit fit = kernel_fit(kernel, threads, device);
    // Non-spilling kernels rank above every spilling one.
    const int64_t score = int64_t{fit.blocks_per_sm} * threads + (fit.spills ? 0 : (int64_t{1} << 32));
    if (score >= best_score) {
      best = {vpt, threads};
      best_score = score;
    }
  }
  return best;
}

// Calls f(std::integral_constant<int, VPT>) for a run-time vpt in {1, 2, 4, 8, 16};
// false (f not called) for any other value.
template <class F>
bool dispatch_vpt(int vpt, F&& f) {
  switch (vpt) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
  }
  return false;
}

}  // namespace llmk::detail
