// Launchers of bias_gelu and its backward: the forward in the gated activations' geometry,
// the backward in bias_gelu_backward_geometry's, one launch (after a memset of its arrival
// counters when the rows are split).
#include "activation/bias_gelu_kernel.cuh"
#include "activation/gated_launch.cuh"
#include "common/occupancy.h"
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

void bias_gelu_backward_cuda(const BiasGeluBackwardParams& params, Activation act, DType dtype,
                             bool vector_ok, cudaStream_t stream) {
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const int sm_count = sm_count_of(device);
  dispatch_bias_gelu(act, dtype, vector_ok, "bias_gelu_backward", [&](auto tag, auto width, auto act_constant) {
    using T = device_type_t<decltype(tag)>;
    constexpr int N = decltype(width)::value;
    const BiasGeluBackwardGeometry g =
        bias_gelu_backward_geometry(params.rows, params.d, N, N * static_cast<int>(sizeof(T)), sm_count);
    BiasGeluBackwardParams p = params;
    if (g.splits > 1) {
      // The arrival counters follow the partial rows; each call starts them at zero (the
      // workspace comes from a caching allocator: its contents are anyone's).
      p.arrivals = reinterpret_cast<unsigned*>(p.partial + g.splits * p.d);
      LLMK_CUDA_CHECK(cudaMemsetAsync(p.arrivals, 0, g.column_blocks * sizeof(unsigned), stream));
    }
    launch_pdl(bias_gelu_backward_kernel<T, N, decltype(act_constant)::value>,
               dim3(static_cast<unsigned>(g.column_blocks), static_cast<unsigned>(g.splits)), dim3(g.tx, g.ty), 0,
               stream, p);
  });
  LLMK_CHECK_LAUNCH("bias_gelu_backward", stream);
}

}  // namespace llmk::detail
