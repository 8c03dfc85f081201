// TMA maps over attention tensors (sm90/maps.h).
#include "attention/sm90/maps.h"

#include "common/sm90/tma.h"

namespace llmk::detail {

bool attention_tma_ok(const AttentionTensor& t, bool varlen) {
  const auto aligned = [](int64_t stride) { return (stride * 2) % 16 == 0; };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && aligned(t.row_stride) && aligned(t.head_stride) &&
         (varlen || aligned(t.batch_stride));
}

CUtensorMap attention_tma_map(const AttentionTensor& t, DType dtype, int head_dim, int heads, int64_t rows, int batch,
                              uint32_t box_rows) {
  sm90::TmaShape s{};
  s.base = t.data;
  s.dtype = dtype;
  s.rank = 4;
  s.dims[0] = static_cast<uint64_t>(head_dim);
  s.dims[1] = static_cast<uint64_t>(rows);
  s.dims[2] = static_cast<uint64_t>(heads);
  s.dims[3] = static_cast<uint64_t>(batch);
  s.strides[1] = static_cast<uint64_t>(t.row_stride);
  s.strides[2] = static_cast<uint64_t>(t.head_stride);
  s.strides[3] = static_cast<uint64_t>(t.batch_stride);
  s.box[0] = 64;
  s.box[1] = box_rows;
  s.box[2] = 1;
  s.box[3] = 1;
  return sm90::make_tma("attention", s);
}

}  // namespace llmk::detail
