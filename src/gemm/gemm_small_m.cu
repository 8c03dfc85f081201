// Launcher of the small-M GEMM and of rmsnorm_linear (gemm_small_m_kernel.cuh): which
// calls the kernel takes, the compiled instantiations, and the launch shape.
//
// Launch shape. A CTA streams R = 32 * wr weight rows over a range of k tiles with wr * wk
// warps; gridDim = (C, ceil(rows / R), 64-token chunks), C = the cluster size along K
// (sm_90 builds on sm_90 devices; 1 otherwise). pick_small_m_config chooses it (see there);
// the choice is cached per (device, dtype, token tiles, norm, chunks, n, k, silu_mul).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <cstdio>
#include <cstdlib>

#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "gemm/gemm.h"
#include "gemm/gemm_small_m_kernel.cuh"

namespace llmk::detail {
namespace {

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
  const size_t bytes = static_cast<size_t>(smem);
  const int per_sm = kernel_fit(kernel, threads, device, bytes).blocks_per_sm;
  const int64_t per_sm_slots = int64_t{per_sm} * device_facts(device).sm_count;
  // Clusters: never more than the per-SM occupancy allows (the cluster query was seen to report
  // more for 384-thread CTAs on the H100); 0 for a shape the device cannot co-schedule, not a
  // candidate.
  const int64_t slots =
      cluster == 1 ? per_sm_slots
                   : std::min(int64_t{max_active_clusters(kernel, threads, bytes, cluster)} * cluster, per_sm_slots);
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
  int bits;  // 16: a dense weight; 4, 8: quantized codes
};

// A launch shape with its derived fields (row blocks, k tiles, shared memory).
SmallMConfig make_small_m_config(const Problem& pr, int wr, int wk, int bodies_per_tile, int cluster) {
  SmallMConfig c;
  c.wr = wr;
  c.wk = wk;
  c.bodies_per_tile = bodies_per_tile;
  c.cluster = cluster;
  const int64_t kt_cta = int64_t{small_m_body_k(pr.nt, pr.bits)} * bodies_per_tile * wk;
  c.tiles = static_cast<int>((pr.k + kt_cta - 1) / kt_cta);
  c.row_blocks = row_blocks(pr.n, pr.silu, kSmallMWarpRows * wr);
  c.smem = small_m_smem_bytes(pr.nt, wr, wk, bodies_per_tile, 2, pr.bits);
  return c;
}

// The launch shape: the smallest cluster C (1, 2, 4, 8), then the largest rows per CTA
// R = 32 wr, whose grid (row blocks x C x chunks) is one wave that covers >= 85% of the SMs
// with >= 4 MB of weight loads in flight (wr warps x the ring's bytes per CTA; Little's law
// at ~3 TB/s and ~1.3 us). NT >= 4 keeps wr >= 6: x is re-read from L2 once per CTA, M/R of
// the weight bytes.
// Shapes no such grid fits (N too small without clusters, too large for one wave, or
// 3.5-4 MB in flight at most) take the shape with the best score of wave efficiency (one
// wave preferred), coverage, bytes in flight (saturating at 3.5 MB) and cluster size.
// Fitted to an H100 sweep of (wr, wk, k tile, C) on the Llama/Qwen decode shapes, where
// the rule's picks land near the best measured shape; wk = 2 and 2-body k tiles were
// never better by more than noise there, so they serve only the fallback.
SmallMConfig pick_small_m_config(const void* kernel, int device, DType in, const Problem& pr) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, bool, int64_t, int64_t, int64_t, bool, int>, SmallMConfig> cache;
  const auto key =
      std::make_tuple(device, static_cast<int>(in), pr.nt, pr.norm, pr.chunks, pr.n, pr.k, pr.silu, pr.bits);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const DeviceFacts d = device_facts(device);
  const KernelFacts kf = kernel_facts(kernel, device);
  const int max_warps = std::min(kf.max_threads / 32, 12);
  const int wr_min = pr.nt >= 4 ? std::min(6, max_warps) : 2;
  const int max_cluster = kf.clusters ? kSmallMMaxClusterSize : 1;
  // Bytes of weight loads a warp keeps in flight: a body's 16-byte loads of 4 rows x 32 lanes.
  const double per_warp = static_cast<double>(small_m_body_k(pr.nt, pr.bits)) / kSmallMChunk * pr.bits / 16 * 2048.0;
  const double inflight_target = 4.0 * 1024 * 1024;
  const double coverage_target = 0.84 * d.sm_count;

