// Launcher of the RoPE kernel (in place and out of place alike): the block shape and the
// dispatch over dtype, vector width, style and the source of the angles, the family's one
// instantiation list (3 dtypes x 2 widths x 2 styles x 2 sources).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/pdl_launch.h"
#include "rope/rope_kernel.cuh"

namespace llmk::detail {

namespace {

// x: the pair chunks of one head, then out of place a thread per two vectors of its tail
// (at most 1024 in all: head_dim <= 2048); y: head lanes, as many as keep each lane's share
// of the heads even (40 heads over at most 32 lanes: 20 lanes of 2 heads, not 8 of 2 and
// 24 of 1); z: tokens, filling the block to about 256 threads (at most 64, blockDim.z's
// limit).
dim3 rope_block(int x, int heads, int64_t tokens) {
  const int max_lanes = std::max(1, 256 / x);
  const int per_lane = (heads + max_lanes - 1) / max_lanes;
  const int lanes = (heads + per_lane - 1) / per_lane;
  const int64_t z = std::min<int64_t>({std::max(1, 256 / (x * lanes)), tokens, 64});
  return dim3(x, lanes, static_cast<unsigned>(z));
}

}  // namespace

void rope_cuda(const RopeParams& p, RopeStyle style, DType dtype, bool vector_ok,
               cudaStream_t stream) {
  const char* op = "rope_kernel";
  dispatch_dtype(dtype, op, [&](auto tag) {
    using T = device_type_t<decltype(tag)>;
    auto launch = [&](auto width, auto style_constant, auto cache_constant) {
      constexpr int P = decltype(width)::value;
      const int64_t tokens = p.batch * p.seq;
      const int threads_x = p.rot_dim / 2 / P + (p.tail + 2 * P - 1) / (2 * P);
      const dim3 block = rope_block(threads_x, p.q.heads + p.k.heads, tokens);
      const int64_t blocks = (tokens + block.z - 1) / block.z;
      LLMK_CHECK(blocks <= INT32_MAX, "rope: ", tokens, " tokens are more than one launch covers");
      const dim3 grid(static_cast<unsigned>(blocks));
      const size_t smem = p.cache ? 0 : sizeof(float2) * block.z * (p.rot_dim / 2);
      launch_pdl(rope_kernel<T, P, decltype(style_constant)::value, decltype(cache_constant)::value>, grid,
                 block, smem, stream, p);
    };
    auto with_source = [&](auto width, auto style_constant) {
      if (p.cache) launch(width, style_constant, std::true_type{});
      else launch(width, style_constant, std::false_type{});
    };
    auto with_style = [&](auto width) {
      if (style == RopeStyle::neox)
        with_source(width, std::integral_constant<RopeStyle, RopeStyle::neox>{});
      else
        with_source(width, std::integral_constant<RopeStyle, RopeStyle::gptj>{});
    };
    if (vector_ok) with_style(std::integral_constant<int, kVec16<T>>{});
    else with_style(std::integral_constant<int, 1>{});
  });
  LLMK_CHECK_LAUNCH(op, stream);
}

}  // namespace llmk::detail
