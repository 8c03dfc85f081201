// Launcher of the small-M GEMM and of rmsnorm_linear (gemm_small_m_kernel.cuh): which
// calls the kernel takes, the compiled instantiations, and the launch shape.
//
// Launch shape. A CTA streams R = 32 * wr weight rows over a range of k tiles with wr * wk
// warps; gridDim = (C, ceil(rows / R), 64-token chunks), C = the cluster size along K
// (sm_90 builds on sm_90 devices; 1 otherwise). pick_small_m_config scores every (wr, wk,
// k tile, C) with a small model of a bandwidth-bound kernel and keeps the cheapest:
//   per wave: max(CTAs * bytes_per_CTA / HBM bandwidth,             the DRAM bound
//                 bytes_per_CTA * latency / (warps * 8 KB in flight), one CTA's Little's law
//                 CTAs on the busiest SM * bytes_per_CTA / SM rate)   the SM's L1/LSU rate
//   summed over waves, against (weight + x re-reads) / L2 bandwidth, plus the cluster
//   reduction (R * M * 4 bytes per CTA over distributed shared memory) and a per-k-tile
//   barrier cost. It favours one wave of equal CTAs (rows / R * C close to the resident CTA
//   count), large R (fewer x re-reads from L2), and the smallest split that fills the GPU.
//   The constants are first estimates for the H100 (to be refined by measurement).
// The chosen shape is cached per (device, dtype, token tiles, chunks, n, k, silu_mul).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/cuda_check.h"
#include "gemm/gemm.h"
#include "gemm/gemm_small_m_kernel.cuh"

namespace llmk::detail {
namespace {

// Cost-model constants (H100 SXM estimates; microseconds and bytes).
constexpr double kHbmBytesPerUs = 3.0e6;        // measured device-to-device copy rate
constexpr double kL2BytesPerUs = 6.0e6;         // L2 hit bandwidth (estimate)
constexpr double kLoadedLatencyUs = 1.5;        // DRAM latency under full load (estimate)
constexpr double kSmClockMhz = 1750;            // sustained SM clock
constexpr double kDsmemBytesPerUs = 5.0e4;      // distributed shared memory reads per SM (estimate)
constexpr double kClusterSyncUs = 0.3;          // the reduction's cluster barriers
constexpr double kTileBarrierUs = 0.03;         // one k tile: barrier + x stage bookkeeping

struct SmallMConfig {
  int wr = 1, wk = 1, bodies_per_tile = 1, cluster = 1, tiles = 1;
  int64_t row_blocks = 1;
  int64_t smem = 0;
};

// The compiled instantiations, in one place: input dtype (f16, bf16) x 8-token tiles
// (1, 2, 4, 8) x {gemm, rmsnorm_linear}. Everything else (out dtype, bias, residual,
// activation, the norm weight's dtype, the launch shape) is a run-time argument outside
// the k loop.
const void* small_m_kernel(DType in, int nt, bool norm) {
  auto pick = [&](auto tag, auto norm_tag) -> const void* {
    using T = device_type_t<decltype(tag)>;
    constexpr bool kNorm = decltype(norm_tag)::value;
    switch (nt) {
      case 1: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 1, kNorm>);
      case 2: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 2, kNorm>);
      case 4: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 4, kNorm>);
      case 8: return reinterpret_cast<const void*>(gemm_small_m_kernel<T, 8, kNorm>);
      default: return nullptr;
    }
  };
  auto by_norm = [&](auto tag) {
    return norm ? pick(tag, std::true_type{}) : pick(tag, std::false_type{});
  };
  if (in == DType::f16) return by_norm(DTypeTag<DType::f16>{});
  if (in == DType::bf16) return by_norm(DTypeTag<DType::bf16>{});
  return nullptr;
}

int token_tiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

struct DeviceFacts {
  int sm_count = 0, cc_major = 0;
  int smem_optin = 0;  // dynamic + static shared memory a block may use
};

DeviceFacts device_facts(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceFacts> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceFacts f;
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cache.emplace(device, f);
  return f;
}

