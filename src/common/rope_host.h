// The rotation of one head vector in the CPU references (RoPE's, and the decode attention's
// rotated q and appended k): double math, one rounding per element. Sharing it keeps the
// decode attention's append + rotary identical to rope_ followed by the write.
#pragma once

#include "common/host_types.h"
#include "llmk/rope.h"

namespace llmk::detail {

// Element index of pair i's two members within a head: NeoX (i, i + half), GPT-J (2i, 2i + 1).
inline void rope_pair_index(RopeStyle style, int i, int half, int* i1, int* i2) {
  *i1 = style == RopeStyle::neox ? i : 2 * i;
  *i2 = style == RopeStyle::neox ? i + half : 2 * i + 1;
}

// Writes to y[0:rot_dim] x[0:rot_dim] of one head rotated by the angles whose cos and sin
// are cos_v[0:rot_dim / 2], sin_v[0:rot_dim / 2]: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1
// sin). y may be x (in place).
template <class T>
void rope_rotate_host(const T* x, T* y, int rot_dim, RopeStyle style, const double* cos_v,
                      const double* sin_v) {
  const int half = rot_dim / 2;
  for (int i = 0; i < half; ++i) {
    int i1, i2;
    rope_pair_index(style, i, half, &i1, &i2);
    const double x1 = to_float(x[i1]), x2 = to_float(x[i2]);
    y[i1] = from_float<T>(static_cast<float>(x1 * cos_v[i] - x2 * sin_v[i]));
    y[i2] = from_float<T>(static_cast<float>(x2 * cos_v[i] + x1 * sin_v[i]));
  }
}

template <class T>
void rope_rotate_host(T* x, int rot_dim, RopeStyle style, const double* cos_v, const double* sin_v) {
  rope_rotate_host<T>(x, x, rot_dim, style, cos_v, sin_v);
}

}  // namespace llmk::detail
