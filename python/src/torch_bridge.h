// The op layer's bridge from PyTorch to the torch-free C++ API, over PyTorch's stable ABI
// (torch::stable::Tensor and the C shim; one built module serves every torch >= 2.10).
//
// An op kernel opens an OpCall on its first tensor: it names the op for error messages and
// fetches torch's current stream on that tensor's CUDA device (the C++ API makes the device
// current for its launch). Tensors become TensorViews through OpCall::view, which names the argument when its
// dtype, device or rank is one llmk cannot take; outputs are allocated through torch's
// allocator (the CUDA caching allocator on the GPU) by empty().
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llmk/llmk.h"

namespace llmk::torch_ops {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Shape = std::vector<int64_t>;

class OpCall {
 public:
  // `op`: the op's public name (a string literal); `first`: the tensor whose device runs it.
  OpCall(const char* op, const Tensor& first);

  TensorView view(const Tensor& t, const char* arg) const;
  std::optional<TensorView> view(const std::optional<Tensor>& t, const char* arg) const;
  // An optional output the caller asked for (`want`), else std::nullopt.
  std::optional<TensorView> view_if(bool want, const Tensor& t, const char* arg) const;
  cudaStream_t stream() const { return stream_; }
  const char* name() const { return op_; }

 private:
  const char* op_;
  cudaStream_t stream_ = nullptr;
};

// A new contiguous tensor of `shape` and `dtype` on the device of `like`.
Tensor empty(const Tensor& like, const Shape& shape, ScalarType dtype);
// A new contiguous tensor of t's shape and dtype (the usual output of an op).
Tensor output_like(const Tensor& t);
// t's shape without its last dim: the rows of an op over the last dim.
Shape rows_shape(const Tensor& t);
Shape shape_of(const Tensor& t);
// The f32 workspace a backward over x's rows needs on the GPU, `size_fn(rows, d, device)`
// elements (one of llmk's *_workspace_size functions); empty on the CPU.
Tensor row_workspace(const Tensor& x, int64_t (*size_fn)(int64_t rows, int64_t d, int device));
// The activation names of the op schemas, parsed here only (python/llmk/ops/activation.py keeps
// Python's table of the same strings): linear's `activation` ('none', 'silu_mul', 'gelu',
// 'gelu_tanh') and the GELU ops' `approximate` ('none', 'tanh': torch.nn.functional.gelu's
// spelling). An unknown name throws "<op>: <arg> must be 'a', 'b' or 'c', got '<name>'".
GemmActivation gemm_activation(const OpCall& op, const std::string& name);
GeluApproximation gelu_approximation(const OpCall& op, const std::string& name);
// The names those two accept, in the tables' order (llmk._C exposes them; a test holds
// Python's table to them).
std::vector<std::string> gemm_activation_names();
std::vector<std::string> gelu_approximation_names();
// The output width of a gated activation over n fused columns, the gate's first and the up
// projection's after them (silu_and_mul, gelu_and_mul, linear's 'silu_mul'): n / 2.
inline int64_t gated_width(int64_t n) { return n / 2; }

// Gradients arrive in any layout (expanded, transposed); kernels take rows with a
// contiguous last dim. Returns t itself when it has one, else a contiguous copy.
Tensor dense_rows(const Tensor& t);

}  // namespace llmk::torch_ops
