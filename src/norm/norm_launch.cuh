// Host-side launch of the normalization forward kernels (RMSNorm, RMSNorm with residual
// add or a SiLU gate, LayerNorm): the warp kernel, the register kernel (lean or with the
// weight prefetched, its shape from the row length and the compiled kernels' occupancy), the
// streaming kernel, or the scalar loop kernel for unaligned rows.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/device_types.cuh"
#include "common/env_path.h"
#include "common/pdl_launch.h"
#include "common/row_shape.h"
#include "norm/norm_kernel.cuh"

namespace llmk::detail {

// LLMK_NORM_PATH, a test and benchmark switch read on every forward call (and by the
// backward): which kernel takes 16-byte aligned rows. auto (or unset) follows the launch
// rule below; warp: the warp kernel (LayerNorm) for rows of 33-128 vectors; lean: the lean
// register kernel (LayerNorm and the gated form) for rows of more than 32 vectors; vec: the
// register kernel with the weight prefetched, shaped as before the warp and lean kernels
// (the rule for few rows, rows of at most 32 vectors, and RMSNorm and add_rmsnorm under 512
// vectors); stream: the streaming kernel (RMSNorm and add_rmsnorm). Each at any row count;
// a call that the named kernel cannot take, or an op without it, follows auto. Another value
// is an error naming the op.
enum class NormPath { automatic, warp, lean, vec, stream };

inline NormPath norm_path(const char* op) {
  return static_cast<NormPath>(env_path(op, "LLMK_NORM_PATH", {"auto", "warp", "lean", "vec", "stream"}));
}

// The register kernel's VPTs built for element type T: every one in {1, 2, 4, 8, 16} except
// 16 for the 16-bit types. Their rows of 128-512 threads at VPT 8 reach 4096 vectors
// (32768 columns), past every model's hidden size; VPT 16 (128 columns a thread, over a
// third of the family's compile) served only longer rows, which the loop kernel takes.
template <class T>
constexpr bool norm_vpt_built(int vpt) {
  return vpt != 16 || sizeof(T) > 2;
}

// dispatch_vpt over the VPTs built for T: false (f not called) for any other.
template <class T, class F>
bool dispatch_norm_vpt(int vpt, F&& f) {
  return norm_vpt_built<T>(vpt) && dispatch_vpt(vpt, [&](auto v) {
           if constexpr (norm_vpt_built<T>(decltype(v)::value)) f(v);
         });
}

template <bool kAdd, bool kCentered, bool kGate, bool kLean, bool kAffine, class T, class W>
const void* norm_vec_kernel_for(int vpt) {
  const void* kernel = nullptr;
  dispatch_norm_vpt<T>(vpt, [&](auto v) {
    kernel = reinterpret_cast<const void*>(
        norm_vec_kernel<T, W, kVec16<T>, decltype(v)::value, kAdd, kCentered, kGate, kLean, kAffine>);
  });
  return kernel;
}

// The register kernel's shape (common/row_shape.h) for rows of n 16-byte vectors.
template <bool kAdd, bool kCentered, bool kGate, bool kLean, bool kAffine, class T, class W>
RowShape norm_shape(int64_t rows, int64_t n) {
  return pick_row_shape(rows, n, [](int vpt) {
    return norm_vec_kernel_for<kAdd, kCentered, kGate, kLean, kAffine, T, W>(vpt);
  });
}

// RMSNorm (plain or with the residual add) over many rows of at least kStreamMinVectors
// 16-byte vectors takes the streaming kernel (norm_loop_kernel with vectors): holding no
// row it runs 2048 threads per SM at 32 registers and re-reads the row from L2, where the
// register kernel's 40-62 registers leave a quarter to half of the SM's threads (and their
// loads) out; it pays from 512 vectors (4096 bf16 columns), more the longer the row, and
// not below, where add_rmsnorm lost. LayerNorm (a third pass for the centered sum) and the
// gated form (a third input) lost this way and keep the register kernel, as do few rows
// (decode): one memory round trip.
inline constexpr int64_t kStreamMinVectors = 512;

// The ops that have the lean register kernel (and take the warp kernel by the rule):
// LayerNorm and the gated RMSNorm, whose prefetching register kernel holds a third vector
// per row vector (the weight and bias, or the weight and the gate). RMSNorm and add_rmsnorm
// over many long rows take the streaming kernel instead.
template <bool kAdd, bool kCentered, bool kGate>
constexpr bool norm_has_lean() {
  return !kAdd && (kCentered || kGate);
}

// The ops that have the warp kernel: LayerNorm, the one whose rule takes it. The streaming
// kernel: RMSNorm and add_rmsnorm, the ones whose rule takes it. LLMK_NORM_PATH naming a
// kernel the op does not have follows the rule (kernels no rule picks are not built).
template <bool kAdd, bool kCentered, bool kGate>
constexpr bool norm_has_warp() {
  return kCentered && !kGate;
}
template <bool kAdd, bool kCentered, bool kGate>
constexpr bool norm_has_stream() {
  return !kCentered && !kGate;
}

// Rows the warp kernel takes: 33..kWarpMaxVectors 16-byte vectors (up to 4 per lane).
// Shorter rows already share blocks (the short-row layout of the register kernel).
inline constexpr int64_t kWarpMinVectors = 33;
inline constexpr int64_t kWarpMaxVectors = 128;

inline int stream_threads(int64_t vectors) {
  return round_up_warp(std::min<int64_t>((vectors + 1) / 2, 1024));
}

// Which kernel takes an aligned call (the rule; LLMK_NORM_PATH may name another).
// LayerNorm and the gated form over many rows (at least two per SM): the warp kernel for
// 33-128 vectors (the register kernel gave such a row one vector per thread of a 128-thread
// block, two barriers per reduction, and 56-64 registers: 50% occupancy, where Triton's one
// warp per row at 32 registers ran faster on LayerNorm), the lean register kernel for
// longer rows (the prefetched weight, the prefetched gate and an fp32 copy of the row held
// across the reductions cost it 20-40 registers: the gated kernel at 4096 bf16 columns
// held 1024 threads per SM at 56 registers, the lean one 2048 at 32). RMSNorm and
// add_rmsnorm over many rows of >= 512 vectors: the streaming kernel. Everything else, and
// few rows (decode: one memory round trip matters more than occupancy), the register
// kernel with the weight (and gate) prefetched.
template <bool kAdd, bool kCentered, bool kGate>
NormPath norm_rule(NormPath asked, int64_t rows, int64_t vectors) {
  constexpr bool kLean = norm_has_lean<kAdd, kCentered, kGate>();
  constexpr bool kWarp = norm_has_warp<kAdd, kCentered, kGate>();
  const bool warp_takes = kWarp && vectors >= kWarpMinVectors && vectors <= kWarpMaxVectors;
  const bool lean_takes = kLean && vectors >= kWarpMinVectors;
  switch (asked) {
    case NormPath::warp: if (warp_takes) return asked; break;
    case NormPath::lean: if (lean_takes) return asked; break;
    case NormPath::stream: if (norm_has_stream<kAdd, kCentered, kGate>()) return asked; break;
    case NormPath::vec: return asked;
    case NormPath::automatic: break;
  }
  const bool rmsnorm_stream = !kCentered && !kGate && vectors >= kStreamMinVectors;
  if (!kLean && !rmsnorm_stream) return NormPath::vec;  // no query for the SM count
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  if (few_rows(rows, sm_count_of(device))) return NormPath::vec;
  if (rmsnorm_stream) return NormPath::stream;
  // The gated form takes the lean kernel at 33-128 vectors too (faster there than the warp
  // kernel), so only LayerNorm has the warp kernel.
  return warp_takes ? NormPath::warp : NormPath::lean;
}

// The grid of a staged lean kernel (norm_stage_bytes > 0): its resident blocks, at most
// `blocks`, each staging the weight once and walking many rows. Its shared memory may pass the
// default 48 KB (4 KB per 1024 columns of a bf16 gate and weight: 57 KB at 14336 columns),
// allowed once per device. No carveout preference: the driver sizes shared memory for the
// blocks the occupancy query counts (as fast as the maximum carveout asked for, which would
// leave less L1 to the kernels run after it).
template <class T, class W, int N, int VPT, bool kGate>
int staged_norm_grid(const char* op, const void* kernel, int threads, size_t smem, int blocks) {
  static std::atomic<uint64_t> allowed_on{0};  // a bit per device
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((allowed_on.load() & bit) == 0) {
    const size_t most = norm_stage_bytes<T, W, N, VPT, true, kGate>(512);
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    allowed_on.fetch_or(bit);
  }
  const int per_sm = kernel_fit(kernel, threads, device, smem).blocks_per_sm;
  LLMK_CHECK(per_sm > 0, op, ": the staged kernel does not fit an SM (", smem, " bytes of shared memory)");
  return static_cast<int>(std::min<int64_t>(blocks, int64_t{per_sm} * sm_count_of(device)));
}

// `act`: x's dtype; `affine`: the weight's (and bias's) dtype. `vector_ok`: every pointer
// and row stride is aligned to 16 bytes and d to the vector.
template <bool kAdd, bool kCentered, bool kGate = false>
void launch_norm(const char* op, const NormParams& p, DType act, DType affine, bool vector_ok,
                 cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min(p.rows, kMaxRowBlocks));
  const NormPath asked = norm_path(op);
  // LayerNorm with both weight and bias (nn.LayerNorm's call): the warp and lean kernels
  // compiled knowing both are there.
  const bool affine_both = p.weight != nullptr && p.bias != nullptr;
  dispatch_act_weight(act, affine, op, [&](auto act_tag, auto weight_tag) {
    using T = device_type_t<decltype(act_tag)>;
    using W = device_type_t<decltype(weight_tag)>;
    constexpr int N = kVec16<T>;
    const int64_t vectors = p.d / N;
    const NormPath path = vector_ok ? norm_rule<kAdd, kCentered, kGate>(asked, p.rows, vectors) : NormPath::vec;
    if constexpr (norm_has_stream<kAdd, kCentered, kGate>()) {
      if (path == NormPath::stream) {
        launch_pdl(norm_loop_kernel<T, W, N, kAdd, kCentered, kGate>, dim3(blocks), dim3(stream_threads(vectors)), 0,
                   stream, p);
        return;
      }
    }
    if constexpr (norm_has_warp<kAdd, kCentered, kGate>()) {
      if (path == NormPath::warp) {
        const dim3 grid(static_cast<unsigned>(std::min((p.rows + kNormWarpRows - 1) / kNormWarpRows, kMaxRowBlocks)));
        const dim3 block(kNormWarpRows * 32);
        auto launch = [&](auto vpl) {
          constexpr int kVpl = decltype(vpl)::value;
          if (kCentered && affine_both)
            launch_pdl(norm_warp_kernel<T, W, N, kVpl, kAdd, kCentered, kGate, kCentered>, grid, block, 0, stream, p);
          else
            launch_pdl(norm_warp_kernel<T, W, N, kVpl, kAdd, kCentered, kGate, false>, grid, block, 0, stream, p);
        };
        if (vectors <= 64) launch(std::integral_constant<int, 2>{});
        else if (vectors <= 96) launch(std::integral_constant<int, 3>{});
        else launch(std::integral_constant<int, 4>{});
        return;
      }
    }
    if constexpr (norm_has_lean<kAdd, kCentered, kGate>()) {
      if (path == NormPath::lean) {
        // Rows of more than 32 vectors, so VPT 1 has at least 33 threads: one row per block.
        // kAffine only for LayerNorm (the gated form's weight is always there, its bias never).
        auto launch_lean = [&](auto affine_tag) {
          constexpr bool kAffine = decltype(affine_tag)::value;
          // Rows of 256+ vectors with loads first (kNormLoadsFirst) take VPT 2 or more: VPT 1's
          // blocks of 256-512 threads, picked where they hold more threads per SM (a build at 31
          // registers), ran slower at 8192 x 4096 bf16.
          const bool skip_vpt1 = kNormLoadsFirst<T, W, true, kCentered> && vectors >= 256;
          const RowShape shape = pick_row_shape(p.rows, vectors, [&](int vpt) {
            return skip_vpt1 && vpt == 1 ? nullptr
                                         : norm_vec_kernel_for<kAdd, kCentered, kGate, true, kAffine, T, W>(vpt);
          });
          return dispatch_norm_vpt<T>(shape.vpt, [&](auto v) {
            constexpr int kVpt = decltype(v)::value;
            auto* kernel = norm_vec_kernel<T, W, N, kVpt, kAdd, kCentered, kGate, true, kAffine>;
            const size_t smem = norm_stage_bytes<T, W, N, kVpt, true, kGate>(shape.threads);
            const int grid = smem == 0 ? blocks
                                       : staged_norm_grid<T, W, N, kVpt, kGate>(
                                             op, reinterpret_cast<const void*>(kernel), shape.threads, smem, blocks);
            launch_pdl(kernel, dim3(grid), dim3(shape.threads), smem, stream, p);
          });
        };
        const bool launched =
            affine_both ? launch_lean(std::bool_constant<kCentered>{}) : launch_lean(std::false_type{});
        if (launched) return;
      }
    }
    const RowShape shape =
        vector_ok ? norm_shape<kAdd, kCentered, kGate, false, false, T, W>(p.rows, vectors) : RowShape{0, 0};
    // Rows of at most 32 vectors: 256-thread blocks of 256 / lanes rows.
    const bool short_rows = shape.vpt == 1 && vectors <= 32;
    dim3 block(shape.threads), grid(blocks);
    if (short_rows) {
      unsigned lanes = 1;
      while (lanes < vectors) lanes *= 2;
      block = dim3(lanes, 256 / lanes);
      grid = dim3(static_cast<unsigned>(std::min((p.rows + block.y - 1) / block.y, kMaxRowBlocks)));
    }
    const bool vector_launched = dispatch_norm_vpt<T>(shape.vpt, [&](auto v) {
      launch_pdl(norm_vec_kernel<T, W, N, decltype(v)::value, kAdd, kCentered, kGate>, grid, block, 0, stream, p);
    });
    if (!vector_launched)  // unaligned, or longer than the register kernel holds
      launch_pdl(norm_loop_kernel<T, W, 1, kAdd, kCentered, kGate>, dim3(blocks),
                 dim3(round_up_warp(std::min<int64_t>(p.d, 512))), 0, stream, p);
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
