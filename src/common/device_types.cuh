// Device-side element types and their conversions to and from fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dispatch.h"

namespace llmk::detail {

template <class Tag> struct DeviceType;
template <> struct DeviceType<DTypeTag<DType::f32>> { using type = float; };
template <> struct DeviceType<DTypeTag<DType::f16>> { using type = __half; };
template <> struct DeviceType<DTypeTag<DType::bf16>> { using type = __nv_bfloat16; };
template <class Tag> using device_type_t = typename DeviceType<Tag>::type;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace llmk::detail
