// LLMK_HOST_DEVICE: a function shared by a CUDA kernel and its CPU reference.
#pragma once

#ifdef __CUDACC__
#define LLMK_HOST_DEVICE __host__ __device__
#else
#define LLMK_HOST_DEVICE
#endif
