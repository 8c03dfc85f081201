// Stream-ordered scratch memory for a kernel's intermediate results (the split-K GEMM's
// partial sums): from a memory pool of llmk's own per device, which keeps up to 256 MB
// cached between calls, so that a call pays no cudaMalloc and no synchronization. Inside
// a CUDA graph capture the allocation becomes the graph's own (an allocation node).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace llmk::detail {

// Whether `device` has stream-ordered memory pools (every GPU and driver llmk supports, short
// of some virtualized setups); a caller without them takes a path that needs no scratch.
bool scratch_available(int device);

// `bytes` of device memory on `device` (the current device), usable by work enqueued on
// `stream` after this call until scratch_free on the same stream.
void* scratch_alloc(size_t bytes, int device, cudaStream_t stream);
void scratch_free(void* ptr, cudaStream_t stream);

}  // namespace llmk::detail