struct KernelFacts {
  int max_threads = 0;  // the loaded machine code's launch bound
  int static_smem = 0;
  bool clusters = false;  // the kernel's machine code for this device has the cluster path
  int max_dynamic_smem = 0;
};

// Per (kernel, device): the static shared memory, whether the loaded machine code is sm_90
// (the cluster path is compiled in), and the opt-in to the largest dynamic shared memory.
KernelFacts kernel_facts(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, KernelFacts> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attributes{};
  LLMK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const DeviceFacts d = device_facts(device);
  KernelFacts f;
  f.max_threads = attributes.maxThreadsPerBlock;
  f.static_smem = static_cast<int>(attributes.sharedSizeBytes);
  f.clusters = attributes.binaryVersion >= 90 && d.cc_major >= 9;
  f.max_dynamic_smem = d.smem_optin - f.static_smem;
  LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, f.max_dynamic_smem));
  cache.emplace(key, f);
  return f;
}

// CTAs of (threads, smem, cluster) resident at once on the device (one wave).
int64_t resident_ctas(const void* kernel, int device, int threads, int64_t smem, int cluster) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int64_t, int>, int64_t> cache;
  const auto key = std::make_tuple(kernel, device, threads, smem, cluster);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int64_t slots = 0;
  if (cluster == 1) {
    int blocks = 0;
    LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, static_cast<size_t>(smem)));
    slots = int64_t{blocks} * device_facts(device).sm_count;
  } else {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
    config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (err != cudaSuccess) {
      cudaGetLastError();  // a shape the device cannot co-schedule: not a candidate
      clusters = 0;
    }
    slots = int64_t{clusters} * cluster;
  }
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, slots);
  return slots;
}

// Row blocks of R weight rows (silu_mul: R/2 gate rows + their R/2 up rows).
int64_t row_blocks(int64_t n, bool silu, int rows_cta) {
  return silu ? (n / 2 + rows_cta / 2 - 1) / (rows_cta / 2) : (n + rows_cta - 1) / rows_cta;
}

struct Problem {
  int64_t n, k, m_chunk, chunks;
  bool silu;
  int nt;
  bool norm;
};

double model_cost(const Problem& pr, const SmallMConfig& c, int64_t slots, int sm_count) {
  const int64_t rows_cta = int64_t{kSmallMWarpRows} * c.wr;
  const int64_t kt_cta = int64_t{small_m_body_k(pr.nt)} * c.bodies_per_tile * c.wk;
  const int64_t tiles_cta = (c.tiles + c.cluster - 1) / c.cluster;
  const double k_cta = static_cast<double>(std::min(tiles_cta * kt_cta, pr.k));
  const double rows_eff = static_cast<double>(std::min(rows_cta, pr.n));
  const double bytes_cta = rows_eff * k_cta * 2.0;
  const int64_t ctas = c.row_blocks * c.cluster * pr.chunks;
  // Weight bytes in flight: the ring's chunks x 32 rows x 64 bytes per warp.
  const double inflight = static_cast<double>(small_m_body_k(pr.nt)) / kSmallMChunk * 2048.0 * c.wr * c.wk;
  // The busiest SM's L1/LSU: 16 wavefronts per KB of weight + 2 NT for the x fragments.
  // (one 128-byte wavefront per clock).
  const double sm_rate = kSmClockMhz * 1024.0 / (16.0 + 2.0 * pr.nt);
  auto wave_time = [&](int64_t n_ctas) {
    const double dram = static_cast<double>(n_ctas) * bytes_cta / kHbmBytesPerUs;
    const double cta = bytes_cta * kLoadedLatencyUs / inflight;
    const double per_sm = static_cast<double>((n_ctas + sm_count - 1) / sm_count) * bytes_cta / sm_rate;
    return std::max(dram, std::max(cta, per_sm));
  };
  const int64_t full = ctas / slots, rest = ctas % slots;
  double t = static_cast<double>(full) * wave_time(slots) + (rest > 0 ? wave_time(rest) : 0.0);
  const double x_bytes = static_cast<double>(ctas) * static_cast<double>(pr.m_chunk) * k_cta * 2.0;
  const double weight_bytes = static_cast<double>(pr.n) * static_cast<double>(pr.k) * 2.0 * static_cast<double>(pr.chunks);
  t = std::max(t, (weight_bytes + x_bytes) / kL2BytesPerUs);
  t += static_cast<double>(tiles_cta) * kTileBarrierUs;
  if (c.cluster > 1)
    t += kClusterSyncUs + rows_eff * static_cast<double>(pr.m_chunk) * 4.0 * c.wk / kDsmemBytesPerUs;
  return t;
}

