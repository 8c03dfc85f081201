// Multi-tensor AdamW kernel and its launcher.
//
// Each block walks the launch's chunks c = blockIdx.x, blockIdx.x + gridDim.x, ... (the
// grid is at most one wave of resident blocks), finds each chunk's tensor by a binary
// search of the chunk prefix sums (the launch description is a __grid_constant__
// parameter, indexed in place rather than copied to local memory), reads that tensor's
// step t and the lr, and updates the chunk's kAdamWChunk elements: 4 per thread per
// iteration (16-byte moment loads, 8- or 16-byte parameter loads) when the tensor's
// pointers are aligned, else (and for the last numel % 4 elements) 4 strided scalars.
//
// Roofline: per element read p, g, m, v and write p, m, v: 28 bytes with f32 parameters,
// 22 with bf16/f16 ones (f32 moments). 100M f32 parameters move 2.8 GB: 0.93 ms at the
// measured 3.0 TB/s. ~15 FLOPs and one sqrt/division per element: memory-bound.
#include <cmath>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/occupancy.h"
#include "common/pdl_launch.h"
#include "common/ptx.cuh"
#include "common/vec.cuh"
#include "optim/adamw_params.h"

namespace llmk::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWidth = 4;

// The per-tensor scalars of the update. 1 - beta and the bias corrections come from the
// double hyperparameters (1 - 0.999f is 1.3e-5 off 1e-3); the update itself is fp32.
struct AdamWMath {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bc2_sqrt, grad_sign;

  __device__ __forceinline__ AdamWMath(const AdamWHyper& h, float step) {
    const float lr = h.lr_ptr ? *h.lr_ptr : static_cast<float>(h.lr);
    beta1 = static_cast<float>(h.beta1);
    beta2 = static_cast<float>(h.beta2);
    one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
    one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    eps = static_cast<float>(h.eps);
    decay = 1.0f - lr * static_cast<float>(h.weight_decay);
    step_size = lr / static_cast<float>(1.0 - pow(h.beta1, static_cast<double>(step)));
    bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(h.beta2, static_cast<double>(step))));
    grad_sign = h.maximize ? -1.0f : 1.0f;
  }

  __device__ __forceinline__ void update(float& p, float g, float& m, float& v) const {
    g *= grad_sign;
    p *= decay;
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * g * g;
    p -= step_size * m / (sqrtf(v) / bc2_sqrt + eps);
  }
};

// Elements [begin, end) of tensor t.
template <class T>
__device__ __forceinline__ void adamw_chunk(const AdamWLaunch& L, int t, const AdamWMath& math,
                                            int64_t begin, int64_t end) {
  T* param = static_cast<T*>(L.param[t]);
  const T* grad = static_cast<const T*>(L.grad[t]);
  float* exp_avg = L.exp_avg[t];
  float* exp_avg_sq = L.exp_avg_sq[t];
  int64_t scalar_begin = begin;
  if (L.vector_ok[t]) {
    const int64_t vector_end = begin + (end - begin) / kWidth * kWidth;
    for (int64_t i = begin + threadIdx.x * kWidth; i < vector_end; i += kThreads * kWidth) {
      Vec<T, kWidth> p = load_vec<T, kWidth>(param + i);
      const Vec<T, kWidth> g = load_vec<T, kWidth>(grad + i);
      Vec<float, kWidth> m = load_vec<float, kWidth>(exp_avg + i);
      Vec<float, kWidth> v = load_vec<float, kWidth>(exp_avg_sq + i);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        float pj = to_float(p.v[j]);
        math.update(pj, to_float(g.v[j]), m.v[j], v.v[j]);
        p.v[j] = from_float<T>(pj);
      }
      store_vec<T, kWidth>(param + i, p);
      store_vec<float, kWidth>(exp_avg + i, m);
      store_vec<float, kWidth>(exp_avg_sq + i, v);
    }
    scalar_begin = vector_end;
  }
  // Unaligned tensors: kWidth coalesced elements per thread per iteration, all loaded
  // before any is stored, so that the loads overlap.
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads * kWidth) {
    float p[kWidth], g[kWidth], m[kWidth], v[kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const int64_t k = i + j * kThreads;
      if (k < end) {
        p[j] = to_float(param[k]);
        g[j] = to_float(grad[k]);
        m[j] = exp_avg[k];
        v[j] = exp_avg_sq[k];
      }
    }
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const int64_t k = i + j * kThreads;
      if (k < end) {
        math.update(p[j], g[j], m[j], v[j]);
        param[k] = from_float<T>(p[j]);
        exp_avg[k] = m[j];
        exp_avg_sq[k] = v[j];
      }
    }
  }
}

// One block per chunk left a launch of just over a wave of chunks with a second, nearly
// empty wave (docs/history/adamw.md); the block-strided walk does not.
template <class T>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ AdamWLaunch L) {
  ptx::pdl_start();
  const int32_t chunks = L.chunk_end[L.count - 1];
  int current = -1;
  AdamWMath math(L.hyper, 1.0f);
  for (int32_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int t = 0, hi = L.count - 1;
    while (t < hi) {
      const int mid = (t + hi) / 2;
      if (c < L.chunk_end[mid]) hi = mid;
      else t = mid + 1;
    }
    if (t != current) {
      math = AdamWMath(L.hyper, *L.step[t]);
      current = t;
    }
    const int64_t begin = (c - (t > 0 ? L.chunk_end[t - 1] : 0)) * kAdamWChunk;
    const int64_t end = begin + kAdamWChunk < L.numel[t] ? begin + kAdamWChunk : L.numel[t];
    adamw_chunk<T>(L, t, math, begin, end);
  }
}

}  // namespace

void adamw_cuda(const AdamWLaunch& launch, DType dtype, cudaStream_t stream) {
  const int32_t chunks = launch.chunk_end[launch.count - 1];
  int device = 0, sms = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  dispatch_dtype(dtype, "adamw_step_", [&](auto tag) {
    const auto kernel = adamw_kernel<device_type_t<decltype(tag)>>;
    const int wave = kernel_fit(reinterpret_cast<const void*>(kernel), kThreads, device).blocks_per_sm * sms;
    const int blocks = chunks < wave ? chunks : wave;
    launch_pdl(kernel, dim3(blocks), dim3(kThreads), 0, stream, launch);
  });
  LLMK_CHECK_LAUNCH("adamw_kernel", stream);
}

}  // namespace llmk::detail