  auto ctas_of = [&](const SmallMConfig& c) { return c.row_blocks * c.cluster * pr.chunks; };
  auto fits = [&](const SmallMConfig& c) {
    return c.tiles >= c.cluster && c.smem <= kf.max_dynamic_smem && c.row_blocks <= 65535 &&
           32 * c.wr * c.wk <= kf.max_threads;
  };
  SmallMConfig best;
  bool found = false;
  for (int cluster = 1; cluster <= max_cluster && !found; cluster *= 2)  // 1, 2, 4, 8: GPC packing
    for (int wr = max_warps; wr >= wr_min; --wr) {
      const SmallMConfig c = make_small_m_config(pr, wr, 1, 1, cluster);
      if (!fits(c)) continue;
      const int64_t ctas = ctas_of(c);
      if (static_cast<double>(ctas) < coverage_target) continue;
      if (static_cast<double>(ctas) * wr * per_warp < inflight_target) continue;
      if (ctas > resident_ctas(kernel, device, 32 * wr, c.smem, cluster)) continue;
      best = c;
      found = true;
      break;
    }
  if (!found) {
    double best_score = -1;
    for (int wk : {1, 2, 4})
      for (int wr = max_warps; wr >= 1; --wr)
        for (int cluster = 1; cluster <= max_cluster; cluster *= 2) {
          const SmallMConfig c = make_small_m_config(pr, wr, wk, 1, cluster);
          if (!fits(c)) continue;
          const int64_t slots = resident_ctas(kernel, device, 32 * wr * wk, c.smem, cluster);
          if (slots <= 0) continue;
          const double ctas = static_cast<double>(ctas_of(c));
          const double waves = std::ceil(ctas / static_cast<double>(slots));
          const double wave_eff = ctas <= slots ? 1.0 : ctas / static_cast<double>(slots) / waves;
          const double coverage = std::min(1.0, ctas / coverage_target);
          const double resident = std::min(ctas, static_cast<double>(slots));
          const double inflight = std::min(1.0, resident * wr * wk * per_warp / (0.875 * inflight_target));
          // Measured: several waves of clusters lose ~15% to one wave (each wave pays the
          // reduction and ramp), and each doubling of C ~2% (the reduction).
          const double cluster_cost = 1.0 - 0.02 * std::log2(static_cast<double>(cluster));
          // x re-read from L2 by every CTA: M/R of the weight bytes; at ~1 it costs ~20%.
          const double x_ratio = static_cast<double>(pr.m_chunk) / (kSmallMWarpRows * wr);
          const double score = wave_eff * (waves > 1 ? 0.9 : 1.0) * coverage * inflight * cluster_cost *
                               (x_ratio > 0.7 ? 0.85 : 1.0);
          if (score > best_score * 1.02) {  // ties: larger wr, wk 1, smaller C (search order)
            best = c;
            best_score = score;
            found = true;
          }
        }
  }
  LLMK_CHECK(found, "gemm_small_m: no launch shape fits the device");
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, best);
  return best;
}

Problem small_m_problem(const SmallMArgs& args, int nt, int64_t chunks, int bits) {
  return Problem{args.p.n, args.p.k, std::min<int64_t>(args.p.m, 8 * nt), chunks,
                 args.p.activation == GemmActivation::silu_mul, nt, args.g != nullptr, bits};
}

void launch_small_m_with(const char* op, const void* kernel, SmallMArgs& args, int nt, int64_t chunks, int bits,
                         const SmallMConfig& c, cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  (void)kernel_facts(kernel, device);  // the dynamic shared memory opt-in
  args.wr = c.wr;
  args.wk = c.wk;
  args.bodies_per_tile = c.bodies_per_tile;
  args.tiles = c.tiles;
  args.kt_w = small_m_body_k(nt, bits) * c.bodies_per_tile;
  args.kt_cta = args.kt_w * c.wk;
  args.stage_elems = args.kt_cta * 8 * nt;

  void* kernel_args[] = {&args};
  launch_cluster(kernel,
                 dim3(static_cast<unsigned>(c.cluster), static_cast<unsigned>(c.row_blocks),
                      static_cast<unsigned>(chunks)),
                 dim3(static_cast<unsigned>(32 * c.wr * c.wk)), static_cast<size_t>(c.smem), stream, kernel_args,
                 static_cast<unsigned>(c.cluster));
  LLMK_CHECK_LAUNCH(op, stream);
}

void launch_small_m(const char* op, SmallMArgs& args, int nt, int64_t chunks, cudaStream_t stream) {
  const void* kernel = small_m_kernel(args.p.in_dtype, nt, args.g != nullptr);
  LLMK_CHECK(kernel != nullptr, op, ": unsupported input dtype ", dtype_name(args.p.in_dtype));
  launch_small_m_kernel(op, kernel, args, nt, chunks, 16, stream);
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

int small_m_token_tiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

void launch_small_m_kernel(const char* op, const void* kernel, SmallMArgs& args, int nt, int64_t chunks, int bits,
                           cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  SmallMConfig c = pick_small_m_config(kernel, device, args.p.in_dtype, small_m_problem(args, nt, chunks, bits));
  if (const char* e = std::getenv("LLMK_XQ_CFG")) {
    int wr = 0, wk = 0, cl = 0;
    if (std::sscanf(e, "%d,%d,%d", &wr, &wk, &cl) == 3) c = make_small_m_config(small_m_problem(args, nt, chunks, bits), wr, wk, 1, cl);
  }
  launch_small_m_with(op, kernel, args, nt, chunks, bits, c, stream);
}

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
  launch_small_m("gemm_small_m", args, small_m_token_tiles(p.m), 1, stream);
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
  args.p = plain_gemm_params(p.out, p.ld_out, p.x, p.ldx, p.w, p.ldw, p.m, p.n, p.k, p.in_dtype);
  args.g = p.g;
  args.g_f32 = p.g_dtype == DType::f32;
  args.g_aligned = aligned16(p.g);
  args.eps = static_cast<float>(p.eps);
  const int nt = small_m_token_tiles(p.m);
  const int64_t chunks = (p.m + 8 * nt - 1) / (8 * nt);
  LLMK_CHECK(chunks <= 65535, "rmsnorm_linear: x has too many rows (", p.m, ")");
  launch_small_m("rmsnorm_linear", args, nt, chunks, stream);
}

}  // namespace llmk::detail
