// The floor of a chain of dependent one-row kernels under programmatic dependent launch
// (issue 16's chain8 target: 8 llmk kernels at 1 token within 1.3x of 8 empty kernels).
//
// Each variant is a chain of 8 launches, repeated 10 times in one CUDA graph (80 kernels, so
// the graph's own launch is amortized), timed over 200 replays, best of 5; printed as us per
// 8 kernels. The row kernel is the least a normalization step does at 1 token of 4096 bf16:
// after ptx::pdl_start() (common/ptx.cuh: wait for the previous grid, then let the next one
// launch), load the row and a weight, reduce the sum of squares over the block, scale and
// store; each kernel reads what the previous one wrote. Variants: empty kernels with and
// without the PDL attribute, the row kernel without PDL, and with PDL over block shapes
// (threads x 16-byte vectors per thread), with the weight loaded before the wait, and (as the
// empty kernels too) with the next launch let go before the wait instead of after it (start:
// 0.1 us per 8 row kernels faster here, but llmk's kernels lost 0.3-1.1 us per 8 with
// ptx::pdl_start in that order, docs/benchmarks.md); the row
// kernel taking llmk's NormParams (136 bytes: the row check, strides, d and eps read from the
// parameter block, whose first reads in each launch miss the constant cache) with those reads
// after the wait, as llmk's kernels make them, and before it (the row's pointers formed and
// held in registers across the wait); then
// llmk's own kernels through the C++ API, 8 of one op (each reading the previous output;
// silu_and_mul reads one constant [1, 8192] row) and the chain8 sequence of
// python/llmk/bench/chain_cases.py.
//
// Build: cmake --build <build> --target pdl_chain_floor (not part of `all`); run on a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/ptx.cuh"
#include "llmk/activation.h"
#include "llmk/norm.h"
#include "llmk/softmax.h"
#include "norm/norm_params.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pdl_chain_floor: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Where a kernel lets the next one launch: after the wait for the previous grid (as
// ptx::pdl_start), or before it, so that the next launch overlaps this kernel's wait too.
template <bool kTriggerFirst>
__device__ __forceinline__ void start() {
  if (kTriggerFirst) llmk::detail::ptx::launch_dependents();
  llmk::detail::ptx::wait_for_prior_grid();
  if (!kTriggerFirst) llmk::detail::ptx::launch_dependents();
}

template <bool kPdl, bool kTriggerFirst = false>
__global__ void empty_kernel() {
  if (kPdl) start<kTriggerFirst>();
}

// The row's sum of squares reduced over the block, then y = x * rsqrt(sum * inv_d + eps) * w
// from this thread's vectors of x and w.
template <int kThreads, int kVectors>
__device__ __forceinline__ void normalize_and_store(uint4 (&xv)[kVectors], const uint4 (&wv)[kVectors], uint4* y,
                                                    float inv_d, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&xv[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      ss += f.x * f.x + f.y * f.y;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if constexpr (kThreads > 32) {
    __shared__ float warp_sums[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) ss += warp_sums[i];
  }
  const float r = rsqrtf(ss * inv_d + eps);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    auto* hx = reinterpret_cast<__nv_bfloat162*>(&xv[i]);
    const auto* hw = reinterpret_cast<const __nv_bfloat162*>(&wv[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(hx[j]), b = __bfloat1622float2(hw[j]);
      hx[j] = __floats2bfloat162_rn(a.x * r * b.x, a.y * r * b.y);
    }
    y[threadIdx.x + i * kThreads] = xv[i];
  }
}

template <int kThreads, int kVectors, bool kPdl, bool kWeightFirst, bool kTriggerFirst = false>
__global__ void __launch_bounds__(kThreads) row_kernel(const uint4* x, const uint4* w, uint4* y) {
  uint4 xv[kVectors], wv[kVectors];
  auto load_weight = [&] {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) wv[i] = w[threadIdx.x + i * kThreads];
  };
  if (kWeightFirst) load_weight();
  if (kPdl) start<kTriggerFirst>();
  if (!kWeightFirst) load_weight();
#pragma unroll
  for (int i = 0; i < kVectors; ++i) xv[i] = x[threadIdx.x + i * kThreads];
  normalize_and_store<kThreads, kVectors>(xv, wv, y, 1.f / (kThreads * kVectors * 8), 1e-6f);
}

