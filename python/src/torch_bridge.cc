#include "torch_bridge.h"

#include <torch/csrc/stable/ops.h>

#include <cstddef>
#include <utility>

namespace llmk::torch_ops {
namespace {

const char* torch_dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Double: return "float64";
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Long: return "int64";
    case ScalarType::Int: return "int32";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    default: return torch::headeronly::toString(t);
  }
}

DType llmk_dtype(ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case ScalarType::Float: return DType::f32;
    case ScalarType::Half: return DType::f16;
    case ScalarType::BFloat16: return DType::bf16;
    case ScalarType::Int: return DType::i32;
    case ScalarType::Long: return DType::i64;
    case ScalarType::Float8_e4m3fn: return DType::f8e4m3;  // KV caches (attention_decode)
    case ScalarType::Byte: return DType::u8;               // quantized weights' zero points
    default:
      detail::throw_error(op, ": ", arg, " is ", torch_dtype_name(t),
                          "; llmk takes float32, float16, bfloat16 (and int32/int64 indices, float8_e4m3fn "
                          "KV caches, uint8 zero points)");
  }
}

// The schemas' activation names: one table per argument, in the order the error lists them.
constexpr std::pair<const char*, GemmActivation> kGemmActivations[] = {
    {"none", GemmActivation::none},
    {"silu_mul", GemmActivation::silu_mul},
    {"gelu", GemmActivation::gelu},
    {"gelu_tanh", GemmActivation::gelu_tanh},
};
constexpr std::pair<const char*, GeluApproximation> kGeluApproximations[] = {
    {"none", GeluApproximation::none},
    {"tanh", GeluApproximation::tanh},
};

template <class Value, size_t N>
Value parse_name(const OpCall& op, const char* arg, const std::string& name,
                 const std::pair<const char*, Value> (&table)[N]) {
  for (const auto& [spelling, value] : table)
    if (name == spelling) return value;
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) choices += i + 1 == N ? " or " : ", ";
    choices += std::string("'") + table[i].first + "'";
  }
  detail::throw_error(op.name(), ": ", arg, " must be ", choices, ", got '", name, "'");
}

int32_t device_type_of(const Tensor& t) {
  int32_t type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
  return type;
}

}  // namespace

OpCall::OpCall(const char* op, const Tensor& first) : op_(op) {
  if (!first.is_cuda()) return;
#ifdef LLMK_TORCH_CUDA
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(first.get_device_index(), &stream));
  stream_ = static_cast<cudaStream_t>(stream);
#else
  detail::throw_error(op, ": got a CUDA tensor, but llmk's torch ops were built against a "
                      "PyTorch without CUDA");
#endif
}

TensorView OpCall::view(const Tensor& t, const char* arg) const {
  const int32_t type = device_type_of(t);
  const bool cuda = type == aoti_torch_device_type_cuda();
  LLMK_CHECK(cuda || type == aoti_torch_device_type_cpu(), op_, ": ", arg,
             " is on a device llmk cannot use (device type ", type, "); llmk takes CPU and CUDA tensors");
  const int64_t ndim = t.dim();
  LLMK_CHECK(ndim <= TensorView::kMaxDims, op_, ": ", arg, " has ", ndim, " dims; llmk takes at most ",
             TensorView::kMaxDims);
  const Device device{cuda ? DeviceType::cuda : DeviceType::cpu, cuda ? t.get_device_index() : 0};
  return TensorView(t.data_ptr(), llmk_dtype(t.scalar_type(), op_, arg), device, static_cast<int>(ndim),
                    t.sizes().data(), t.strides().data());
}

std::optional<TensorView> OpCall::view(const std::optional<Tensor>& t, const char* arg) const {
  if (!t) return std::nullopt;
  return view(*t, arg);
}

std::optional<TensorView> OpCall::view_if(bool want, const Tensor& t, const char* arg) const {
  if (!want) return std::nullopt;
  return view(t, arg);
}

GemmActivation gemm_activation(const OpCall& op, const std::string& name) {
  return parse_name(op, "activation", name, kGemmActivations);
}

GeluApproximation gelu_approximation(const OpCall& op, const std::string& name) {
  return parse_name(op, "approximate", name, kGeluApproximations);
}

std::vector<std::string> gemm_activation_names() {
  std::vector<std::string> names;
  for (const auto& entry : kGemmActivations) names.emplace_back(entry.first);
  return names;
}

std::vector<std::string> gelu_approximation_names() {
  std::vector<std::string> names;
  for (const auto& entry : kGeluApproximations) names.emplace_back(entry.first);
  return names;
}

Tensor empty(const Tensor& like, const Shape& shape, ScalarType dtype) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i] > 1 ? shape[i] : 1;
  }
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      static_cast<int64_t>(shape.size()), shape.data(), strides.data(), static_cast<int32_t>(dtype),
      device_type_of(like), like.is_cuda() ? like.get_device_index() : 0, &handle));
  return Tensor(handle);
}

Shape shape_of(const Tensor& t) {
  const auto sizes = t.sizes();
  return Shape(sizes.begin(), sizes.end());
}

Tensor output_like(const Tensor& t) { return empty(t, shape_of(t), t.scalar_type()); }

Shape rows_shape(const Tensor& t) {
  Shape shape = shape_of(t);
  if (!shape.empty()) shape.pop_back();
  return shape;
}

Tensor row_workspace(const Tensor& x, int64_t (*size_fn)(int64_t, int64_t, int)) {
  if (!x.is_cuda()) return empty(x, {0}, ScalarType::Float);
  const int64_t d = x.dim() ? x.size(-1) : 1;
  const int64_t rows = d ? x.numel() / d : 0;
  return empty(x, {size_fn(rows, d, x.get_device_index())}, ScalarType::Float);
}

Tensor dense_rows(const Tensor& t) {
  if (t.dim() == 0 || t.stride(-1) == 1) return t;
  return torch::stable::contiguous(t);
}

}  // namespace llmk::torch_ops
