// Test helpers: host tensors filled with fresh random values, device copies, NaN
// poisoning, and the elementwise comparison of the correctness protocol.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/host_types.h"
#include "llmk/llmk.h"

namespace llmk::test {

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine = [] {
    const uint64_t seed = std::random_device{}();
    std::printf("[llmk test] random seed %llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return engine;
}

inline bool has_gpu() { return cuda_device_count() > 0; }

#define LLMK_REQUIRE_GPU() \
  if (!::llmk::test::has_gpu()) GTEST_SKIP() << "no CUDA device (" << ::llmk::device_info(0).error << "): GPU test skipped"

// A host tensor with its own storage: `rows` rows of `d` elements, `row_stride` apart.
struct HostTensor {
  DType dtype = DType::f32;
  int64_t rows = 0, d = 0, row_stride = 0;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType dt, int64_t rows_, int64_t d_, int64_t stride = -1)
      : dtype(dt), rows(rows_), d(d_), row_stride(stride < 0 ? d_ : stride) {
    const int64_t elems = rows > 0 ? (rows - 1) * row_stride + d : 0;
    bytes.assign(static_cast<size_t>(std::max<int64_t>(elems, 1) * dtype_size(dt)), 0);
  }

  float get(int64_t r, int64_t c) const {
    const int64_t i = r * row_stride + c;
    return detail::dispatch_dtype(dtype, "test", [&](auto tag) {
      using T = detail::host_type_t<decltype(tag)>;
      T v;
      std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
      return detail::to_float(v);
    });
  }
  void set(int64_t r, int64_t c, float value) {
    const int64_t i = r * row_stride + c;
    detail::dispatch_dtype(dtype, "test", [&](auto tag) {
      using T = detail::host_type_t<decltype(tag)>;
      const T v = detail::from_float<T>(value);
      std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
    });
  }
  // Normal(mean, stddev) values, rounded to the dtype. Gaps between rows get NaN so a
  // kernel that reads them is caught.
  void randomize(float mean = 0.0f, float stddev = 1.0f) {
    poison();
    std::normal_distribution<float> dist(mean, stddev);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) set(r, c, dist(rng()));
  }
  void poison() {
    for (int64_t i = 0; i * dtype_size(dtype) < static_cast<int64_t>(bytes.size()); ++i)
      set(0, i, std::nanf(""));
  }
  // View as [rows, d] (1-d [d] when `as_vector`) on the host.
  TensorView view(bool as_vector = false) {
    return make_view(bytes.data(), Device{DeviceType::cpu, 0}, as_vector);
  }
  TensorView make_view(void* data, Device device, bool as_vector) const {
    if (as_vector) {
      const int64_t shape[1] = {d}, strides[1] = {1};
      return TensorView(data, dtype, device, 1, shape, strides);
    }
    const int64_t shape[2] = {rows, d}, strides[2] = {row_stride, 1};
    return TensorView(data, dtype, device, 2, shape, strides);
  }
};

// Device copy of a HostTensor (same layout).
struct DeviceTensor {
  const HostTensor* host = nullptr;
  void* data = nullptr;
  size_t size = 0;

  explicit DeviceTensor(const HostTensor& h) : host(&h), size(h.bytes.size()) {
    EXPECT_EQ(cudaMalloc(&data, size), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, h.bytes.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  TensorView view(bool as_vector = false) const {
    return host->make_view(data, Device{DeviceType::cuda, 0}, as_vector);
  }
  HostTensor download() const {
    HostTensor out = *host;
    EXPECT_EQ(cudaMemcpy(out.bytes.data(), data, size, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

// Relative rounding step of each dtype: outputs are rounded once, so they sit within
// about one step of the double reference.
inline float dtype_rtol(DType dt) {
  switch (dt) {
    case DType::f32: return 2e-5f;
    case DType::f16: return 2.0f / 1024;
    case DType::bf16: return 2.0f / 128;
    case DType::i32:
    case DType::i64:
    case DType::f8e4m3: break;
  }
  return 0;
}

// Elementwise |got - want| <= atol + rtol * |want| over the rows x d elements (NaN in
// `got` fails). atol defaults to 1e-3 * rtol * max|want|; outputs that are a difference of
// larger terms (gradients) pass an atol relative to the terms' scale instead. Either way it
// includes one step of the dtype's subnormal range (fp16: 2^-24), whose spacing no relative
// tolerance covers: a value near a rounding midpoint may land on either neighbour.
inline void expect_close(const HostTensor& got, const HostTensor& want, float rtol,
                         const char* what, float atol = -1.0f) {
  ASSERT_EQ(got.rows, want.rows);
  ASSERT_EQ(got.d, want.d);
  float max_ref = 0;
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.d; ++c) max_ref = std::max(max_ref, std::fabs(want.get(r, c)));
  if (atol < 0) atol = 1e-3f * rtol * max_ref + 1e-30f;
  if (got.dtype == DType::f16) atol += 0x1p-24f;
  int64_t bad = 0;
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.d; ++c) {
      const float g = got.get(r, c), w = want.get(r, c);
      if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
        if (bad++ < 5)
          ADD_FAILURE() << what << " mismatch at row " << r << " col " << c << ": got " << g
                        << ", want " << w;
      }
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of tolerance (rtol " << rtol << ")";
}

// The rows x d elements of two tensors are bit-identical (gaps between rows not compared).
inline void expect_equal_elements(const HostTensor& got, const HostTensor& want, const char* what) {
  ASSERT_EQ(got.rows, want.rows);
  ASSERT_EQ(got.d, want.d);
  const int64_t elem = dtype_size(got.dtype);
  int64_t bad = 0;
  for (int64_t r = 0; r < want.rows; ++r)
    bad += std::memcmp(got.bytes.data() + r * got.row_stride * elem,
                       want.bytes.data() + r * want.row_stride * elem, want.d * elem) != 0;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " rows differ";
}

// d loss / d t[r, c] by a central difference of step h (loss() reads t).
template <class Loss>
double central_difference(HostTensor& t, int64_t r, int64_t c, Loss&& loss, float h = 1e-2f) {
  const float v = t.get(r, c);
  t.set(r, c, v + h);
  const double up = loss();
  t.set(r, c, v - h);
  const double down = loss();
  t.set(r, c, v);
  return (up - down) / (2.0 * h);
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v = {DType::f32, DType::f16, DType::bf16};
  return v;
}

// Expects `fn` to throw llmk::Error whose message contains `needle`.
template <class F>
void expect_error(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an llmk::Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

// Sets LLMK_NORM_PATH (read on every call; norm_launch.cuh) for one scope; nullptr: unset
// (the launch rule).
struct NormPathScope {
  explicit NormPathScope(const char* path) {
    if (path != nullptr) setenv("LLMK_NORM_PATH", path, 1);
    else unsetenv("LLMK_NORM_PATH");
  }
  ~NormPathScope() { unsetenv("LLMK_NORM_PATH"); }
};

// body(dt, vec) for every dtype (vec: its elements per 16-byte vector) under each
// LLMK_NORM_PATH in `paths`, the path named in a failure's trace.
template <class F>
void for_each_norm_path(std::initializer_list<const char*> paths, F&& body) {
  for (const char* path : paths) {
    SCOPED_TRACE(testing::Message() << "LLMK_NORM_PATH=" << path);
    NormPathScope scope(path);
    for (DType dt : all_dtypes()) body(dt, 16 / static_cast<int64_t>(dtype_size(dt)));
  }
}

}  // namespace llmk::test
