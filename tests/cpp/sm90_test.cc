// Tests of the shared Hopper pieces that can be tested alone: the persistent tile
// scheduler's raster order (host code) and TMA map creation (needs a CUDA driver).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <set>
#include <utility>

#include "common/sm90/tile_scheduler.h"
#include "common/sm90/tma.h"
#include "test_util.h"

namespace llmk::detail::sm90 {
namespace {

// Every tile is visited exactly once, whatever the group and the grid shape.
TEST(GroupedRaster, VisitsEveryTileOnce) {
  for (int64_t tm : {1, 2, 7, 8, 9, 64}) {
    for (int64_t tn : {1, 3, 16, 33}) {
      for (int64_t group : {1, 4, 8, 16}) {
        const GroupedRaster r{tm, tn, group};
        std::set<std::pair<int64_t, int64_t>> seen;
        for (int64_t t = 0; t < r.tiles(); ++t) {
          const TileCoord c = r.at(t);
          ASSERT_GE(c.row, 0);
          ASSERT_LT(c.row, tm);
          ASSERT_GE(c.col, 0);
          ASSERT_LT(c.col, tn);
          seen.insert({c.row, c.col});
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), r.tiles()) << tm << "x" << tn << " group " << group;
      }
    }
  }
}

// Consecutive tiles stay within `group` tile-rows: the first group * tn tiles cover rows
// [0, group) only, column by column.
TEST(GroupedRaster, GroupsRowsColumnByColumn) {
  const GroupedRaster r{20, 5, 8};
  for (int64_t t = 0; t < 8 * 5; ++t) {
    EXPECT_LT(r.at(t).row, 8);
    EXPECT_EQ(r.at(t).col, t / 8);
  }
  // The last group has 20 - 16 = 4 rows.
  EXPECT_EQ(r.at(16 * 5).row, 16);
  EXPECT_EQ(r.at(16 * 5 + 4).col, 1);
}

TEST(Tma2d, EncodesAndRejectsWithTheOpName) {
  LLMK_REQUIRE_GPU();
  // The driver encodes maps for the current context: device memory creates it.
  void* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, 64 * 64 * 2), cudaSuccess);
  const Tma2dShape ok{data, DType::bf16, 64, 64, 64, 64, 64};
  const CUtensorMap map = make_tma_2d("test_op", ok);
  (void)map;
  // A row stride that is not a multiple of 16 bytes.
  const Tma2dShape bad{data, DType::bf16, 64, 63, 63, 64, 64};
  try {
    (void)make_tma_2d("test_op", bad);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("test_op"), std::string::npos) << e.what();
  }
  cudaFree(data);
}

}  // namespace
}  // namespace llmk::detail::sm90
