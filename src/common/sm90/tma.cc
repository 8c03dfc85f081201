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

CUtensorMap make_tma_2d(const char* op, const Tma2dShape& s) {
  LLMK_CHECK(s.dtype == DType::f16 || s.dtype == DType::bf16, op, ": TMA maps are built for 16-bit types here");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {s.cols, s.rows};
  const cuuint64_t strides[1] = {s.row_stride * 2};  // bytes, of dim 1
  const cuuint32_t box[2] = {s.box_cols, s.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUtensorMapDataType type =
      s.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode_tiled(op)(&map, type, 2, const_cast<void*>(s.base), dims, strides, box, element_strides,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LLMK_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for a [",
             s.rows, ", ", s.cols, "] matrix with row stride ", s.row_stride, " and a ", s.box_rows, " x ",
             s.box_cols, " box");
  return map;
}

}  // namespace llmk::detail::sm90
