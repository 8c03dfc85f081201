// Persistent tile scheduler: a grid of (at most) one block per SM walks the output tiles
// t = blockIdx.x, blockIdx.x + gridDim.x, ... in a grouped raster order that keeps the
// operands of concurrently running tiles in L2: tiles are taken `group` tile-rows at a
// time, column by column, so one wave of ~132 tiles touches `group` row-panels of A and
// ~132 / group column-panels of B instead of one row-panel and all of B.
// Host and device code (the host tests check it is a bijection).
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace llmk::detail::sm90 {

struct TileCoord {
  int64_t row, col;  // tile indices along M and N
};

struct GroupedRaster {
  int64_t tiles_m, tiles_n;
  int64_t group;  // tile-rows per group, >= 1

  LLMK_HOST_DEVICE int64_t tiles() const { return tiles_m * tiles_n; }

  LLMK_HOST_DEVICE TileCoord at(int64_t t) const {
    const int64_t per_group = group * tiles_n;
    const int64_t first_row = (t / per_group) * group;
    const int64_t rows = tiles_m - first_row < group ? tiles_m - first_row : group;  // last group may be short
    const int64_t in_group = t - (t / per_group) * per_group;
    return {first_row + in_group % rows, in_group / rows};
  }
};

}  // namespace llmk::detail::sm90