SmallMConfig pick_small_m_config(const void* kernel, int device, DType in, const Problem& pr) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, bool, int64_t, int64_t, int64_t, bool>, SmallMConfig> cache;
  const auto key = std::make_tuple(device, static_cast<int>(in), pr.nt, pr.norm, pr.chunks, pr.n, pr.k, pr.silu);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const DeviceFacts d = device_facts(device);
  const KernelFacts kf = kernel_facts(kernel, device);
  const int max_warps = std::min(kf.max_threads / 32, 16);
  const int elem = 2;
  SmallMConfig best;
  double best_cost = 0;
  bool found = false;
  for (int wk : {1, 2, 4}) {
    for (int bpt : {1, 2}) {
      if (wk > 1 && bpt > 1) continue;
      const int64_t kt_cta = int64_t{small_m_body_k(pr.nt)} * bpt * wk;
      const int64_t tiles = (pr.k + kt_cta - 1) / kt_cta;
      for (int wr = max_warps / wk; wr >= 1; --wr) {
        const int rows_cta = kSmallMWarpRows * wr;
        const int64_t blocks = row_blocks(pr.n, pr.silu, rows_cta);
        if (blocks > 65535) continue;
        // No warps whose rows all lie past n (a smaller wr covers n in one block as well).
        const int64_t need = pr.silu ? pr.n / 2 : pr.n, per_block = pr.silu ? rows_cta / 2 : rows_cta;
        if (wr > 1 && need <= per_block - (pr.silu ? kSmallMWarpRows / 2 : kSmallMWarpRows)) continue;
        const int64_t smem = small_m_smem_bytes(pr.nt, wr, wk, bpt, elem);
        if (smem > kf.max_dynamic_smem) continue;
        const int max_cluster = kf.clusters ? static_cast<int>(std::min<int64_t>(kSmallMMaxClusterSize, tiles)) : 1;
        for (int cluster = 1; cluster <= max_cluster; ++cluster) {
          SmallMConfig c;
          c.wr = wr;
          c.wk = wk;
          c.bodies_per_tile = bpt;
          c.cluster = cluster;
          c.tiles = static_cast<int>(tiles);
          c.row_blocks = blocks;
          c.smem = smem;
          const int64_t slots = resident_ctas(kernel, device, 32 * wr * wk, smem, cluster);
          if (slots <= 0) continue;
          const double cost = model_cost(pr, c, slots, d.sm_count);
          // Ties (within 0.5%) go to the earlier candidate: no split, then larger R.
          if (!found || cost < best_cost * 0.995) {
            best = c;
            best_cost = cost;
            found = true;
          }
        }
      }
    }
  }
  LLMK_CHECK(found, "gemm_small_m: no launch shape fits the device");
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, best);
  return best;
}

void launch_small_m(const char* op, SmallMArgs& args, int nt, int64_t chunks, cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const void* kernel = small_m_kernel(args.p.in_dtype, nt, args.g != nullptr);
  LLMK_CHECK(kernel != nullptr, op, ": unsupported input dtype ", dtype_name(args.p.in_dtype));
  const Problem pr{args.p.n, args.p.k, std::min<int64_t>(args.p.m, 8 * nt), chunks,
                   args.p.activation == GemmActivation::silu_mul, nt, args.g != nullptr};
  const SmallMConfig c = pick_small_m_config(kernel, device, args.p.in_dtype, pr);
  args.wr = c.wr;
  args.wk = c.wk;
  args.bodies_per_tile = c.bodies_per_tile;
  args.tiles = c.tiles;
  args.kt_w = small_m_body_k(nt) * c.bodies_per_tile;
  args.kt_cta = args.kt_w * c.wk;
  args.stage_elems = args.kt_cta * 8 * nt;

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(c.cluster), static_cast<unsigned>(c.row_blocks),
                        static_cast<unsigned>(chunks));
  config.blockDim = dim3(static_cast<unsigned>(32 * c.wr * c.wk), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(c.smem);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  if (c.cluster > 1) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(c.cluster);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  void* kernel_args[] = {&args};
  LLMK_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, kernel_args));
  LLMK_CHECK_LAUNCH(op, stream);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int current_cc_major() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return device_facts(device).cc_major;
}

}  // namespace