// The row kernel at 512 x 1 on a NormParams row: reads rows, the strides, d and eps from the
// parameter block after the wait, or (kEarly) forms the row's pointers and scale before it
// and holds them in registers across it.
template <bool kEarly>
__global__ void __launch_bounds__(512) norm_params_kernel(llmk::detail::NormParams p) {
  const int64_t row = blockIdx.x;
  const uint4 *x = nullptr, *w = nullptr;
  uint4* y = nullptr;
  float inv_d = 0.f, eps = 0.f;
  auto read_params = [&] {
    x = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.x) + row * p.x_stride);
    y = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + row * p.out_stride);
    w = static_cast<const uint4*>(p.weight);
    inv_d = 1.f / static_cast<float>(p.d);
    eps = p.eps;
  };
  if (kEarly) {
    if (row >= p.rows) return;
    read_params();
    asm volatile("" : "+l"(x), "+l"(y), "+l"(w), "+f"(inv_d), "+f"(eps));
  }
  llmk::detail::ptx::pdl_start();
  if (!kEarly) {
    if (row >= p.rows) return;
    read_params();
  }
  const uint4 wv[1] = {w[threadIdx.x]};
  uint4 xv[1] = {x[threadIdx.x]};
  normalize_and_store<512, 1>(xv, wv, y, inv_d, eps);
}

template <class... Params, class... Args>
void launch(cudaStream_t stream, bool pdl, int threads, void (*kernel)(Params...), Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = 1;
  config.blockDim = threads;
  config.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl ? &attr : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, args...), "cudaLaunchKernelEx");
}

// us per chain of 8: `chain` launches 8 kernels; the graph holds 10 chains.
template <class Chain>
float time_chain(cudaStream_t stream, Chain chain) {
  constexpr int kChains = 10, kReplays = 200;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
  for (int c = 0; c < kChains; ++c) chain();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 50; ++i) check(cudaGraphLaunch(exec, stream), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    check(cudaEventRecord(start, stream), "record");
    for (int i = 0; i < kReplays; ++i) check(cudaGraphLaunch(exec, stream), "replay");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    best = std::min(best, ms * 1000.f / (kReplays * kChains));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return best;
}

}  // namespace

