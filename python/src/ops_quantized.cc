// torch.ops.llmk weight-only quantized ops: quantized_linear (x · dequantize(W)ᵀ + bias),
// dequantize_weight, and the producers of llmk's packed layout, quantize_weight_ (round to
// nearest, host tensors, outputs given) and pack_quantized_weight (from codes). Schemas and
// fakes: python/llmk/ops/quantized.py; the format: include/llmk/quantized_gemm.h.
#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

QuantizedWeight quantized(const OpCall& op, const Tensor& packed, const Tensor& scales,
                          const std::optional<Tensor>& zeros, int64_t bits, int64_t group_size) {
  QuantizedWeight w;
  w.packed = op.view(packed, "packed");
  w.scales = op.view(scales, "scales");
  w.zeros = op.view(zeros, "zeros");
  LLMK_CHECK(bits == 4 || bits == 8, op.name(), ": bits must be 4 or 8, got ", bits);
  w.bits = static_cast<int>(bits);
  w.group_size = group_size;
  return w;
}

Tensor quantized_linear(Tensor x, Tensor packed, Tensor scales, std::optional<Tensor> zeros, int64_t bits,
                        int64_t group_size, std::optional<Tensor> bias) {
  const OpCall op("quantized_linear", x);
  const QuantizedWeight w = quantized(op, packed, scales, zeros, bits, group_size);
  const TensorView xv = op.view(x, "x");
  LLMK_CHECK(x.dim() >= 1, op.name(), ": x is a 0-d tensor; expected [..., K]");
  LLMK_CHECK(packed.dim() == 2, op.name(), ": packed has ", packed.dim(), " dims; expected [N, K * bits / 32]");
  Shape shape = shape_of(x);
  shape.back() = packed.size(0);
  Tensor out = empty(x, shape, x.scalar_type());
  int64_t m = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
  std::optional<TensorView> workspace;
  Tensor ws;
  if (x.is_cuda()) {
    const int64_t needed =
        llmk::quantized_gemm_workspace_size(m, packed.size(0), x.size(x.dim() - 1), x.get_device_index());
    if (needed > 0) {
      ws = empty(x, {needed}, x.scalar_type());
      workspace = op.view(ws, "workspace");
    }
  }
  try {
    llmk::quantized_gemm(op.view(out, "out"), xv, w, op.view(bias, "bias"), workspace, op.stream());
  } catch (const CudaError&) {
    throw;
  } catch (const Error& e) {
    detail::throw_error("quantized_linear: ", e.what());
  }
  return out;
}

Tensor dequantize_weight(Tensor packed, Tensor scales, std::optional<Tensor> zeros, int64_t bits,
                         int64_t group_size) {
  const OpCall op("dequantize_weight", packed);
  const QuantizedWeight w = quantized(op, packed, scales, zeros, bits, group_size);
  LLMK_CHECK(packed.dim() == 2, op.name(), ": packed has ", packed.dim(), " dims; expected [N, K * bits / 32]");
  Tensor out = empty(packed, {packed.size(0), packed.size(1) * 32 / bits}, scales.scalar_type());
  llmk::dequantize_weight(op.view(out, "out"), w, op.stream());
  return out;
}

void quantize_weight_(Tensor weight, Tensor packed, Tensor scales, std::optional<Tensor> zeros, int64_t bits,
                      int64_t group_size) {
  const OpCall op("quantize_weight", weight);
  llmk::quantize_weight(quantized(op, packed, scales, zeros, bits, group_size), op.view(weight, "weight"));
}

Tensor pack_quantized_weight(Tensor codes, int64_t bits) {
  const OpCall op("pack_quantized_weight", codes);
  LLMK_CHECK(codes.dim() == 2, op.name(), ": codes have ", codes.dim(), " dims; expected [N, K]");
  LLMK_CHECK(bits == 4 || bits == 8, op.name(), ": bits must be 4 or 8, got ", bits);
  Tensor packed = empty(codes, {codes.size(0), codes.size(1) * bits / 32}, ScalarType::Int);
  llmk::pack_quantized_weight(op.view(packed, "packed"), op.view(codes, "codes"), static_cast<int>(bits));
  return packed;
}

// (quantize_weight_ and pack_quantized_weight run on the host: their CUDA kernels are the
// C++ API's clear rejection.)
void register_quantized(torch::stable::detail::StableLibrary& m) {
  m.impl("quantized_linear", TORCH_BOX(&quantized_linear));
  m.impl("dequantize_weight", TORCH_BOX(&dequantize_weight));
  m.impl("quantize_weight_", TORCH_BOX(&quantize_weight_));
  m.impl("pack_quantized_weight", TORCH_BOX(&pack_quantized_weight));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_quantized(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_quantized(m); }

}  // namespace llmk::torch_ops
