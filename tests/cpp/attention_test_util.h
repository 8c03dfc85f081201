// Helpers shared by the attention forward and backward tests: the LLMK_ATTENTION_PATH
// scope and the per-path runner, [batch, seq, heads, dim] views over NaN-poisoned storage
// (strided, transposed, fused qkv slices), the lse buffers and the case descriptions.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace llmk::test {

inline constexpr DType kDTypes[] = {DType::f16, DType::bf16};
inline constexpr int64_t kHeadDims[] = {32, 64, 96, 128, 256};

inline double eps_of(DType dt) { return dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }

inline bool contains(const std::string& text, const char* needle) { return text.find(needle) != std::string::npos; }

// ---------------------------------------------------------------------------------------
// The forward paths: LLMK_ATTENTION_PATH, read by the library on every call.

inline constexpr const char* kPathVariable = "LLMK_ATTENTION_PATH";
inline constexpr const char* kPaths[] = {"sm80", "sm90", "auto"};

// Sets LLMK_ATTENTION_PATH for its scope; restores the previous value (or unsets it) after.
class PathScope {
 public:
  explicit PathScope(const char* path) {
    if (const char* previous = std::getenv(kPathVariable)) previous_ = previous;
    setenv(kPathVariable, path, 1);
  }
  ~PathScope() {
    if (previous_) setenv(kPathVariable, previous_->c_str(), 1);
    else unsetenv(kPathVariable);
  }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  std::optional<std::string> previous_;
};

inline bool build_has_sm90a() {
  std::stringstream archs(build_cuda_archs());
  for (std::string arch; std::getline(archs, arch, ';');)
    if (arch.rfind("90a", 0) == 0) return true;
  return false;
}

// A call the Hopper kernel must take (on device 0, where the tests run): an sm_90 device,
// an sm_90a build and head dim 64, 96, 128 or 256 (as far as LLMK_HEAD_DIMS builds them).
// fp16/bf16 and 16-byte aligned strides and data hold for every call of these tests.
inline bool sm90_must_take(int64_t head_dim) {
  static const DeviceInfo info = device_info(0);
  static const bool sm90a = build_has_sm90a();
  return info.available && info.cc_major == 9 && info.cc_minor == 0 && sm90a &&
         (head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256) &&
         attention_head_dim_compiled(head_dim);
}

// A backward call the Hopper backward kernels must take: as sm90_must_take (head dims 64,
// 96, 128 and 256).
inline bool sm90_backward_must_take(int64_t head_dim) { return sm90_must_take(head_dim); }

// Prints a note once per distinct text (on a device without the Hopper kernel every case
// declines for the same reason).
inline void note_once(const std::string& what, const std::string& msg) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen.insert(msg).second) return;
  std::printf("[ note ] %s: %s (later cases with this reason not repeated)\n", what.c_str(), msg.c_str());
  std::fflush(stdout);
}

// Runs `gpu_call` with LLMK_ATTENTION_PATH = `path`; true when it ran. False, and nothing
// to compare, when the path legitimately did not run it:
// - sm90 declined ("cannot take this call") a call it need not take (`must_take`: the
//   forward's sm90_must_take, or sm90_backward_must_take for a backward call), or blamed "this build"
//   (no sm_90a code, a head dim left out): a note. A decline of a call that sm90_must_take
//   is a failure, unless `may_decline` (a stride the Hopper kernel need not take).
// - a head dim that this build's LLMK_HEAD_DIMS left out: the sm_80 kernel must refuse it
//   ("has no CUDA kernel in this build"); sm80 running it is a failure.
// Any other error is a failure.
template <class F>
inline bool run_on_path(const char* path, int64_t head_dim, const std::string& what, F&& gpu_call,
                        bool may_decline = false, bool (*must_take)(int64_t) = sm90_must_take) {
  const std::string p = path;
  const bool compiled = attention_head_dim_compiled(head_dim);
  try {
    PathScope scope(path);
    gpu_call();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (p == "sm90" && contains(msg, "cannot take this call")) {
      if (must_take(head_dim) && !may_decline && !contains(msg, "this build"))
        ADD_FAILURE() << "LLMK_ATTENTION_PATH=sm90 declined a call the Hopper kernel must take (" << what
                      << "): " << msg;
      else
        note_once("sm90 path skipped for " + what, msg);
      return false;
    }
    if (!compiled && contains(msg, "has no CUDA kernel in this build")) return false;
    ADD_FAILURE() << "LLMK_ATTENTION_PATH=" << path << " (" << what << "): " << msg;
    return false;
  }
  if (p == "sm80" && !compiled) {
    ADD_FAILURE() << "LLMK_ATTENTION_PATH=sm80 ran head_dim " << head_dim << ", which LLMK_HEAD_DIMS left out";
    return false;
  }
  return true;
}

