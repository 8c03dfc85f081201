// Launcher of cross_entropy (kernels and thresholds in cross_entropy_kernel.cuh).
#include "common/row_launch.cuh"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernel.cuh"

namespace llmk::detail {

void cross_entropy_cuda(const CrossEntropyParams& p, DType dtype, bool vector_ok, cudaStream_t stream) {
  auto with_grad = [&](auto grad_constant) {
    constexpr bool kGrad = decltype(grad_constant)::value;
    launch_row_op(
        "cross_entropy", p, dtype, vector_ok, stream,
        [](auto t, auto vpt) -> const void* {
          // Without a gradient the one-pass loop kernel reads the row once at any length.
          if constexpr (!kGrad) return nullptr;
          else return reinterpret_cast<const void*>(
                   cross_entropy_vec_kernel<decltype(t), kVec16<decltype(t)>, decltype(vpt)::value>);
        },
        [](auto t, auto n) -> const void* {
          return reinterpret_cast<const void*>(cross_entropy_loop_kernel<decltype(t), decltype(n)::value, kGrad>);
        });
  };
  if (p.dlogits != nullptr) with_grad(std::true_type{});
  else with_grad(std::false_type{});
}

}  // namespace llmk::detail
