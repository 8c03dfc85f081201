// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
#include "common/sm90/tma.h"

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "llmk/error.h"

namespace llmk::detail::sm90 {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled(const char* op) {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &status);
    return (err == cudaSuccess && status == cudaDriverEntryPointSuccess) ? reinterpret_cast<EncodeTiled>(p)
                                                                         : nullptr;
  }();
  LLMK_CHECK(fn != nullptr, op, ": the CUDA driver has no cuTensorMapEncodeTiled (driver older than CUDA 12?)");
  return fn;
}

}  // namespace

CUtensorMap make_tma(const char* op, const TmaShape& s) {
  LLMK_CHECK(s.dtype == DType::f16 || s.dtype == DType::bf16 || s.dtype == DType::f32, op,
             ": TMA maps are built for float16, bfloat16 and float32 here");
  const uint64_t element = s.dtype == DType::f32 ? 4 : 2;
  LLMK_CHECK(s.rank >= 1 && s.rank <= 5, op, ": a TMA map has rank 1 to 5, got ", s.rank);
  CUtensorMap map{};
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], element_strides[5];
  for (int i = 0; i < s.rank; ++i) {
    dims[i] = s.dims[i];
    box[i] = s.box[i];
    element_strides[i] = 1;
    // A dim of size 1 is never stepped over: any 16-byte multiple is a valid stride.
    if (i > 0) strides[i - 1] = s.dims[i] == 1 ? 16 : s.strides[i] * element;
  }
  const CUtensorMapDataType type = s.dtype == DType::f32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : s.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode_tiled(op)(&map, type, static_cast<cuuint32_t>(s.rank), const_cast<void*>(s.base), dims,
                                      strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      s.swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LLMK_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for a rank-",
             s.rank, " map of [", s.dims[s.rank - 1], " ... ", s.dims[0], "] elements with a ", s.box[1], " x ",
             s.box[0], " box");
  return map;
}

CUtensorMap make_tma_2d(const char* op, const Tma2dShape& s) {
  return make_tma(op, TmaShape{s.base, s.dtype, 2, {s.cols, s.rows}, {1, s.row_stride}, {s.box_cols, s.box_rows}});
}

}  // namespace llmk::detail::sm90