// A [batch, seq, heads, head_dim] view into its own storage of `capacity` heads (the view
// holds the last `heads` of them, as q, k or v of a fused qkv projection), laid out
// [batch, seq, capacity, dim] or, `transposed`, [batch, capacity, seq, dim]. Storage
// outside the view is NaN.
struct Heads {
  DType dtype;
  int64_t batch, seq, heads, dim, capacity;
  bool transposed;
  HostTensor store;
  std::unique_ptr<DeviceTensor> device;

  Heads(DType dt, int64_t b, int64_t s, int64_t h, int64_t d, int64_t cap = 0, bool trans = false)
      : dtype(dt), batch(b), seq(s), heads(h), dim(d), capacity(std::max(cap, h)), transposed(trans),
        store(dt, 1, std::max<int64_t>(b * s * std::max(cap, h) * d, 1)) {
    store.poison();
  }
  int64_t offset() const { return (capacity - heads) * (transposed ? seq * dim : dim); }
  std::array<int64_t, 4> strides() const {
    if (transposed) return {capacity * seq * dim, dim, seq * dim, 1};
    return {seq * capacity * dim, capacity * dim, dim, 1};
  }
  int64_t index(int64_t b, int64_t s, int64_t h, int64_t c) const {
    const auto st = strides();
    return offset() + b * st[0] + s * st[1] + h * st[2] + c;
  }
  float get(int64_t b, int64_t s, int64_t h, int64_t c) const { return store.get(0, index(b, s, h, c)); }
  void randomize() {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < dim; ++c) store.set(0, index(b, s, h, c), dist(rng()));
  }
  TensorView make(void* base, bool on_gpu, bool packed) const {
    const auto st = strides();
    const Device dev{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0};
    void* data = static_cast<unsigned char*>(base) + offset() * dtype_size(dtype);
    if (packed) {  // [batch * seq, heads, dim] (batch 1)
      const int64_t shape[3] = {seq, heads, dim}, strides3[3] = {st[1], st[2], 1};
      return TensorView(data, dtype, dev, 3, shape, strides3);
    }
    const int64_t shape[4] = {batch, seq, heads, dim};
    return TensorView(data, dtype, dev, 4, shape, st.data());
  }
  TensorView host(bool packed = false) { return make(store.bytes.data(), false, packed); }
  TensorView gpu(bool packed = false) {
    if (!device) device = std::make_unique<DeviceTensor>(store);
    return make(device->data, true, packed);
  }
  HostTensor download() const { return device->download(); }
};

struct Lse {
  HostTensor host;
  std::vector<int64_t> shape;
  std::unique_ptr<DeviceTensor> device;
  explicit Lse(std::vector<int64_t> s) : host(DType::f32, 1, std::max<int64_t>(numel(s), 1)), shape(std::move(s)) {
    host.poison();
  }
  static int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    return n;
  }
  TensorView view(void* data, bool on_gpu) const {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    return TensorView(data, DType::f32, Device{on_gpu ? DeviceType::cuda : DeviceType::cpu, 0},
                      static_cast<int>(shape.size()), shape.data(), strides.data());
  }
  TensorView cpu() { return view(host.bytes.data(), false); }
  TensorView gpu() {
    if (!device) device = std::make_unique<DeviceTensor>(host);
    return view(device->data, true);
  }
};

// max |v| over heads [first, first + n) (n < 0: to the last head).
inline float max_abs_v(const Heads& v, int64_t first = 0, int64_t n = -1) {
  float m = 0;
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t s = 0; s < v.seq; ++s)
      for (int64_t h = first; h < (n < 0 ? v.heads : first + n); ++h)
        for (int64_t c = 0; c < v.dim; ++c) m = std::max(m, std::fabs(v.get(b, s, h, c)));
  return m;
}

struct Shape {
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
};

// How q, k, v and out are stored.
struct Layout {
  bool transposed = false;  // [batch, heads, seq, dim] storage (PyTorch's SDPA layout)
  int64_t extra_heads = 0;  // each tensor is the last heads of wider rows (NaN gaps around)
  bool fused = false;       // q, k, v: the head ranges of one qkv projection (seq_q == seq_k)
  // batch 1 with a batch stride of 1 element in q, k, v and out: the API takes any stride
  // of a size-1 dim; the Hopper kernel may decline it (TMA wants 16-byte strides), the
  // sm_80 kernel and auto must run it.
  bool odd_batch_stride = false;
};
inline constexpr Layout kTransposed{true, 0, false, false};

// `t` with batch stride `stride` (of a batch of 1: the data is the same).
inline TensorView with_batch_stride(const TensorView& t, int64_t stride) {
  int64_t strides[4] = {stride, t.stride(1), t.stride(2), t.stride(3)};
  return TensorView(t.data(), t.dtype(), t.device(), 4, t.shape(), strides);
}