int main() {
  constexpr size_t kRowBytes = 4096 * 2;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  uint4 *rows[2], *weight;
  for (auto*& p : rows) check(cudaMalloc(&p, kRowBytes), "malloc");
  check(cudaMalloc(&weight, kRowBytes), "malloc");
  for (auto* p : {rows[0], rows[1], weight}) check(cudaMemset(p, 0x3c, kRowBytes), "memset");  // bf16 ~0.0115

  auto empty_chain = [&](auto kernel, bool pdl) {
    return time_chain(stream, [&] {
      for (int k = 0; k < 8; ++k) launch(stream, pdl, 32, kernel);
    });
  };
  auto row_chain = [&](auto kernel, int threads, bool pdl) {
    return time_chain(stream, [&] {
      for (int k = 0; k < 8; ++k)
        launch(stream, pdl, threads, kernel, static_cast<const uint4*>(rows[k % 2]), static_cast<const uint4*>(weight),
               rows[1 - k % 2]);
    });
  };
  const float empty = empty_chain(empty_kernel<false>, false);
  std::printf("| chain of 8 | us | x 8 empty kernels |\n|---|---:|---:|\n");
  auto row = [&](const char* name, float us) { std::printf("| %s | %.2f | %.2fx |\n", name, us, us / empty); };
  row("empty kernels", empty);
  row("empty kernels, PDL", empty_chain(empty_kernel<true>, true));
  row("empty kernels, PDL, next launched before the wait", empty_chain(empty_kernel<true, true>, true));
  row("row kernel 512 x 1, no PDL", row_chain(row_kernel<512, 1, false, false>, 512, false));
  row("row kernel 512 x 1, PDL", row_chain(row_kernel<512, 1, true, false>, 512, true));
  row("row kernel 512 x 1, PDL, weight before the wait", row_chain(row_kernel<512, 1, true, true>, 512, true));
  row("row kernel 512 x 1, PDL, next launched before the wait",
      row_chain(row_kernel<512, 1, true, false, true>, 512, true));
  row("row kernel 128 x 4, PDL", row_chain(row_kernel<128, 4, true, false>, 128, true));
  row("row kernel 64 x 8, PDL", row_chain(row_kernel<64, 8, true, false>, 64, true));
  row("row kernel 32 x 16, PDL", row_chain(row_kernel<32, 16, true, false>, 32, true));
  auto params_chain = [&](auto kernel) {
    return time_chain(stream, [&] {
      for (int k = 0; k < 8; ++k) {
        llmk::detail::NormParams p = {};
        p.out = rows[1 - k % 2];
        p.x = rows[k % 2];
        p.weight = weight;
        p.rows = 1;
        p.d = 4096;
        p.out_stride = p.x_stride = 4096;
        p.eps = 1e-6f;
        launch(stream, true, 512, kernel, p);
      }
    });
  };
  row("row kernel 512 x 1 on NormParams, PDL, read after the wait", params_chain(norm_params_kernel<false>));
  row("row kernel 512 x 1 on NormParams, PDL, read before the wait", params_chain(norm_params_kernel<true>));

  using llmk::DType;
  const llmk::Device gpu{llmk::DeviceType::cuda, 0};
  void* gate_up_data;
  check(cudaMalloc(&gate_up_data, 2 * kRowBytes), "malloc");
  check(cudaMemset(gate_up_data, 0x3c, 2 * kRowBytes), "memset");
  const llmk::TensorView a(rows[0], DType::bf16, gpu, {1, 4096}), b(rows[1], DType::bf16, gpu, {1, 4096});
  const llmk::TensorView w(weight, DType::bf16, gpu, {4096}), gate_up(gate_up_data, DType::bf16, gpu, {1, 8192});
  auto ops = [&](const char* name, auto step) {
    row(name, time_chain(stream, [&] {
      for (int k = 0; k < 8; ++k) step(k % 2 ? b : a, k % 2 ? a : b);
    }));
  };
  ops("llmk rmsnorm x 8", [&](auto& x, auto& y) { llmk::rmsnorm(y, x, w, 1e-6, 0.0, std::nullopt, stream); });
  ops("llmk add_rmsnorm x 8 (in place)", [&](auto& x, auto& y) { llmk::add_rmsnorm_(x, y, w, 1e-6, 0.0, stream); });
  ops("llmk softmax x 8", [&](auto& x, auto& y) { llmk::softmax(y, x, 1.0, stream); });
  ops("llmk silu_and_mul x 8", [&](auto&, auto& y) { llmk::silu_and_mul(y, gate_up, stream); });
  row("llmk chain8", time_chain(stream, [&] {
    llmk::rmsnorm(b, a, w, 1e-6, 0.0, std::nullopt, stream);  // h = b
    llmk::silu_and_mul(a, gate_up, stream);                     // act = a
    llmk::add_rmsnorm_(a, b, w, 1e-6, 0.0, stream);             // b = h + act, a = rmsnorm(b)
    llmk::softmax(b, a, 1.0, stream);
    llmk::rmsnorm(a, b, w, 1e-6, 0.0, std::nullopt, stream);
    llmk::silu_and_mul(b, gate_up, stream);
    llmk::add_rmsnorm_(b, a, w, 1e-6, 0.0, stream);
    llmk::softmax(a, b, 1.0, stream);
  }));
  check(cudaStreamSynchronize(stream), "sync");
  return 0;
}
