// Tests of the shared Hopper pieces that can be tested alone: the persistent tile
// scheduler's raster order and the attention forward's schedule (host code), and TMA map
// creation (needs a CUDA driver).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/sm90/schedule.h"
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

// The attention forward's units over a call: how often each (query block, head, batch) is
// visited, and each unit's key blocks (128-key blocks of a `block_m`-row tile, causal when
// asked).
struct ScheduleVisit {
  std::map<std::tuple<int, int, int>, int> visits;
  std::vector<std::pair<int, int64_t>> unit_work;  // (batch, key blocks) per unit with a tile
};

ScheduleVisit walk_schedule(const detail::AttentionParams& p, bool causal, int block_m = 128) {
  const int m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  const AttentionSchedule s = attention_schedule(m_blocks, block_m, p.heads_q, p.batch, causal);
  ScheduleVisit v;
  for (int64_t u = 0; u < s.units; ++u) {
    const AttentionUnit unit = attention_unit(p, s, u);
    int64_t work = 0;
    for (int t = 0; t < unit.count; ++t) {
      const AttentionTileCoord c = unit.tile(t);
      ++v.visits[{c.m_block, c.head, c.batch}];
      const detail::SequenceBounds seq = detail::sequence_bounds(p, c.batch);
      work += (detail::visible_keys(seq, causal, int64_t{c.m_block} * block_m + block_m - 1) + 127) / 128;
    }
    if (unit.count > 0) v.unit_work.push_back({unit.batch, work});
  }
  return v;
}

// Dense calls: every tile exactly once; causal pairs carry m_blocks + 1 key blocks each
// (the middle block of an odd count, a unit alone, (m_blocks + 1) / 2).
TEST(AttentionSchedule, DenseVisitsEveryTileOnceInEqualUnits) {
  for (int m_blocks : {1, 2, 3, 4, 7, 8}) {
    for (int heads : {1, 3}) {
      for (int batch : {1, 2}) {
        for (bool causal : {false, true}) {
          SCOPED_TRACE(testing::Message() << m_blocks << " query blocks, " << heads << " heads, batch " << batch
                                          << (causal ? ", causal" : ""));
          detail::AttentionParams p;
          p.heads_q = heads;
          p.batch = batch;
          p.seqlen_q = p.seqlen_k = m_blocks * 128 - 5;
          const ScheduleVisit v = walk_schedule(p, causal);
          EXPECT_EQ(static_cast<int>(v.visits.size()), m_blocks * heads * batch);
          for (const auto& [tile, count] : v.visits) {
            EXPECT_LT(std::get<0>(tile), m_blocks);
            EXPECT_EQ(count, 1);
          }
          if (!causal) continue;
          int halves = 0;
          for (const auto& [b, work] : v.unit_work) {
            if (work == m_blocks + 1) continue;
            EXPECT_EQ(2 * work, m_blocks + 1) << "a unit that is neither a full pair nor the middle block";
            ++halves;
          }
          EXPECT_EQ(halves, m_blocks % 2 ? heads * batch : 0);
        }
      }
    }
  }
}

// The head dim 64 kernel's 192-row tiles (3 consumers) over 128-key blocks: every tile
// exactly once; causal pairs within one key block of each other (a tile sees
// ceil(1.5 (i + 1)) key blocks).
TEST(AttentionSchedule, RowsOf192VisitEveryTileOnceInNearlyEqualPairs) {
  for (int m_blocks : {1, 2, 3, 6, 43}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << m_blocks << " query blocks" << (causal ? ", causal" : ""));
      detail::AttentionParams p;
      p.heads_q = 2;
      p.batch = 1;
      p.seqlen_q = p.seqlen_k = m_blocks * 192 - 5;
      const ScheduleVisit v = walk_schedule(p, causal, 192);
      EXPECT_EQ(static_cast<int>(v.visits.size()), m_blocks * 2);
      for (const auto& [tile, count] : v.visits) EXPECT_EQ(count, 1);
      if (!causal) continue;
      int64_t least = INT64_MAX, most = 0;
      for (const auto& [b, work] : v.unit_work) {
        // The middle block of an odd count, alone: half a pair.
        if (8 * work < 9 * (m_blocks + 1)) continue;
        least = std::min(least, work);
        most = std::max(most, work);
      }
      EXPECT_LE(most - least, 1);
    }
  }
}

// Varlen causal calls pair each sequence's own query blocks: every tile that holds rows of
// its sequence exactly once, none past its end, equal pairs within a sequence. Without a
// causal mask the units are the longest sequence's tiles (the kernel skips empty ones).
TEST(AttentionSchedule, VarlenPairsWithinEachSequence) {
  const std::vector<int32_t> cu = {0, 300, 301, 301, 558, 648, 1048};  // 300, 1, 0, 257, 90, 400
  detail::AttentionParams p;
  p.heads_q = 2;
  p.batch = static_cast<int>(cu.size()) - 1;
  p.seqlen_q = p.seqlen_k = 400;
  p.cu_seqlens_q = p.cu_seqlens_k = cu.data();
  p.total_q = p.total_k = cu.back();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const ScheduleVisit v = walk_schedule(p, causal);
    int expected = 0;
    for (int b = 0; b < p.batch; ++b) {
      const int own = (cu[b + 1] - cu[b] + 127) / 128;
      for (int h = 0; h < p.heads_q; ++h)
        for (int m = 0; m < 4; ++m) {
          const auto it = v.visits.find({m, h, b});
          const int count = it == v.visits.end() ? 0 : it->second;
          const bool has_rows = m < own;
          EXPECT_EQ(count, has_rows || !causal ? 1 : 0) << "block " << m << " head " << h << " sequence " << b;
          expected += count;
        }
    }
    EXPECT_EQ(static_cast<int>(v.visits.size()), expected);
    if (!causal) continue;
    for (const auto& [b, work] : v.unit_work) {
      const int own = (cu[b + 1] - cu[b] + 127) / 128;
      EXPECT_TRUE(work == own + 1 || 2 * work == own + 1) << "sequence " << b << ": a unit of " << work << " key blocks";
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
