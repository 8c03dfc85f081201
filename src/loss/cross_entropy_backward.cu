// Launcher of cross_entropy_backward (the kernel in cross_entropy_backward_kernel.cuh).
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/pdl_launch.h"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_backward_kernel.cuh"

namespace llmk::detail {

void cross_entropy_backward_cuda(const CrossEntropyBackwardParams& p, DType dtype, bool vector_ok,
                                 cudaStream_t stream) {
  constexpr int kThreads = 256;
  dispatch_dtype(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    auto launch = [&](auto n_constant) {
      constexpr int N = decltype(n_constant)::value;
      const int64_t chunks_per_row = (p.n + kThreads * N - 1) / (kThreads * N);
      launch_pdl(cross_entropy_backward_kernel<T, N>, dim3(static_cast<unsigned>(p.rows * chunks_per_row)), dim3(kThreads),
                 0, stream, p, chunks_per_row);
      LLMK_CHECK_LAUNCH("cross_entropy_backward_kernel", stream);
    };
    if (vector_ok) launch(std::integral_constant<int, kVec16<T>>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace llmk::detail
