// Launcher of the Hopper GEMM (kernel in gemm_sm90_kernel.cuh): builds the TMA maps,
// sizes the persistent grid, picks the instantiation and the split along K, and runs a
// one-tile-row call's last partial wave of tiles as a call of its own (split in clusters).
//
// Instantiations (the only list): {bf16, fp16} x {A K-major, B K-major} (forward),
// {A K-major, B N-major} (input gradient), {A M-major, B N-major} (weight gradient); the
// output has the inputs' dtype. Everything else takes the mma.sync kernel. A split-K call's
// reduction: gemm_split_reduce_kernel for {bf16, fp16} x {none, gelu, gelu_tanh}.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/scratch.h"
#include "common/sm90/kernel_support.h"
#include "common/sm90/tma.h"
#include "gemm/gemm.h"
#include "gemm/gemm_sm90_kernel.cuh"
#include "gemm/gemm_split_reduce.cuh"

namespace llmk::detail {

namespace {

using sm90::GemmSm90Args;
using sm90::GemmSm90Config;

template <class T, bool kAKMajor, bool kBKMajor>
const void* kernel_for() {
  return reinterpret_cast<const void*>(sm90::gemm_sm90_kernel<T, kAKMajor, kBKMajor>);
}

// Calls f(kernel pointer) for the instantiation of (dtype, layouts); nullptr if none.
template <class F>
auto with_kernel(DType dtype, bool a_k_major, bool b_k_major, F&& f) {
  auto pick = [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    if (a_k_major && b_k_major) return f(kernel_for<T, true, true>());
    if (a_k_major && !b_k_major) return f(kernel_for<T, true, false>());
    if (!a_k_major && !b_k_major) return f(kernel_for<T, false, false>());
    return f(static_cast<const void*>(nullptr));
  };
  if (dtype == DType::bf16) return pick(DTypeTag<DType::bf16>{});
  return pick(DTypeTag<DType::f16>{});
}

// Clusters of `cluster` blocks of the kernel's shape that run at once on the device
// (occupancy.h's query, cached per kernel, device and cluster size); 0 when none fits.
int resident_clusters(const void* kernel, int cluster, int device) {
  return detail::resident_clusters(kernel, GemmSm90Config::kThreads, GemmSm90Config::kSharedBytes, cluster, device);
}

// Split-K pieces for a call of `tiles` cluster tiles when `clusters` run at once: as many as
// fill one wave (clusters / tiles), while the partial sums' traffic (write and read, 8 bytes
// per output element and piece) stays within half the weight's bytes (k / (8 m) pieces) and
// each piece keeps >= 4 k steps; 1 (no split) when that is under 2, and for silu_mul (its
// gate and up columns meet in one tile's epilogue).
int64_t split_k_pieces(const GemmParams& p, int64_t tiles, int64_t clusters, int64_t k_steps) {
  if (p.activation == GemmActivation::silu_mul) return 1;
  int64_t pieces = clusters / tiles;
  pieces = std::min<int64_t>(pieces, p.k / (8 * p.m));
  pieces = std::min<int64_t>(pieces, k_steps / 4);
  pieces = std::min<int64_t>(pieces, 16);
  return pieces >= 2 ? pieces : 1;
}

// A call of one tile row split with its pieces reduced inside clusters: the piece count (2-8,
// each piece a block of the tile's cluster: as many as fill the resident blocks once, each
// piece >= 4 k steps, every piece non-empty, every tile's cluster resident at once), 1 when
// no count qualifies (or for silu_mul). No partial sums leave the chip, so the count is not
// held to split_k_pieces' traffic cap.
int k_cluster_pieces(const void* kernel, const GemmParams& p, int64_t tiles, int64_t blocks, int64_t k_steps,
                     int device) {
  if (p.activation == GemmActivation::silu_mul) return 1;
  const int64_t most = std::min<int64_t>({blocks / tiles, k_steps / 4, GemmSm90Config::kMaxKCluster});
  for (int64_t pieces = most; pieces >= 2; --pieces) {
    const int64_t steps = (k_steps + pieces - 1) / pieces;
    if ((k_steps + steps - 1) / steps != pieces) continue;
    if (tiles <= resident_clusters(kernel, static_cast<int>(pieces), device)) return static_cast<int>(pieces);
  }
  return 1;
}

// The reduction and epilogue of a split call (gemm_split_reduce.cuh).
template <class T>
void launch_split_reduce(const GemmParams& p, const float* partial, int64_t splits, int64_t ld_partial, int device,
                         cudaStream_t stream) {
  const int64_t items = p.m * (ld_partial / 4);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, int64_t{8} * sm_count_of(device)));
  switch (p.activation) {
    case GemmActivation::gelu:
      return gemm_split_reduce_kernel<T, GemmActivation::gelu><<<grid, 256, 0, stream>>>(p, partial, splits, ld_partial);
    case GemmActivation::gelu_tanh:
      return gemm_split_reduce_kernel<T, GemmActivation::gelu_tanh>
          <<<grid, 256, 0, stream>>>(p, partial, splits, ld_partial);
    default:
      return gemm_split_reduce_kernel<T, GemmActivation::none><<<grid, 256, 0, stream>>>(p, partial, splits, ld_partial);
  }
}