bool gemm_small_m_takes(const GemmParams& p) {
  if (p.m < 1 || p.m > kGemmSmallM) return false;
  if (!p.a_k_major || !p.b_k_major) return false;
  // k in 16-byte vectors; offsets (k tile * tiles) stay in int.
  if (p.k <= 0 || p.k % 8 != 0 || p.k > (int64_t{1} << 30)) return false;
  if (p.n < 1 || p.n > int64_t{65535} * kSmallMWarpRows) return false;
  if (p.in_dtype != DType::f16 && p.in_dtype != DType::bf16) return false;
  if (p.out_dtype != DType::f32 && p.out_dtype != DType::f16 && p.out_dtype != DType::bf16) return false;
  if (p.activation == GemmActivation::silu_mul && p.n % 2 != 0) return false;
  if (!aligned16(p.a) || !aligned16(p.b)) return false;
  if (p.m > 1 && p.lda % 8 != 0) return false;
  if (p.n > 1 && p.ldb % 8 != 0) return false;
  return current_cc_major() >= 8;  // mma.sync bf16, cp.async
}

void gemm_small_m_cuda(const GemmParams& p, cudaStream_t stream) {
  SmallMArgs args{};
  args.p = p;
  args.g = nullptr;
  launch_small_m("gemm_small_m", args, token_tiles(p.m), 1, stream);
}

void rmsnorm_linear_cuda(const RmsnormLinearParams& p, cudaStream_t stream) {
  // The API validated shapes and dtypes; the kernel's own needs, checked before any work:
  LLMK_CHECK(p.k > 0 && p.k % 8 == 0 && p.k <= (int64_t{1} << 30), "rmsnorm_linear: the kernel needs K a multiple of 8, got ", p.k);
  LLMK_CHECK(aligned16(p.x) && aligned16(p.w) && (p.m == 1 || p.ldx % 8 == 0) && (p.n == 1 || p.ldw % 8 == 0),
             "rmsnorm_linear: x and weight rows must be 16-byte aligned");
  LLMK_CHECK(p.g_dtype == DType::f32 || p.g_dtype == p.in_dtype, "rmsnorm_linear: norm_weight dtype ",
             dtype_name(p.g_dtype), " must be x's (", dtype_name(p.in_dtype), ") or float32");
  LLMK_CHECK(p.n <= int64_t{65535} * kSmallMWarpRows, "rmsnorm_linear: weight has too many rows (", p.n, ")");
  if (p.m == 0 || p.n == 0) return;
  SmallMArgs args{};
  GemmParams& g = args.p;
  g.out = p.out;
  g.ld_out = p.ld_out;
  g.a = p.x;
  g.lda = p.ldx;
  g.a_k_major = true;
  g.b = p.w;
  g.ldb = p.ldw;
  g.b_k_major = true;
  g.bias = nullptr;
  g.residual = nullptr;
  g.ld_residual = 0;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.activation = GemmActivation::none;
  g.in_dtype = p.in_dtype;
  g.out_dtype = p.in_dtype;
  args.g = p.g;
  args.g_f32 = p.g_dtype == DType::f32;
  args.g_aligned = aligned16(p.g);
  args.eps = static_cast<float>(p.eps);
  const int nt = token_tiles(p.m);
  const int64_t chunks = (p.m + 8 * nt - 1) / (8 * nt);
  LLMK_CHECK(chunks <= 65535, "rmsnorm_linear: x has too many rows (", p.m, ")");
  launch_small_m("rmsnorm_linear", args, nt, chunks, stream);
}

}  // namespace llmk::detail
