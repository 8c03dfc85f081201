// Element types llmk kernels read and write.
#pragma once

#include <cstdint>

namespace llmk {

enum class DType : int32_t {
  f32,
  f16,
  bf16,
  i32,  // indices (RoPE positions)
  i64,
  f8e4m3,  // float8 e4m3 ("fn": no infinities, max 448), KV caches with float scales
  u8,      // quantized weights' zero points
};

inline int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f8e4m3: return 1;
    case DType::u8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::f8e4m3: return "float8_e4m3fn";
    case DType::u8: return "uint8";
  }
  return "unknown";
}

}  // namespace llmk
