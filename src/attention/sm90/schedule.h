// The persistent schedule of the Hopper attention forward (sm90/forward_kernel.cuh):
// which tiles of block_m query rows (128, or 192 at head dim 64 except causal calls below
// 8192 query rows) a block walks. Host and device code (tests/cpp/sm90_test.cc checks it on
// the host).
//
// Block b takes the work units b, b + gridDim.x, ... A unit is one tile (one query block of
// one (batch, head)) without a causal mask, where tiles cost the same; with one, the pair of
// query blocks i and mb - 1 - i of one (batch, head), mb its sequence's query blocks (varlen:
// that sequence's own), whose key blocks add up to the same count for every i (seqlen_q =
// seqlen_k and block_m = 128; within one 128-key block of each other for 192-row tiles; the
// middle block of an odd mb is a unit alone, half the work). A static stride over equal
// units stays balanced while the producer loads a tile's Q and first keys during the one
// before. A (batch, head)'s units are consecutive: the blocks running at once share its K
// and V in L2.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "common/host_device.h"

namespace llmk::detail::sm90 {

struct AttentionSchedule {
  int m_blocks;        // query blocks of the longest sequence
  int block_m;         // query rows per tile
  int units_per_head;  // m_blocks, or (m_blocks + 1) / 2 pairs
  bool paired;
  int64_t units;
};

inline AttentionSchedule attention_schedule(int m_blocks, int block_m, int heads_q, int batch, bool causal) {
  const int units_per_head = causal ? (m_blocks + 1) / 2 : m_blocks;
  return {m_blocks, block_m, units_per_head, causal, static_cast<int64_t>(units_per_head) * heads_q * batch};
}

struct AttentionTileCoord {
  int m_block, head, batch;
};

// A unit's tiles, longest first: `count` of them (0-2).
struct AttentionUnit {
  int count, longer, shorter, head, batch;  // longer, shorter: query block indices

  LLMK_HOST_DEVICE AttentionTileCoord tile(int t) const { return {t == 0 ? longer : shorter, head, batch}; }
};

LLMK_HOST_DEVICE inline AttentionUnit attention_unit(const AttentionParams& p, const AttentionSchedule& s, int64_t u) {
  const int64_t hb = u / s.units_per_head;
  const int i = static_cast<int>(u - hb * s.units_per_head);
  const int head = static_cast<int>(hb % p.heads_q), batch = static_cast<int>(hb / p.heads_q);
  if (!s.paired) return {1, s.m_blocks - 1 - i, i, head, batch};
  int mb = s.m_blocks;
  if (p.cu_seqlens_q) mb = (sequence_bounds(p, batch).seqlen_q + s.block_m - 1) / s.block_m;
  return {2 * i + 1 < mb ? 2 : 2 * i + 1 == mb ? 1 : 0, mb - 1 - i, i, head, batch};
}

}  // namespace llmk::detail::sm90
