// Launchers of bias_gelu and its backward: the gated activations' geometry, the backward
// with gridDim.y fixed to the partial-sum rows, then the column reduction into dbias.
#include "activation/bias_gelu_kernel.cuh"
#include "activation/gated_launch.cuh"
#include "common/column_reduce.cuh"
#include "common/pdl_launch.h"

namespace llmk::detail {

namespace {

// Calls f(type tag, vector width, activation constant); act is gelu or gelu_tanh.
template <class F>
void dispatch_bias_gelu(Activation act, DType dtype, bool vector_ok, const char* op, F&& f) {
  dispatch_gated(act, dtype, vector_ok, op, [&](auto tag, auto width, auto act_constant) {
    if constexpr (decltype(act_constant)::value != Activation::silu) f(tag, width, act_constant);
  });
}

}  // namespace

void bias_gelu_cuda(const BiasGeluParams& p, Activation act, DType dtype, bool vector_ok,
                    cudaStream_t stream) {
  dispatch_bias_gelu(act, dtype, vector_ok, "bias_gelu", [&](auto tag, auto width, auto act_constant) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = decltype(width)::value;
    const GatedGeometry g = gated_geometry(p.rows, p.d / N);
    launch_pdl(bias_gelu_forward_kernel<T, N, decltype(act_constant)::value>, g.grid, g.block, 0, stream, p);
  });
  LLMK_CHECK_LAUNCH("bias_gelu", stream);
}

void bias_gelu_backward_cuda(const BiasGeluBackwardParams& p, Activation act, DType dtype,
                             bool vector_ok, cudaStream_t stream) {
  int device = 0, sm_count = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  dispatch_bias_gelu(act, dtype, vector_ok, "bias_gelu_backward", [&](auto tag, auto width, auto act_constant) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = decltype(width)::value;
    GatedGeometry g = gated_geometry(p.rows, p.d / N);
    const int64_t partial_rows = bias_gelu_partial_rows(p.rows, g.block.y, sm_count);
    g.grid.y = static_cast<unsigned>(partial_rows);
    launch_pdl(bias_gelu_backward_kernel<T, N, decltype(act_constant)::value>, g.grid, g.block, 0, stream, p);
    if (partial_rows > 1) {
      LLMK_CHECK_LAUNCH("bias_gelu_backward", stream);
      launch_column_reduce(p.partial, static_cast<T*>(p.dbias), partial_rows, p.d, stream);
    }
  });
  LLMK_CHECK_LAUNCH("bias_gelu_backward", stream);
}

}  // namespace llmk::detail
