// Vectors of N elements that load and store as one access: 16 bytes when N * sizeof(T)
// is 16 (the widest global access a thread can issue), or N scalar accesses when N = 1.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"

namespace llmk::detail {

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

// Hides a vector's value from the optimizer, so that values converted from it before this
// point are not kept live after it: a kernel that holds a row in registers converts it to
// fp32 twice (once per pass) instead of holding twice the registers as fp32.
template <class T, int N>
__device__ __forceinline__ void opaque(Vec<T, N>& value) {
  static_assert(sizeof(Vec<T, N>) % 4 == 0, "opaque works on whole 32-bit words");
  uint32_t* words = reinterpret_cast<uint32_t*>(&value);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Vec<T, N>) / 4); ++k) asm volatile("" : "+r"(words[k]));
}

template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& value) {
  *reinterpret_cast<Vec<T, N>*>(p) = value;
}

}  // namespace llmk::detail
