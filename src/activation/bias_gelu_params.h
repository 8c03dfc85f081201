// Kernel parameter blocks of bias_gelu, shared by the launchers, the kernels and the CPU
// reference. x and the outputs are [rows, d] with their own row strides; bias is [d].
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/activation_math.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// out = gelu(x + bias).
struct BiasGeluParams {
  void* out;
  const void* x;
  const void* bias;
  int64_t rows;
  int64_t d;
  int64_t out_stride;
  int64_t x_stride;
};

// dx = dy * gelu'(x + bias); dbias = sum over rows of dx (fp32). With gridDim.y > 1 the
// row groups meet through the workspace: `partial` [gridDim.y, d] fp32 sums, then
// `arrivals` [gridDim.x] counters (zero at launch; see bias_gelu_backward_cuda).
struct BiasGeluBackwardParams {
  void* dx;
  void* dbias;             // [d], bias's dtype
  const void* dy;
  const void* x;
  const void* bias;
  float* partial;          // [gridDim.y, d]
  unsigned* arrivals;      // [gridDim.x]: blocks of a column block done so far
  int64_t rows;
  int64_t d;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t x_stride;
};

// Launch shape of the backward: blocks of tx vectors x ty rows (256 threads), gridDim.x =
// column_blocks over a row's vectors, gridDim.y = splits over the rows (grid-strided).
struct BiasGeluBackwardGeometry {
  int tx, ty;
  int64_t column_blocks, splits;
  // Workspace elements (4 bytes each): the partial rows and the arrival counters; none
  // when one block holds a column block's every row.
  int64_t workspace(int64_t d) const { return splits > 1 ? splits * d + column_blocks : 0; }
};

// Blocks of 256 threads resident per SM: __launch_bounds__(256, 4) of the backward kernel.
inline constexpr int kBiasGeluBlocksPerSm = 4;

// The geometry for `rows` rows of d elements read in vectors of `vector` elements
// (`vector_bytes` bytes) on a device of `sm_count` SMs.
// - Few rows: ty ~ rows (up to 16 rows of 16-byte vectors, each thread holds one row).
// - Block rows span >= 256 bytes: two cache lines of a DRAM page per visit (column blocks
//   drift apart over the rows, so each revisits pages the others opened). Blocks widen
//   until the column blocks fit one wave (sm_count * 4 blocks): a second, mostly empty
//   wave of long blocks costs up to half the time.
// - Split the rows (splits > 1) only where each thread would otherwise loop over > 8 rows
//   (4 DRAM round trips; > 128 rows at ty = 16) and the column blocks leave half a wave
//   empty: splitting costs a counter memset, an arrival atomic and a re-read of the
//   partial rows, about what 2 round trips save. Splits fill at most one wave, each block
//   with >= 4 rows per thread and >= 64 rows, so the partial rows (written and read in
//   fp32: 8 * splits * d bytes) cost at most 1 / (24 * element bytes) of the rows' traffic
//   (3 * rows * d elements): 2.1% in bf16, 1.0% in fp32, reached only at a few hundred
//   rows; 2048 x 3072 bf16: 1.4%, 8192 x 16384: 0.07%.
inline BiasGeluBackwardGeometry bias_gelu_backward_geometry(int64_t rows, int64_t d, int vector, int vector_bytes,
                                                            int sm_count) {
  auto pow2_at_least = [](int64_t n, int64_t cap) {
    int64_t p = 1;
    while (p < n && p < cap) p *= 2;
    return p;
  };
  const int64_t vectors = d / vector;
  const int64_t wave = int64_t{kBiasGeluBlocksPerSm} * std::max(sm_count, 1);
  const int64_t tx_min = std::max(1, 256 / vector_bytes);
  int64_t tx = 256 / pow2_at_least(rows, 256 / tx_min);
  tx = std::min(tx, pow2_at_least(vectors, 256));
  auto blocks_of = [&](int64_t width) { return (vectors + width - 1) / width; };
  while (tx < 256 && blocks_of(tx) > wave) tx *= 2;
  const int64_t ty = 256 / tx, column_blocks = blocks_of(tx);
  int64_t splits = 1;
  if ((rows + ty - 1) / ty > 8 && column_blocks < wave / 2) {
    const int64_t fill = wave / std::max<int64_t>(column_blocks, 1);
    splits = std::max<int64_t>(1, std::min(fill, rows / std::max<int64_t>(4 * ty, 64)));
  }
  return {static_cast<int>(tx), static_cast<int>(ty), column_blocks, splits};
}

// `act`: Activation::gelu or gelu_tanh. `vector_ok`: 16-byte aligned rows, bias and dbias,
// d a multiple of the vector.
void bias_gelu_cuda(const BiasGeluParams& p, Activation act, DType dtype, bool vector_ok,
                    cudaStream_t stream);
void bias_gelu_backward_cuda(const BiasGeluBackwardParams& p, Activation act, DType dtype,
                             bool vector_ok, cudaStream_t stream);
void bias_gelu_cpu(const BiasGeluParams& p, Activation act, DType dtype);
void bias_gelu_backward_cpu(const BiasGeluBackwardParams& p, Activation act, DType dtype);

}  // namespace llmk::detail
