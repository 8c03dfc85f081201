// all_reduce_add_rmsnorm's CUDA launcher and its one instantiation list: the one-shot and
// two-shot kernels over rows of f32, f16 or bf16, the weight in the rows' dtype or f32, groups
// of up to 2, 4 or 8 ranks; and the fill that marks a new peer buffer's slots empty.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/device_types.cuh"
#include "common/dispatch.h"
#include "distributed/all_reduce_norm_kernel.cuh"

namespace llmk::detail {

namespace {

__global__ void fill_words_kernel(uint32_t* words, int64_t count, uint32_t value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x)
    words[i] = value;
}

template <class T, class W, int kMaxWorld>
void launch(const AllReduceNormParams& p, AllReduceKernel kernel, cudaStream_t stream) {
  const int64_t vecs = p.d / kVec16<T>;
  const int threads = static_cast<int>(
      std::min<int64_t>(kAllReduceThreads<kMaxWorld>, std::max<int64_t>(32, (vecs + 31) / 32 * 32)));
  if (kernel == AllReduceKernel::two_shot)
    all_reduce_add_rmsnorm_two_shot_kernel<T, W, kMaxWorld><<<kPeerBlocks, threads, 0, stream>>>(p);
  else
    all_reduce_add_rmsnorm_kernel<T, W, kMaxWorld><<<kPeerBlocks, threads, 0, stream>>>(p);
  LLMK_CHECK_LAUNCH("all_reduce_add_rmsnorm_kernel", stream);
}

template <class T, class W>
void launch(const AllReduceNormParams& p, AllReduceKernel kernel, cudaStream_t stream) {
  if (p.world <= 2) return launch<T, W, 2>(p, kernel, stream);
  if (p.world <= 4) return launch<T, W, 4>(p, kernel, stream);
  launch<T, W, 8>(p, kernel, stream);
}

}  // namespace

void fill_peer_slots_cuda(void* buffer, size_t bytes) {
  const int64_t words = static_cast<int64_t>((bytes - kPeerDataOffset) / sizeof(uint32_t));
  fill_words_kernel<<<256, 256>>>(reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(buffer) + kPeerDataOffset), words,
                                  kEmptyWord);
  LLMK_CHECK_LAUNCH("fill_words_kernel", nullptr);
}

void all_reduce_add_rmsnorm_cuda(const AllReduceNormParams& p, AllReduceKernel kernel, DType act, DType weight,
                                 cudaStream_t stream) {
  dispatch_act_weight(act, weight, "all_reduce_add_rmsnorm", [&](auto act_tag, auto weight_tag) {
    launch<device_type_t<decltype(act_tag)>, device_type_t<decltype(weight_tag)>>(p, kernel, stream);
  });
}

}  // namespace llmk::detail
