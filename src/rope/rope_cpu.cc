// CPU reference of RoPE, in place or out of place: double math, one rounding per element.
// The oracle of the GPU tests and the host backend. Positions are range-checked by the
// caller (rope_api.cc).
#include <cmath>
#include <vector>

#include "common/host_types.h"
#include "common/rope_host.h"
#include "rope/rope_params.h"

namespace llmk::detail {

namespace {

int64_t position(const RopeParams& p, int64_t b, int64_t s) {
  const int64_t i = b * p.positions_batch_stride + s;
  return p.positions_i64 ? static_cast<const int64_t*>(p.positions)[i]
                         : static_cast<const int32_t*>(p.positions)[i];
}

// Each head of t at (b, s): rotated from in to out, elements [rot_dim, rot_dim + tail)
// copied (in place: out is in, tail 0).
template <class T>
void rotate_heads(const RopeParams& p, const RopeTensor& t, RopeStyle style, int64_t b,
                  int64_t s, const std::vector<double>& cos_v, const std::vector<double>& sin_v) {
  for (int h = 0; h < t.heads; ++h) {
    const T* x = static_cast<const T*>(t.in) + b * t.in_strides.batch + s * t.in_strides.seq +
                 h * t.in_strides.head;
    T* y = static_cast<T*>(t.out) + b * t.out_strides.batch + s * t.out_strides.seq +
           h * t.out_strides.head;
    rope_rotate_host<T>(x, y, p.rot_dim, style, cos_v.data(), sin_v.data());
    for (int c = p.rot_dim; c < p.rot_dim + p.tail; ++c) y[c] = x[c];
  }
}

template <class T>
void rope_tokens(const RopeParams& p, RopeStyle style) {
  const int half = p.rot_dim / 2;
  std::vector<double> cos_v(half), sin_v(half);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t pos = position(p, b, s);
      for (int i = 0; i < half; ++i) {
        if (p.cache) {
          cos_v[i] = p.cache[pos * p.rot_dim + i];
          sin_v[i] = p.cache[pos * p.rot_dim + half + i];
        } else {
          const double angle = static_cast<double>(pos) * rope_inv_freq(p.theta, i, p.rot_dim);
          cos_v[i] = std::cos(angle);
          sin_v[i] = std::sin(angle);
        }
        sin_v[i] *= p.sin_sign;
      }
      rotate_heads<T>(p, p.q, style, b, s, cos_v, sin_v);
      rotate_heads<T>(p, p.k, style, b, s, cos_v, sin_v);
    }
}

}  // namespace

void rope_cpu(const RopeParams& p, RopeStyle style, DType dtype) {
  dispatch_dtype(dtype, "rope", [&](auto tag) { rope_tokens<host_type_t<decltype(tag)>>(p, style); });
}

}  // namespace llmk::detail