bool aligned16(const void* p, int64_t stride_elements) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride_elements * 2) % 16 == 0;
}

}  // namespace

bool gemm_sm90_takes(const GemmParams& p, int device) {
  if (p.m < 1 || p.k == 0 || p.out_dtype != p.in_dtype) return false;
  // The contiguous dims of A and B whole 16-byte units (see the TMA store note below).
  if ((p.a_k_major ? p.k : p.m) % 8 != 0 || (p.b_k_major ? p.k : p.n) % 8 != 0) return false;
  if (p.a_k_major != true && p.b_k_major != false) return false;  // A M-major with B K-major: not built
  if (p.activation == GemmActivation::silu_mul && !p.b_k_major) return false;
  if (!aligned16(p.a, p.lda) || !aligned16(p.b, p.ldb)) return false;
  if (p.m >= (int64_t{1} << 31) || p.n >= (int64_t{1} << 31) || p.k >= (int64_t{1} << 31)) return false;
  return sm90::sm90a_kernel_runs(kernel_for<__nv_bfloat16, true, true>(), device);
}

namespace {

// One call's launch (its TMA maps, grid and split) on `kernel`, the instantiation of p's
// dtype and layouts.
void launch_gemm_sm90(const void* kernel, const GemmParams& p, int device, cudaStream_t stream) {
  using C = GemmSm90Config;
  constexpr const char* kOp = "gemm";
  const bool silu = p.activation == GemmActivation::silu_mul;
  GemmSm90Args args{};
  args.p = p;
  args.n_tile = silu ? C::kBlockN / 2 : C::kBlockN;
  args.k_steps = (p.k + C::kBlockK - 1) / C::kBlockK;
  // The raster walks cluster tiles: `cluster` vertically adjacent 128 x n_tile tiles, 2
  // (sharing B by multicast) unless there is one tile row.
  const int64_t tiles_m = (p.m + C::kBlockM - 1) / C::kBlockM;
  args.cluster = tiles_m == 1 ? 1 : C::kMaxCluster;
  args.raster = {(tiles_m + args.cluster - 1) / args.cluster, (p.n_out() + args.n_tile - 1) / args.n_tile,
                 C::kRasterGroup};

  // A: K-major [m, k] in boxes of 128 rows x 64 k; M-major: [k, m] in boxes of 64 k x 64 m.
  const sm90::Tma2dShape a_shape =
      p.a_k_major ? sm90::Tma2dShape{p.a, p.in_dtype, uint64_t(p.m), uint64_t(p.k), uint64_t(p.lda), C::kBlockM, 64}
                  : sm90::Tma2dShape{p.a, p.in_dtype, uint64_t(p.k), uint64_t(p.m), uint64_t(p.lda), 64, 64};
  // B (each block loads half a tile): K-major [n, k] in boxes of 128 rows x 64 k; N-major
  // [k, n] in boxes of 64 k x 64 n.
  const sm90::Tma2dShape b_shape =
      p.b_k_major ? sm90::Tma2dShape{p.b, p.in_dtype, uint64_t(p.n), uint64_t(p.k), uint64_t(p.ldb), 128, 64}
                  : sm90::Tma2dShape{p.b, p.in_dtype, uint64_t(p.k), uint64_t(p.n), uint64_t(p.ldb), 64, 64};
  const CUtensorMap map_a = sm90::make_tma_2d(kOp, a_shape);
  const CUtensorMap map_b = sm90::make_tma_2d(kOp, b_shape);
  // out [m, n_out] in boxes of 64 x 64 when TMA can address its rows and they are whole
  // 16-byte units (a TMA store writes the 16-byte unit that holds the last column whole,
  // measured); else the kernel stores from registers (and map_out is not read).
  args.tma_store = aligned16(p.out, p.ld_out) && p.n_out() % 8 == 0;
  const CUtensorMap map_out =
      args.tma_store ? sm90::make_tma_2d(kOp, {p.out, p.out_dtype, uint64_t(p.m), uint64_t(p.n_out()),
                                               uint64_t(p.ld_out), 64, 64})
                     : map_a;
  // The residual (out's shape) read by TMA into the output box before the store, when its
  // rows qualify as out's do.
  args.tma_residual = args.tma_store && p.residual != nullptr && aligned16(p.residual, p.ld_residual);
  const CUtensorMap map_residual =
      args.tma_residual ? sm90::make_tma_2d(kOp, {p.residual, p.out_dtype, uint64_t(p.m), uint64_t(p.n_out()),
                                                  uint64_t(p.ld_residual), 64, 64})
                        : map_a;

  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(args.cluster);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSharedBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  // As many clusters as fit at once (GPC boundaries can leave an SM out), at most one
  // per cluster tile.
  const int clusters = resident_clusters(kernel, args.cluster, device);
  LLMK_CHECK(clusters > 0, "gemm: no cluster of ", args.cluster, " blocks of the Hopper kernel fits on this device");
  const int64_t tiles = args.raster.tiles();
  // One tile row: its split reduced inside clusters of the tile's pieces where they fit,
  // else (and for two tile rows and more) through partial sums in scratch memory.
  args.k_cluster = args.cluster == 1 ? k_cluster_pieces(kernel, p, tiles, clusters, args.k_steps, device) : 1;
  if (args.k_cluster > 1) {
    args.splits = args.k_cluster;
  } else {
    args.splits = split_k_pieces(p, tiles, clusters, args.k_steps);
    if (args.splits > 1 && !scratch_available(device)) args.splits = 1;  // its partials need the pool
  }
  args.split_steps = (args.k_steps + args.splits - 1) / args.splits;
  args.splits = (args.k_steps + args.split_steps - 1) / args.split_steps;  // every piece non-empty
  args.ld_partial = (p.n + 3) / 4 * 4;
  const bool partials = args.splits > 1 && args.k_cluster == 1;
  args.partial = partials ? static_cast<float*>(scratch_alloc(sizeof(float) * args.splits * p.m * args.ld_partial,
                                                             device, stream))
                          : nullptr;
  const int64_t units = args.units();
  if (args.k_cluster > 1) {  // a cluster per tile, a block per piece, all resident
    cluster.val.clusterDim.x = static_cast<unsigned>(args.k_cluster);
    config.gridDim = dim3(static_cast<unsigned>(units));
  } else {
    config.gridDim = dim3(static_cast<unsigned>(args.cluster * (units < clusters ? units : clusters)));
  }
  void* params[] = {const_cast<CUtensorMap*>(&map_a), const_cast<CUtensorMap*>(&map_b),
                    const_cast<CUtensorMap*>(&map_out), const_cast<CUtensorMap*>(&map_residual), &args};
  LLMK_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, params));
  if (partials) {
    if (p.in_dtype == DType::bf16)
      launch_split_reduce<__nv_bfloat16>(p, args.partial, args.splits, args.ld_partial, device, stream);
    else
      launch_split_reduce<__half>(p, args.partial, args.splits, args.ld_partial, device, stream);
    scratch_free(args.partial, stream);
  }
}