// Heads [first, first + n) of a [batch, seq, heads, dim] view.
inline TensorView narrow_heads(const TensorView& t, int64_t first, int64_t n) {
  int64_t shape[4] = {t.size(0), t.size(1), n, t.size(3)};
  void* data = static_cast<unsigned char*>(t.data()) + first * t.stride(2) * dtype_size(t.dtype());
  return TensorView(data, t.dtype(), t.device(), 4, shape, t.strides());
}

// Cases both directions run, as check(dtype, shape, causal, layout).
// Rows that see no key: causal with seq_q > seq_k (the first seq_q - seq_k rows of every
// sequence), GQA, batch > 1; no keys at all (k and v empty), and no queries, causal or not.
template <class F>
void masked_row_cases(F&& check) {
  for (DType dt : kDTypes)
    for (int64_t d : {64, 96, 128, 256}) {
      check(dt, Shape{3, 129, 1, 4, 2, d}, true, Layout{});
      check(dt, Shape{2, 300, 127, 4, 1, d}, true, Layout{});
      check(dt, Shape{2, 200, 72, 2, 2, d}, true, Layout{});
      for (bool causal : {false, true}) {
        check(dt, Shape{2, 129, 0, 4, 2, d}, causal, Layout{});
        check(dt, Shape{2, 0, 129, 4, 2, d}, causal, Layout{});
      }
    }
}

// Every dtype, head dim and mask at 173 x 173 (4 query heads over 2 kv heads).
template <class F>
void dtype_head_dim_cases(F&& check) {
  for (DType dt : kDTypes)
    for (int64_t d : kHeadDims)
      for (bool causal : {false, true}) check(dt, Shape{2, 173, 173, 4, 2, d}, causal, Layout{});
}

// Lengths around the tiles (64, 128 and 192 rows or keys), 1, and seq_q != seq_k, causal or
// not.
template <class F>
void sequence_length_cases(F&& check) {
  const std::pair<int64_t, int64_t> lens[] = {{1, 1},     {1, 300},   {300, 1},   {128, 128}, {129, 257},
                                              {257, 129}, {64, 1000}, {1000, 64}, {255, 255}, {2, 3},
                                              {127, 65},  {192, 192}, {193, 385}, {385, 191}};
  for (const auto& [sq, sk] : lens)
    for (bool causal : {false, true})
      for (int64_t d : {64, 96, 128, 256}) check(DType::bf16, Shape{1, sq, sk, 2, 1, d}, causal, Layout{});
}

// GQA group sizes 1 (MHA), 2, 3, 4, 5, 8 over 2 kv heads, and MQA (1 kv head) at 8.
template <class F>
void gqa_cases(F&& check) {
  for (int64_t group : {1, 2, 3, 4, 5, 8})
    for (int64_t d : {64, 96, 128, 256}) {
      const DType dt = group % 2 ? DType::f16 : DType::bf16;
      check(dt, Shape{2, 150, 150, 2 * group, 2, d}, true, Layout{});
      check(dt, Shape{1, 100, 200, 2 * group, 2, d}, false, Layout{});
    }
  check(DType::bf16, Shape{2, 130, 130, 8, 1, 128}, true, Layout{});
  check(DType::f16, Shape{2, 130, 130, 8, 1, 64}, false, Layout{});
  check(DType::bf16, Shape{1, 130, 70, 8, 1, 256}, true, Layout{});
}

// Layouts: MQA; [B, H, S, D] storage; head slices of wider rows; q, k, v as the head ranges
// of one fused qkv projection, in both storages; a batch of 1 with a batch stride of 1 (which
// sm90 may decline: then auto must fall back to the sm_80 kernel).
template <class F>
void layout_cases(F&& check) {
  for (DType dt : kDTypes) {
    check(dt, Shape{3, 77, 77, 8, 1, 128}, true, Layout{});                         // MQA
    check(dt, Shape{2, 100, 150, 6, 3, 64}, false, kTransposed);                    // [B, H, S, D]
    check(dt, Shape{2, 100, 150, 4, 2, 128}, true, Layout{false, 3, false, false});  // wider rows
    check(dt, Shape{2, 70, 70, 4, 4, 96}, true, Layout{true, 2, false, false});
    for (int64_t d : {64, 96, 128, 256}) {
      check(dt, Shape{2, 129, 129, 8, 2, d}, true, Layout{false, 1, true, false});  // fused qkv
      check(dt, Shape{2, 127, 127, 4, 4, d}, false, Layout{true, 2, true, false});  // fused, [B, H, S, D]
      check(dt, Shape{1, 200, 130, 4, 2, d}, true, Layout{true, 1, false, false});
      check(dt, Shape{1, 130, 130, 4, 2, d}, true, Layout{false, 0, false, true});  // batch stride 1
      check(dt, Shape{1, 129, 129, 4, 2, d}, false, Layout{false, 1, true, true});
    }
  }
}

}  // namespace llmk::test
