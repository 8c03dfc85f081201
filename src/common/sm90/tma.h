// TMA tensor maps (host side): the 128-byte descriptor that cp.async.bulk.tensor reads to
// copy a 2-d box between global and shared memory. Built by the driver's
// cuTensorMapEncodeTiled, reached through cudaGetDriverEntryPointByVersion so that llmk
// does not link libcuda.
//
// A 2-d map describes a row-major matrix of `rows` rows of `cols` elements, rows
// `row_stride` elements apart, copied in boxes of box_rows x box_cols elements. With the
// 128-byte swizzle (the layout wgmma reads without bank conflicts) a box row is at most
// 128 bytes (64 16-bit elements) and the box lands in shared memory as box_rows rows of
// 128 bytes whose 16-byte chunks are permuted by XOR with (row % 8): shared address bits
// [4, 7) ^= bits [7, 10), so the destination must be 1024-byte aligned. Out-of-bounds
// elements read as zero and are not written by a store.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "llmk/dtype.h"

namespace llmk::detail::sm90 {

struct Tma2dShape {
  const void* base;    // 16-byte aligned
  DType dtype;         // a 16-bit float type
  uint64_t rows, cols;
  uint64_t row_stride;  // elements; row_stride * element size a multiple of 16
  uint32_t box_rows;    // <= 256
  uint32_t box_cols;    // box_cols * element size <= 128
};

// A map of rank 1..5 (dims innermost first, the innermost contiguous): strides[i] of dim
// i >= 1 in elements (a multiple of 16 bytes; any value for a dim of size 1), box[i]
// elements per copy (box[0] * element size <= 128, box[i] <= 256).
struct TmaShape {
  const void* base;
  DType dtype;  // float16, bfloat16 or float32
  int rank;
  uint64_t dims[5];
  uint64_t strides[5];
  uint32_t box[5];
  bool swizzle = true;  // false: the box lands row-major, unpermuted (16-byte alignment)
};

CUtensorMap make_tma(const char* op, const TmaShape& shape);

// Encodes the map, 128-byte swizzle, for the current device's context (it must exist:
// any runtime call that touched the device, such as allocating `base`); throws llmk::Error naming `op` if the driver rejects it.
CUtensorMap make_tma_2d(const char* op, const Tma2dShape& shape);

}  // namespace llmk::detail::sm90
