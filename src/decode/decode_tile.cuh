// The shape of a decode attention kernel (DecodeTile: warps, keys per stage, ring depth,
// shared memory) and the rules that pick it: which fp8 tiles convert in registers, which
// tiles have machine code for sm_8x. Read by the kernel (attention_decode_kernel.cuh) and
// the launcher (attention_decode.cu).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/sm80/attention_tiles.cuh"

namespace llmk::detail {

// The element of an fp8 (e4m3) cache on the device.
struct Fp8E4M3 {
  uint8_t bits;
};

constexpr int decode_max(int a, int b) { return a > b ? a : b; }
constexpr int decode_clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Whether an fp8 cache's K and V are converted in registers straight into the mma fragments
// (decode_scores_fp8, decode_accumulate_pv_fp8), with no converted copy in shared memory: at
// head dims that are multiples of 64, but for the 64-row tile at head dim 64 (whose 128
// accumulators left the register path spilling). Head dim 96 and that tile convert in shared
// memory. (The launcher sizes the shared-memory budget by it too.)
constexpr bool decode_fp8_in_registers(int head_dim, int mtiles) {
  return head_dim % 64 == 0 && !(head_dim == 64 && mtiles == 4);
}

// The shape of one decode kernel: q's element type T, the cache's element type Cache (T
// or Fp8E4M3), the head dim, kMTiles 16-row query tiles per block, and the shared-memory
// budget of one block (two blocks per SM at 110 KB, one at 220 KB, three at 75 KB) that sets
// the ring depth. kVariants_: the score variants (window, softcap, sinks) compiled in; the
// kernels of plain calls carry none of their instructions (16-row tiles only).
template <class T, class Cache_, int kHeadDim_, int kMTiles_, int kSmemBudget, bool kVariants_ = false>
struct DecodeTile {
  using Cache = Cache_;
  static constexpr int kHeadDim = kHeadDim_, kMTiles = kMTiles_;
  static constexpr bool kVariants = kVariants_;
  static_assert(!kVariants || kMTiles == 1, "the score variants are compiled into the 16-row tiles only");
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = 16, kBlockN = kWarps * kWarpKeys;
  static constexpr int kRows = 16 * kMTiles;
  static constexpr bool kFp8 = std::is_same_v<Cache, Fp8E4M3>;
  static constexpr bool kRegisterFp8 = kFp8 && decode_fp8_in_registers(kHeadDim_, kMTiles_);
  // A 16-row tile up to head dim 128 (a cache like q's, or fp8 on the register path) holds
  // its Q fragments in registers for the whole pass (D / 4 of them) instead of reading them
  // from shared memory every stage.
  static constexpr bool kQInRegisters = (kRegisterFp8 || !kFp8) && kMTiles_ == 1 && kHeadDim_ <= 128;
  // The per-warp mma tile: all kRows rows against the warp's 16 keys.
  using WarpTile = ForwardTile<kHeadDim, kRows, kWarpKeys, 1>;
  static constexpr int kPitch = WarpTile::kPitch;  // T elements per Q / converted row (+16 bytes)
  static constexpr int kCacheRowBytes = kHeadDim * static_cast<int>(sizeof(Cache));
  static constexpr int kStageRowBytes = kCacheRowBytes + 16;
  static constexpr int kStageBytes = 2 * kBlockN * kStageRowBytes;  // K rows, then V rows
  static constexpr int kConvertBytes =
      kFp8 && !kRegisterFp8 ? kWarps * 2 * kWarpKeys * kPitch * static_cast<int>(sizeof(T)) : 0;
  static constexpr int kQBytes = kRows * kPitch * static_cast<int>(sizeof(T));
  static constexpr int kStages = decode_clamp((kSmemBudget - kQBytes - kConvertBytes) / kStageBytes, 2, 4);
  static constexpr int kMergePitch = kHeadDim + 8;  // floats per row of a warp's O
  static constexpr int kMergeBytes = kWarps * kRows * kMergePitch * 4;
  static constexpr int kSmemBytes = kQBytes + decode_max(kStages * kStageBytes + kConvertBytes, kMergeBytes);
  static constexpr int kCacheChunks = kCacheRowBytes / 16;  // 16-byte pieces of a cache row
  // Blocks per SM asked of ptxas: three where the budget allows them (it then keeps the
  // registers at 170), else one (up to 255 registers; two blocks still fit).
  static constexpr int kMinBlocks = kSmemBudget * 3 <= 228 * 1024 ? 3 : 1;
  static_assert((kBlockN * kCacheChunks) % kThreads == 0 && kHeadDim % 32 == 0);
  // Three blocks per SM still fit with the kernel's static shared memory (s_max, s_sum,
  // s_lse) and the 1 KB the SM reserves per block (228 KB per SM on sm_90).
  static_assert(kMinBlocks != 3 || 3 * (kSmemBytes + (2 * kWarps + 1) * kRows * 4 + 1024) <= 228 * 1024,
                "three blocks of this tile no longer fit an SM");
};

// The most dynamic shared memory an sm_8x GPU gives a block (A100's opt-in limit; sm_86 and
// sm_89 give 99 KB). A tile above it (head dim 256, one block per SM) has machine code for
// sm_90 alone: its sm_80 body is empty (the compile of that pass shrinks by the kernel),
// and the launcher rejects it where the code that would run was compiled for sm_8x.
inline constexpr int kSm80MaxSmemPerBlock = 163 * 1024;

template <class Tile>
__host__ __device__ constexpr bool decode_tile_compiled_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return Tile::kSmemBytes <= kSm80MaxSmemPerBlock;
#else
  return true;
#endif
}

}  // namespace llmk::detail
