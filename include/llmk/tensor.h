// TensorView: a non-owning view of a strided tensor in host or device memory.
// It maps one to one from DLPack: data pointer, dtype, device, shape and strides
// (in elements), all int64.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "llmk/dtype.h"
#include "llmk/error.h"

namespace llmk {

enum class DeviceType : int32_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int32_t index = 0;

  bool operator==(const Device& other) const {
    return type == other.type && (type == DeviceType::cpu || index == other.index);
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

inline const char* device_type_name(DeviceType type) {
  return type == DeviceType::cpu ? "cpu" : "cuda";
}

class TensorView {
 public:
  static constexpr int kMaxDims = 8;

  TensorView() = default;

  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape)
      : data_(data), dtype_(dtype), device_(device) {
    set_shape(shape.begin(), static_cast<int>(shape.size()));
    int64_t stride = 1;
    for (int i = ndim_ - 1; i >= 0; --i) {
      strides_[i] = stride;
      stride *= shape_[i];
    }
  }

  // Strided view; shape and strides each hold `ndim` values, strides in elements.
  TensorView(void* data, DType dtype, Device device, int ndim, const int64_t* shape,
             const int64_t* strides)
      : data_(data), dtype_(dtype), device_(device) {
    set_shape(shape, ndim);
    for (int i = 0; i < ndim; ++i) strides_[i] = strides[i];
  }

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.type == DeviceType::cuda; }
  int ndim() const { return ndim_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  // Negative indices count from the end, as in Python.
  int64_t size(int dim) const { return shape_[wrap(dim)]; }
  int64_t stride(int dim) const { return strides_[wrap(dim)]; }
  const int64_t* shape() const { return shape_.data(); }
  const int64_t* strides() const { return strides_.data(); }

 private:
  template <class It>
  void set_shape(It shape, int ndim) {
    LLMK_CHECK(ndim >= 0 && ndim <= kMaxDims, "TensorView: ", ndim,
               " dimensions, at most ", kMaxDims, " are supported");
    ndim_ = ndim;
    for (int i = 0; i < ndim; ++i) shape_[i] = shape[i];
  }
  int wrap(int dim) const {
    int d = dim < 0 ? dim + ndim_ : dim;
    LLMK_CHECK(d >= 0 && d < ndim_, "TensorView: dimension ", dim, " out of range for a ",
               ndim_, "-d tensor");
    return d;
  }

  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace llmk