// Columns [n0, n1) of p's output: the same call on those rows of B (columns when it is
// N-major), bias, residual and out.
GemmParams gemm_columns(const GemmParams& p, int64_t n0, int64_t n1) {
  GemmParams q = p;
  const int64_t size = dtype_size(p.in_dtype), out_size = dtype_size(p.out_dtype);
  q.b = static_cast<const char*>(p.b) + (p.b_k_major ? n0 * p.ldb : n0) * size;
  q.out = static_cast<char*>(p.out) + n0 * out_size;
  if (p.bias) q.bias = static_cast<const char*>(p.bias) + n0 * out_size;
  if (p.residual) q.residual = static_cast<const char*>(p.residual) + n0 * out_size;
  q.n = n1 - n0;
  return q;
}

// A one-tile-row call whose tiles fill the resident blocks some whole waves and leave a tail
// of at most half a wave: the output columns where the whole waves end (the tail then runs
// as its own call, split along K in clusters, instead of a few tiles on an idle GPU); 0 when
// that does not apply (several tile rows, silu_mul, no tail, a larger tail, too few k steps).
int64_t tail_columns_from(const void* kernel, const GemmParams& p, int device) {
  using C = GemmSm90Config;
  if (p.m > C::kBlockM || p.activation == GemmActivation::silu_mul || p.k < 8 * C::kBlockK) return 0;
  const int64_t tiles = (p.n + C::kBlockN - 1) / C::kBlockN, blocks = resident_clusters(kernel, 1, device);
  if (blocks < 1 || tiles < blocks) return 0;
  const int64_t tail = tiles % blocks;
  if (tail == 0 || 2 * tail > blocks) return 0;
  return (tiles - tail) * C::kBlockN;
}

}  // namespace

void gemm_sm90_cuda(const GemmParams& p, cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  with_kernel(p.in_dtype, p.a_k_major, p.b_k_major, [&](const void* kernel) {
    LLMK_CHECK(kernel != nullptr, "gemm: no Hopper kernel for this operand layout");
    LLMK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, GemmSm90Config::kSharedBytes));
    const int64_t tail_from = tail_columns_from(kernel, p, device);
    if (tail_from > 0) {
      launch_gemm_sm90(kernel, gemm_columns(p, 0, tail_from), device, stream);
      launch_gemm_sm90(kernel, gemm_columns(p, tail_from, p.n), device, stream);
    } else {
      launch_gemm_sm90(kernel, p, device, stream);
    }
    return 0;
  });
  LLMK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llmk::detail
