// The attention head dims: the one list from which every other answer derives (the
// kernels' instantiations, CMake's LLMK_HEAD_DIMS check, which reads kHeadDims below, the
// supported-head-dims functions of the C++ and Python APIs, and the error messages).
//
// kHeadDims: what attention and its backward accept (the CPU reference computes all);
// the Hopper kernels and decode take the ones from 64 on (head dim 32's rows are half a
// 128-byte swizzle chunk). LLMK_HEAD_DIM_BITS (set by CMake from LLMK_HEAD_DIMS) has bit i
// set when the CUDA kernels of kHeadDims[i] are built; every path obeys it.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmk/error.h"

#ifndef LLMK_HEAD_DIM_BITS
#define LLMK_HEAD_DIM_BITS 31
#endif

namespace llmk::detail {

inline constexpr int kHeadDims[] = {32, 64, 96, 128, 256};
inline constexpr int kHeadDimCount = static_cast<int>(sizeof(kHeadDims) / sizeof(kHeadDims[0]));
inline constexpr int kSm90MinHeadDim = 64;  // the Hopper attention kernels and decode

// head_dim's place in kHeadDims, -1 when it is not there.
constexpr int head_dim_index(int64_t head_dim) {
  for (int i = 0; i < kHeadDimCount; ++i)
    if (kHeadDims[i] == head_dim) return i;
  return -1;
}

constexpr bool head_dim_supported(int64_t head_dim) { return head_dim_index(head_dim) >= 0; }

// Whether this build compiled the CUDA kernels of `head_dim` (LLMK_HEAD_DIMS).
constexpr bool head_dim_compiled(int64_t head_dim) {
  return head_dim_supported(head_dim) && ((LLMK_HEAD_DIM_BITS >> head_dim_index(head_dim)) & 1);
}

// The head dims of the Hopper forward and backward and of decode, before LLMK_HEAD_DIMS.
constexpr bool head_dim_from_64(int64_t head_dim) {
  return head_dim_supported(head_dim) && head_dim >= kSm90MinHeadDim;
}

// The Hopper attention kernels' head dims as far as this build compiled them.
constexpr bool attention_sm90_head_dim(int64_t head_dim) {
  return head_dim_from_64(head_dim) && head_dim_compiled(head_dim);
}

// The smallest head dim the Hopper attention kernels take in this build (0: none), whose
// kernel answers whether a device runs the build's sm_90a code.
constexpr int first_sm90_head_dim() {
  for (int d : kHeadDims)
    if (attention_sm90_head_dim(d)) return d;
  return 0;
}

// The head dims of kHeadDims for which pred(d) holds.
template <class Pred>
std::vector<int64_t> head_dims_where(Pred&& pred) {
  std::vector<int64_t> dims;
  for (int d : kHeadDims)
    if (pred(d)) dims.push_back(d);
  return dims;
}

// "64, 96, 128 and 256": the list in an error message.
inline std::string head_dim_words(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += i + 1 == dims.size() ? " and " : ", ";
    s += std::to_string(dims[i]);
  }
  return s;
}

// Calls f(std::integral_constant<int, head_dim>) for a head dim this build compiled; throws
// for one LLMK_HEAD_DIMS left out ("has no CUDA kernel in this build") or one not supported.
// Only the compiled head dims instantiate f.
template <class One, size_t... I>
void for_each_head_dim(One&& one, std::index_sequence<I...>) {
  (one(std::integral_constant<int, kHeadDims[I]>{}), ...);
}

template <class F>
void for_compiled_head_dim(const char* op, int head_dim, F&& f) {
  bool found = false;
  auto one = [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    if (kDim != head_dim) return;
    found = true;
    if constexpr (head_dim_compiled(kDim)) f(dim);
    else throw_error(op, ": head_dim ", kDim, " has no CUDA kernel in this build");
  };
  for_each_head_dim(one, std::make_index_sequence<kHeadDimCount>{});
  LLMK_CHECK(found, op, ": head_dim ", head_dim, " is not supported");
}

}  // namespace llmk::detail
