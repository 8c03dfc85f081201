// cross_entropy_backward kernel: the gradient of the row losses from the forward's lse,
//   dlogits[r, j] = dloss[r] * (p_j (1 + 2 z_loss lse_r) - (1 - eps) [j == t_r] - eps / n),
//   p_j = exp(z_j - lse_r),
// zero on rows whose target is ignore_index; a row whose lse is -inf (all masked) has p = 0;
// a target outside [0, n) (checked on the CPU path only) gives a NaN row.
//
// Algorithm. Elementwise with per-row constants: the grid covers rows x column chunks (one
// block per chunk of blockDim x N elements, so few rows still fill the GPU); each thread
// loads N elements as one 16-byte vector where rows are aligned (N = 1 otherwise), and
// reads its row's dloss, lse and target (broadcast loads). fp32 outputs take expf, 16-bit
// ones one ex2.approx (RowScale::exp_out, as softmax).
//
// Roofline (bf16, rows x n): read n, write n: 4 bytes per element, ~8 FLOPs and one exp:
// bandwidth bound. 8192 x 128256 bf16: 4.2 GB -> 1.40 ms at 3.0 TB/s. With the forward's
// one read this is the fwd + bwd floor short of writing the gradient in the forward pass.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/softmax_rows.cuh"
#include "common/vec.cuh"
#include "loss/cross_entropy.h"

namespace llmk::detail {

template <class T, int N>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardParams p, int64_t chunks_per_row) {
  ptx::pdl_start();
  const int64_t block = blockIdx.x;
  const int64_t row = block / chunks_per_row;
  const int64_t col = ((block % chunks_per_row) * blockDim.x + threadIdx.x) * N;
  if (col >= p.n) return;
  const int64_t t = p.target_i64 ? static_cast<const int64_t*>(p.target)[row]
                                 : static_cast<const int32_t*>(p.target)[row];
  const float eps = static_cast<float>(p.label_smoothing);
  const float g = p.dloss[row], lse = p.lse[row];
  const bool ignored = t == p.ignore_index;
  const bool valid = ignored || (t >= 0 && t < p.n);
  // Row constants: ignored rows are all zero; an all -inf row has no softmax term.
  const float c_prob = ignored || lse == -INFINITY ? 0.0f : g * (1.0f + 2.0f * static_cast<float>(p.z_loss) * lse);
  const float c_all = ignored ? 0.0f : g * eps / static_cast<float>(p.n);
  const float c_target = ignored ? 0.0f : g * (1.0f - eps);
  const RowScale<T> unit = RowScale<T>::unit();
  const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride + col;
  T* dx = static_cast<T*>(p.dlogits) + row * p.dlogits_stride + col;
  const Vec<T, N> in = load_vec<T, N>(x);
  Vec<T, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float prob = c_prob == 0.0f ? 0.0f : unit.exp_out(to_float(in.v[k]), lse);
    const float d = prob * c_prob - c_all - (col + k == t ? c_target : 0.0f);
    out.v[k] = from_float<T>(valid ? d : NAN);
  }
  store_vec<T, N>(dx, out);
}

}  // namespace llmk::detail
